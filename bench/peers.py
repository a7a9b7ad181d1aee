"""traindeck against the tools people use instead: training throughput while logging every batch.

    .venv/bin/python -m bench.peers [--quick] [--rounds 6] [--epochs 3] [--img-size 16] [--bs 64]
                                    [--xla] [--mlflow-sqlite] [--tiny] [--only NAMES]

Every system trains the same model (the worker's resnet18 Learner), data (the built-in digits),
seed and epochs, in this one process, interleaved: each round runs every system once, in an
order rotated from round to round, so the shared machine's noise hits them alike; medians over
the rounds of each round's ratio to plain fastai, after an untimed warm-up round; then each
system's fastest fit against plain fastai's fastest (noise only ever slows a fit down, and a
slow moment of a shared machine hits whichever systems ran in it).
  plain fastai  no logging at all: the limit (on XLA with the one `torch_xla.sync()` per step
                that any XLA loop needs)
  traindeck     the worker's instrumentation: per-batch loss and lr to the database through the
                background writer, per-epoch metrics, progress, the stop check; on XLA also the
                metrics report and the prefetching loader
  mlflow        a fastai callback calling `mlflow.log_metrics` (smoothed loss, lr) every batch and
                the epoch metrics, to a file store in a temporary folder; MLflow's default,
                synchronous logging; no server (--mlflow-sqlite adds MLflow's SQLite store)
  tensorboard   fastai's TensorBoardCallback: loss and hyper-parameters every batch (no model
                graph, no prediction images)
  wandb         fastai's WandbCallback with WANDB_MODE=offline: loss, raw loss, hyper-parameters
                every batch (no prediction table; console capture off; an empty config, as
                fastai 2.8.12 cannot format any config value with this fastcore)
  traindeck+checkpoints  traindeck as the worker runs it, with its default checkpoint policy:
                each epoch's state copied to the host, written (model and optimizer, fsynced)
                once TRAINDECK_CHECKPOINT_INTERVAL has passed since the last write and after
                the last epoch when TRAINDECK_KEEP_CHECKPOINTS keeps it; no peer checkpoints
Each line: the name, images/s (wall clock), images per CPU-second (this process and every
process it started, such as wandb's service), the CPU-time ratio to plain fastai, and last the
wall-clock ratio to plain fastai. Nothing leaves the machine: wandb is offline, MLflow writes
files, their telemetry is off. The machine is shared: the CPU-time ratio is the steadier.
--quick: 4 rounds of 2 epochs at 16 px on the CPU (about 4 minutes on 2 quiet cores, more on
busy ones; the full run, 6 rounds of 3 epochs, about 10). Short fits on a shared machine vary
by ±15% from round to round: read the medians, and more rounds narrow them. With resnet18 a
CPU step takes ~150 ms and two scalars logged per batch cost every tool well under that noise;
--tiny trains one linear layer instead, whose steps are short enough for the logging to show.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._fit import (
    check_fit_finished,
    instrument_like_worker,
    prepare_digits_fit,
    tree_cpu_seconds,
)
from common.entry import run_main

OFFLINE_ENVIRONMENT = {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "WANDB_CONSOLE": "off",
    "WANDB_DISABLE_GIT": "true",
    "WANDB_DISABLE_CODE": "true",
    "WANDB_ERROR_REPORTING": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_ALLOW_FILE_STORE": "true",
    "DO_NOT_TRACK": "true",
}


@dataclass
class System:
    """One system under test: what it adds to a fresh Learner, and what it closes afterwards
    (outside the timed fit)."""

    name: str
    prepare: Callable[[Any, int], Callable[[], None] | None]
    prefetch: bool = False
    # On XLA: fastai's values stay on the device, read in chunks (worker.device_values), as in
    # the worker; the others keep fastai's own Recorder, which reads them every batch.
    device_values: bool = False
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)


def mlflow_logger(tracking_uri: str) -> Callable[[Any, int], Callable[[], None]]:
    import mlflow
    from fastai.callback.core import Callback
    from fastai.learner import Recorder

    class MlflowBatchLogger(Callback):
        """What a person adds to log every batch to MLflow from fastai."""

        order = Recorder.order + 1

        def after_batch(self) -> None:
            if self.training:
                lr = self.opt.hypers[-1]["lr"]
                mlflow.log_metrics(
                    {"train_loss": float(self.smooth_loss), "lr": lr}, step=self.train_iter
                )

        def after_epoch(self) -> None:
            names, values = self.recorder.metric_names[1:-1], self.recorder.log[1:-1]
            metrics = {n: float(v) for n, v in zip(names, values, strict=False) if v is not None}
            mlflow.log_metrics(metrics, step=self.epoch)

    def prepare(learn: Any, round_index: int) -> Callable[[], None]:
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_experiment("traindeck-peers")
        mlflow.start_run(run_name=f"round-{round_index}")
        learn.add_cb(MlflowBatchLogger())
        return mlflow.end_run

    return prepare


def tensorboard_logger(folder: Path) -> Callable[[Any, int], Callable[[], None]]:
    from fastai.callback.tensorboard import TensorBoardCallback

    def prepare(learn: Any, round_index: int) -> Callable[[], None]:
        callback = TensorBoardCallback(
            log_dir=folder / f"tensorboard-{round_index}", trace_model=False, log_preds=False
        )
        learn.add_cb(callback)
        return lambda: callback.writer.close()

    return prepare


def wandb_logger(
    folder: Path, plain_config: Callable[[Any], None]
) -> Callable[[Any, int], Callable[[], None]]:
    import wandb
    from fastai.callback.wandb import WandbCallback

    def prepare(learn: Any, round_index: int) -> Callable[[], None]:
        plain_config(learn)
        wandb.init(
            project="traindeck-peers",
            name=f"round-{round_index}",
            dir=folder,
            mode="offline",
            reinit="finish_previous",
        )
        learn.add_cb(WandbCallback(log_preds=False))
        return wandb.finish

    return prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 rounds of 2 epochs (~5 minutes)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--img-size", type=int, default=16)
    parser.add_argument("--bs", type=int, default=64)
    parser.add_argument("--xla", action="store_true", help="XLA on the CPU (PJRT_DEVICE=CPU)")
    parser.add_argument("--mlflow-sqlite", action="store_true", help="also MLflow's SQLite store")
    parser.add_argument(
        "--only",
        help="a comma-separated subset of the systems to run (plain fastai always runs: the "
        "ratios are to it), e.g. 'traindeck,traindeck+checkpoints'",
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="a one-layer model instead of resnet18: steps of a millisecond or two, so what "
        "each tool's logging costs per batch shows above the noise (CPU only)",
    )
    args = parser.parse_args()
    if args.tiny and args.xla:
        parser.error("--tiny runs on the CPU; leave out --xla")
    if args.quick:
        args.rounds, args.epochs = 4, 2

    os.environ.update(OFFLINE_ENVIRONMENT)
    bench = prepare_digits_fit("traindeck-peers-", args.epochs, args.img_size, args.bs, args.xla)
    folder, engine, spec = bench.folder, bench.engine, bench.spec
    setup, dls = bench.setup, bench.dls
    images_per_fit = bench.images_per_fit
    os.environ["WANDB_DIR"] = str(folder)

    from fastai.torch_core import set_seed

    from worker.device_values import DeviceValuesCallback
    from worker.training import build_learner

    def traindeck(checkpoints: bool) -> Callable[[Any, int], Callable[[], None]]:
        def prepare(learn: Any, round_index: int) -> Callable[[], None]:
            writer = instrument_like_worker(
                learn, engine, spec, folder, setup.label, args.epochs, args.xla, checkpoints
            )
            return writer.close

        return prepare

    def plain_config(learn: Any) -> None:
        # fastai 2.8.12's WandbCallback formats `learn.gather_args()` with fastcore's
        # init_args, which calls vars() on every value and fails on a plain str or int; with
        # no config to format it runs, and the config update is a one-off cost anyway.
        learn.gather_args = dict

    systems = [
        System("plain fastai", lambda learn, round_index: None),
        System("traindeck", traindeck(checkpoints=False), prefetch=True, device_values=True),
        System("mlflow", mlflow_logger(f"file://{folder / 'mlruns'}")),
        System("tensorboard", tensorboard_logger(folder)),
        System("wandb", wandb_logger(folder, plain_config)),
        System(
            "traindeck+checkpoints", traindeck(checkpoints=True), prefetch=True, device_values=True
        ),
    ]
    if args.mlflow_sqlite:
        systems.append(System("mlflow-sqlite", mlflow_logger(f"sqlite:///{folder / 'mlflow.db'}")))
    if args.only:
        wanted = {name.strip() for name in args.only.split(",")} | {"plain fastai"}
        unknown = wanted - {system.name for system in systems}
        if unknown:
            parser.error(f"--only: no system named {', '.join(sorted(unknown))}")
        systems = [system for system in systems if system.name in wanted]
    model_name = "one linear layer (--tiny)" if args.tiny else "resnet18"
    print(f"peers benchmark: {model_name}, digits {args.img_size}px, bs {args.bs}, {args.epochs} "
          f"epoch(s) × {args.rounds} rounds per system, interleaved, on {setup.label}",
          flush=True)  # fmt: skip

    def tiny_learner() -> Any:
        from fastai.callback.progress import ProgressCallback
        from fastai.learner import Learner
        from fastai.losses import CrossEntropyLossFlat
        from fastai.metrics import accuracy, error_rate
        from torch import nn

        inputs = 3 * args.img_size * args.img_size
        model = nn.Sequential(nn.Flatten(), nn.Linear(inputs, dls.c))
        learn = Learner(dls, model, loss_func=CrossEntropyLossFlat(),
                        metrics=[accuracy, error_rate], path=folder)  # fmt: skip
        learn.remove_cb(ProgressCallback)
        learn.logger = lambda *_: None
        return learn

    def fit(system: System, round_index: int) -> tuple[float, float]:
        set_seed(spec.seed)
        if args.tiny:
            learn = tiny_learner()
        else:
            learn = build_learner(
                dls, spec, setup.device, folder / f"learner-{round_index}", setup.parallel,
                prefetch=system.prefetch,
            )  # fmt: skip
            if not system.device_values:
                learn.remove_cbs([cb for cb in learn.cbs if isinstance(cb, DeviceValuesCallback)])
        close = system.prepare(learn, round_index)
        gc.collect()  # the previous fits' garbage is collected now, not during this one
        started, cpu_started = time.perf_counter(), tree_cpu_seconds()
        learn.fit_one_cycle(args.epochs, 1e-2)
        wall, cpu = time.perf_counter() - started, tree_cpu_seconds() - cpu_started
        if close is not None:
            close()
        check_fit_finished(learn, args.epochs)
        return wall, cpu

    for system in systems:  # an untimed warm-up round: first-touch costs, each tool's set-up
        fit(system, -1)  # (imports, experiment, service) and on XLA the compiles count nowhere
    for round_index in range(args.rounds):
        shift = round_index % len(systems)
        for system in systems[shift:] + systems[:shift]:
            wall, cpu = fit(system, round_index)
            system.walls.append(wall)
            system.cpus.append(cpu)
            print(f"  round {round_index + 1} {system.name:<21} "
                  f"{images_per_fit / wall:8.1f} images/s {images_per_fit / cpu:8.1f} "
                  "images/CPU-s", flush=True)  # fmt: skip

    # Ratios are taken round by round (the load on a shared machine drifts between rounds,
    # less within one), then their median.
    plain = systems[0]
    ratios = {}
    for system in systems:
        wall_ratio = statistics.median(
            p / s for p, s in zip(plain.walls, system.walls, strict=True)
        )
        cpu_ratio = statistics.median(p / s for p, s in zip(plain.cpus, system.cpus, strict=True))
        ratios[system.name] = (wall_ratio, cpu_ratio)
        wall, cpu = statistics.median(system.walls), statistics.median(system.cpus)
        print(f"{system.name:<21} {images_per_fit / wall:8.1f} images/s "
              f"{images_per_fit / cpu:8.1f} images/CPU-s  CPU-time ratio {cpu_ratio:.3f}  "
              f"ratio {wall_ratio:.3f}")  # fmt: skip
    _print_verdict("median of the rounds' ratios", ratios)
    # A fit is deterministic work: a shared machine's neighbours only ever slow it down, and a
    # slow round hits whichever systems ran then. Each system's fastest fit is its cost with
    # the least of that noise (as `timeit` reports its best run).
    best = {
        system.name: (min(plain.walls) / min(system.walls), min(plain.cpus) / min(system.cpus))
        for system in systems
    }
    print("each system's fastest fit against plain fastai's fastest: "
          + ", ".join(f"{name} {wall:.3f}" for name, (wall, _) in best.items()))  # fmt: skip
    _print_verdict("fastest fits", best)


def _print_verdict(basis: str, ratios: dict[str, tuple[float, float]]) -> None:
    if "traindeck" not in ratios:
        return
    peers = [name for name in ratios if name in ("mlflow", "tensorboard", "wandb")]
    ahead = [all(ratios["traindeck"][i] > ratios[peer][i] for peer in peers) for i in (0, 1)]
    wall, cpu = ratios["traindeck"]
    print(f"target ({basis}): traindeck ≥ 0.98 of plain fastai and ahead of every peer — wall "
          f"clock {wall:.3f} ({'ahead' if ahead[0] else 'NOT ahead'}), CPU "
          f"time {cpu:.3f} ({'ahead' if ahead[1] else 'NOT ahead'})")  # fmt: skip


if __name__ == "__main__":
    run_main(main)

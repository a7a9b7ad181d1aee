"""How close traindeck's worker fit comes to a bare torch_xla training loop, on XLA's CPU backend.

    .venv/bin/python -m bench.xla_limit [--devices 1 2] [--rounds 3] [--epochs 2] [--img-size 16]
                                        [--bs 64]

Both arms train the worker's resnet18 Learner on the digits (DataLoaders as the worker builds
them): the same model and initial weights, the same optimizer (fastai's Adam, which the
worker's Learner uses, at the same weight decay), the same batches and batch size, each batch
loaded and copied to the device(s) ahead by `worker/prefetch.py`. They alternate A, B, A, B…
in one process, after one warm-up fit each (the compiles):
  A  the bare loop, the limit: per batch forward, loss, backward, optimizer step, zero_grad and
     one `torch_xla.sync()`, nothing read on the host; per epoch a validation pass whose loss
     and accuracy sums stay on the device and are read once at its end. Like the worker it
     collects young garbage before each sync: fastai's batch transforms, which the input
     pipeline applies, leave reference cycles that would otherwise join a step's graph now
     and then (a new graph, compiled again).
  B  traindeck: `build_learner` and everything `worker.training.run` adds (telemetry to a real
     SQLite database, the loss and metrics read every TRAINDECK_XLA_READ_EVERY steps, the stop
     check, a checkpoint every epoch, the XLA report), `fit_one_cycle`.
Each arm's figure is training images / wall time of its whole fit (every epoch's training and
validation, until the device is idle). Prints images/s of each, the ratio B/A (target ≥ 0.95),
and per arm the graphs compiled after the warm-up and, per training step over the whole fit,
the device→host and host→device transfers and graph executions (torch_xla's metrics). With
--devices 2 the batch is split over an SPMD mesh of 2 virtual CPU devices, as the worker does;
each device count runs in its own process. On the CPU the "device" is the same cores the host
traces on, so the host's work per step costs twice: a TPU hides what the host does while the
device computes. Before each timed fit the previous one's leftovers are freed and its pending
work run (`settle_between_fits`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common.entry import run_main

REPO = Path(__file__).resolve().parent.parent


def _counters() -> dict[str, int]:
    import torch_xla.debug.metrics as met

    def count(name: str) -> int:
        data = met.metric_data(name)
        return data[0] if data else 0

    compile_time = met.metric_data("CompileTime")
    return {
        "compile_ns": compile_time[1] if compile_time else 0,
        "transfers": count("TransferFromDeviceTime"),
        "uploads": count("TransferToDeviceTime"),
        "compiles": count("CompileTime"),
        "executions": count("ExecuteTime") + count("ExecuteReplicatedTime"),  # SPMD: the latter
    }


def settle_between_fits() -> None:
    """Free what the previous fit left (a fastai Learner lives in reference cycles) and run
    any computation still pending, before the clock starts: a tensor with pending work that is
    freed only later would otherwise join a step of the next fit as an extra output (a new
    graph, compiled inside the timed fit)."""
    import torch_xla
    import torch_xla.core.xla_model as xm

    gc.collect()
    torch_xla.sync()
    xm.wait_device_ops()


def bare_fit(learn: Any, place: Any, epochs: int) -> tuple[float, float]:
    """The bare torch_xla loop over `learn`'s model, optimizer and data. Returns the mean
    validation loss and accuracy of the last epoch (read once per pass)."""
    import torch
    import torch.nn.functional as F
    import torch_xla

    from worker.device_values import read_to_host
    from worker.prefetch import DevicePrefetcher

    model, opt, dls = learn.model, learn.opt, learn.dls
    loss = accuracy = float("nan")
    collecting_automatically = gc.isenabled()
    gc.disable()  # as XlaStepCallback: only the step's own collections run
    for _ in range(epochs):
        gc.collect()  # as XlaStepCallback: frozen, the per-step full collection stays cheap
        gc.freeze()
        model.train()
        for xb, yb in DevicePrefetcher(dls.train, place):
            xb, yb = xb.as_subclass(torch.Tensor), yb.as_subclass(torch.Tensor)
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            opt.zero_grad()
            gc.collect()  # as XlaStepCallback: the batch transforms' cycles
            torch_xla.sync()
        model.eval()
        total_loss = correct = None
        count = 0
        with torch.no_grad():
            for xb, yb in DevicePrefetcher(dls.valid, place):
                xb, yb = xb.as_subclass(torch.Tensor), yb.as_subclass(torch.Tensor)
                output = model(xb)
                batch_loss = F.cross_entropy(output, yb, reduction="sum")
                batch_correct = (output.argmax(dim=-1) == yb).sum()
                if total_loss is None:
                    total_loss, correct = batch_loss, batch_correct
                else:
                    total_loss, correct = total_loss + batch_loss, correct + batch_correct
                count += len(yb)
                gc.collect()
                torch_xla.sync()
        if total_loss is not None:
            host_loss, host_correct = read_to_host([total_loss, correct])
            loss, accuracy = float(host_loss) / count, float(host_correct) / count
    gc.unfreeze()
    if collecting_automatically:
        gc.enable()
    return loss, accuracy


def child(args: argparse.Namespace) -> None:
    """Run both arms on this process's devices; print one JSON line of figures."""
    import torch_xla
    import torch_xla.core.xla_model as xm
    from fastai.torch_core import set_seed

    from bench._fit import check_fit_finished, instrument_like_worker, prepare_digits_fit
    from worker import spmd
    from worker.layer_forward import override_forward
    from worker.training import build_learner

    bench = prepare_digits_fit("traindeck-xla-limit-", args.epochs, args.img_size, args.bs, True)
    setup, dls, spec, folder = bench.setup, bench.dls, bench.spec, bench.folder
    place = spmd.placement(setup.device, setup.parallel)

    def fresh_learner(name: str) -> Any:
        set_seed(spec.seed)
        torch_xla.manual_seed(spec.seed)
        return build_learner(dls, spec, setup.device, folder / name, setup.parallel)

    def run(arm: str, index: int) -> dict[str, float]:
        learn = fresh_learner(f"{arm}-{index}")
        writer = None
        if arm == "traindeck":
            writer = instrument_like_worker(
                learn, bench.engine, spec, folder, setup.label, args.epochs, True
            )
        elif setup.parallel is not None:  # the batch-norm layers as the worker's fit runs them
            override_forward(learn.model, spmd.is_batch_norm, spmd.partitionable_batch_norm)
        settle_between_fits()
        before = _counters()
        started, cpu_started = time.perf_counter(), time.process_time()
        if arm == "traindeck":
            learn.fit_one_cycle(args.epochs, spec.lr)
        else:
            bare_fit(learn, place, args.epochs)
        xm.wait_device_ops()
        elapsed = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_started
        after = _counters()
        if writer is not None:
            writer.close()
            check_fit_finished(learn, args.epochs)
        steps = len(dls.train) * args.epochs
        compiling = (after["compile_ns"] - before["compile_ns"]) / 1e9
        return {
            "images_per_s": bench.images_per_fit / elapsed,
            "images_per_s_without_compiles": bench.images_per_fit / (elapsed - compiling),
            "images_per_cpu_s": bench.images_per_fit / cpu_seconds,
            "compiles": after["compiles"] - before["compiles"],
            "transfers_per_step": (after["transfers"] - before["transfers"]) / steps,
            "uploads_per_step": (after["uploads"] - before["uploads"]) / steps,
            "executions_per_step": (after["executions"] - before["executions"]) / steps,
        }

    rounds: dict[str, list[dict[str, float]]] = {"bare": [], "traindeck": []}
    for arm in rounds:
        run(arm, -1)  # warm-up: compiles and first-touch costs
    for index in range(args.rounds):
        for arm in rounds:
            rounds[arm].append(run(arm, index))
            figures = rounds[arm][-1]
            print(f"  round {index + 1} {arm:<9} {figures['images_per_s']:8.1f} images/s "
                  f"{figures['images_per_cpu_s']:8.1f} images/CPU-s {figures['compiles']:.0f} "
                  "compiles", file=sys.stderr, flush=True)  # fmt: skip
    print(json.dumps({
        "label": setup.label,
        "steps_per_epoch": len(dls.train),
        "valid_batches": len(dls.valid),
        "arms": {
            arm: {key: statistics.median(r[key] for r in results) for key in results[0]}
            for arm, results in rounds.items()
        },
        "rounds": rounds,
    }))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--img-size", type=int, default=16)
    parser.add_argument("--bs", type=int, default=64)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    from worker.device_values import DeviceValuesCallback

    read_every = DeviceValuesCallback().read_every
    print(f"XLA limit benchmark: resnet18, digits {args.img_size}px, global batch {args.bs}, "
          f"{args.epochs} epochs × {args.rounds} rounds per arm, XLA on the CPU, "
          f"traindeck reading the loss every {read_every} steps", flush=True)  # fmt: skip
    for devices in args.devices:
        env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(devices))
        env["PYTHONPATH"] = str(REPO)
        command = [sys.executable, "-m", "bench.xla_limit", "--child", "--rounds",
                   str(args.rounds), "--epochs", str(args.epochs), "--img-size",
                   str(args.img_size), "--bs", str(args.bs)]  # fmt: skip
        result = subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        if result.returncode != 0:
            raise SystemExit(f"{devices} device(s): the benchmark process failed")
        figures = json.loads(result.stdout.strip().splitlines()[-1])
        bare, traindeck = figures["arms"]["bare"], figures["arms"]["traindeck"]
        print(f"{figures['label']}: {figures['steps_per_epoch']} training steps and "
              f"{figures['valid_batches']} validation batches an epoch", flush=True)  # fmt: skip
        for name, arm in (("bare torch_xla", bare), ("traindeck", traindeck)):
            print(f"  {name:<15} {arm['images_per_s']:8.1f} images/s "
                  f"({arm['images_per_s_without_compiles']:.1f} without compiling); after the "
                  f"warm-up {arm['compiles']:.0f} compiles; per training step over the whole fit "
                  f"{arm['transfers_per_step']:.3f} device→host and {arm['uploads_per_step']:.2f} "
                  f"host→device transfers, {arm['executions_per_step']:.2f} graph executions",
                  flush=True)  # fmt: skip
        ratio = traindeck["images_per_s"] / bare["images_per_s"]
        key = "images_per_s_without_compiles"
        steady = traindeck[key] / bare[key]
        per_cpu = traindeck["images_per_cpu_s"] / bare["images_per_cpu_s"]
        print(f"  ratio traindeck/bare {ratio:.3f} wall-clock (target ≥ 0.95); {steady:.3f} "
              f"without the time spent compiling graphs new after the warm-up; {per_cpu:.3f} "
              "per CPU-second of this process (host and XLA's CPU device: the steadier figure "
              "on a shared machine)", flush=True)  # fmt: skip


if __name__ == "__main__":
    run_main(main)

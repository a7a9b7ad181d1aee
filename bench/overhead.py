"""What traindeck's instrumentation costs training: plain fastai vs the worker's run.

    .venv/bin/python -m bench.overhead [--rounds 3] [--epochs 2] [--img-size 16] [--xla]

Both arms build the same DataLoaders and Learner as the worker (`worker.data`,
`worker.training.build_learner`) and call `fit_one_cycle` with the same data, model, seed and
epochs; they alternate A, B, B, A, A, B… in one process so that the machine's noise hits both.
  A  plain fastai: no logging at all (on XLA it keeps the one `torch_xla.sync()` per step
     that any XLA training loop needs, and fastai's Recorder reads the loss and every metric
     to the host in every batch, as fastai does).
  B  traindeck: per-batch loss and lr, per-epoch metrics, progress, the background writer
     flushing to a real SQLite database, the stop check, the worker's checkpoint policy
     (each epoch's state copied to the host, written every TRAINDECK_CHECKPOINT_INTERVAL
     seconds; after the last epoch only with TRAINDECK_KEEP_CHECKPOINTS), and on
     XLA the metrics report every epoch, with the loss and metrics kept on the device and
     read every TRAINDECK_XLA_READ_EVERY (N) steps (`worker.device_values`), and the
     system-metrics sampler every TRAINDECK_SYSTEM_METRICS_INTERVAL seconds
     (`worker.system_metrics`; 0 leaves it out).
Prints each arm's training throughput (images/s), the ratio B/A (target ≥ 0.98), and on XLA,
counted with torch_xla's metrics, the device→host transfers and graph executions of each per
training step (inside the training passes; target: B ≤ 1/N, where A makes one a step), per
validation pass (A: one per metric and batch; B: one), and per step over the whole fit (B's
include the checkpoint's host copy of the weights every epoch).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench._fit import (
    check_fit_finished,
    instrument_like_worker,
    prepare_digits_fit,
    threads_cpu_seconds,
    time_callbacks,
)
from common.entry import run_main


def _compiles() -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return data[0] if data else 0


def _counters() -> tuple[int, int]:
    import torch_xla.debug.metrics as met

    transfers = met.metric_data("TransferFromDeviceTime")
    executions = met.metric_data("ExecuteTime")
    return (transfers[0] if transfers else 0, executions[0] if executions else 0)


def phase_counts() -> Any:
    """A callback adding up torch_xla's device→host transfers and graph executions during the
    training passes (before_train to before_validate) and the validation passes (to the end
    of after_validate), apart from what the epoch's end does (checkpoints)."""
    from fastai.callback.core import Callback

    class PhaseCounts(Callback):
        order = 200  # after every other callback: a pass's own reads are inside it

        def before_fit(self) -> None:
            self.train = [0, 0]
            self.valid = [0, 0]
            self.train_steps = 0
            self.valid_passes = 0

        def _add(self, into: list[int]) -> None:
            now = _counters()
            into[0] += now[0] - self.mark[0]
            into[1] += now[1] - self.mark[1]
            self.mark = now

        def before_train(self) -> None:
            self.mark = _counters()

        def after_batch(self) -> None:
            if self.training:
                self.train_steps += 1

        def before_validate(self) -> None:
            self._add(self.train)

        def after_validate(self) -> None:
            self._add(self.valid)
            self.valid_passes += 1

    return PhaseCounts()


# traindeck's own threads in the job process (the checkpoint writer runs on XLA only).
SIDE_THREADS = ("telemetry-writer", "system-metrics", "profile-requests", "checkpoint-writer")


def side_threads_at_fit_end(into: dict[str, float]) -> Any:
    """A callback adding the CPU seconds of traindeck's threads, read when the fit ends and
    before any callback stops them (the sampler's and the profile look-ups' threads end then)."""
    from fastai.callback.core import Callback

    class SideThreads(Callback):
        order = -1000  # first at after_fit

        def before_fit(self) -> None:
            self.start = threads_cpu_seconds(SIDE_THREADS)

        def after_fit(self) -> None:
            for name, seconds in threads_cpu_seconds(SIDE_THREADS).items():
                into[name] = into.get(name, 0.0) + seconds - self.start.get(name, 0.0)

    return SideThreads()


def print_breakdown(costs: dict[str, float], fit_cpu_seconds: float, fits: int) -> None:
    """What the instrumented arm's own code cost, per fit, as a share of its fit's CPU time."""
    print(f"traindeck's own CPU time per fit (its callbacks on the training thread, its threads; "
          f"{fit_cpu_seconds / fits:.2f} CPU-s a fit):")  # fmt: skip
    for name, seconds in sorted(costs.items(), key=lambda item: -item[1]):
        print(f"  {name:<26} {seconds / fits * 1000:8.1f} ms  "
              f"{seconds / fit_cpu_seconds:6.2%}")  # fmt: skip
    total = sum(costs.values())
    print(f"  {'all of them':<26} {total / fits * 1000:8.1f} ms  {total / fit_cpu_seconds:6.2%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--img-size", type=int, default=16)
    parser.add_argument("--bs", type=int, default=64)
    parser.add_argument("--xla", action="store_true", help="XLA on the CPU (PJRT_DEVICE=CPU)")
    args = parser.parse_args()

    bench = prepare_digits_fit("traindeck-overhead-", args.epochs, args.img_size, args.bs, args.xla)
    folder, engine, spec = bench.folder, bench.engine, bench.spec
    setup, dls = bench.setup, bench.dls
    device, label = setup.device, setup.label
    images_per_run = bench.images_per_fit

    from worker.training import build_learner

    print(f"overhead benchmark: resnet18, digits {args.img_size}px, bs {args.bs}, "
          f"{args.epochs} epochs × {args.rounds} rounds per arm, on {label}")  # fmt: skip

    from worker.device_values import DeviceValuesCallback

    read_every = DeviceValuesCallback().read_every

    def run(instrumented: bool, round_index: int) -> tuple[float, ...]:
        from fastai.torch_core import set_seed

        set_seed(spec.seed)
        learn = build_learner(
            dls, spec, device, folder / f"arm-{instrumented}-{round_index}", setup.parallel
        )
        if not instrumented:  # fastai's own Recorder: the host reads every batch's values
            learn.remove_cbs([cb for cb in learn.cbs if isinstance(cb, DeviceValuesCallback)])
        counts = phase_counts() if args.xla else None
        if counts is not None:
            learn.add_cb(counts)
        steps = len(dls.train) * args.epochs
        writer = None
        if instrumented:
            writer = instrument_like_worker(
                learn, engine, spec, folder, label, args.epochs, args.xla
            )
            if round_index >= 0:
                time_callbacks(learn, costs)
                learn.add_cb(side_threads_at_fit_end(costs))
        if args.xla:
            from bench.xla_limit import settle_between_fits

            settle_between_fits()  # nothing of the previous arm's fit joins this one's graphs
        before = _counters() if args.xla else (0, 0)
        compiles_before = _compiles() if args.xla else 0
        started, cpu_started = time.perf_counter(), time.process_time()
        learn.fit_one_cycle(args.epochs, 1e-2)
        elapsed, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        if instrumented and round_index >= 0:
            instrumented_cpu.append(cpu_seconds)
        after = _counters() if args.xla else (0, 0)
        if writer is not None:
            writer.close()
        check_fit_finished(learn, args.epochs)
        transfers = (after[0] - before[0]) / steps
        executions = (after[1] - before[1]) / steps
        phases = (0.0, 0.0, 0.0, 0.0)
        if counts is not None:
            passes = max(counts.valid_passes, 1)
            phases = (
                counts.train[0] / counts.train_steps,
                counts.train[1] / counts.train_steps,
                counts.valid[0] / passes,
                counts.valid[1] / passes,
            )
        return (
            images_per_run / elapsed,
            transfers,
            executions,
            images_per_run / cpu_seconds,
            *phases,
            (_compiles() if args.xla else 0) - compiles_before,
        )

    costs: dict[str, float] = {}  # the instrumented rounds' CPU seconds, by callback or thread
    instrumented_cpu: list[float] = []
    for instrumented in (False, True):  # warm-up: first-touch costs and on XLA the compiles
        run(instrumented, -1)  # (the arms' validation graphs differ) hit neither arm's rounds
    results: dict[bool, list[tuple[float, ...]]] = {False: [], True: []}
    for round_index in range(args.rounds):
        # A B, then B A: a machine that speeds up or slows down over the run (a shared host's
        # neighbours, CPU boost) favours neither arm.
        order = (False, True) if round_index % 2 == 0 else (True, False)
        for instrumented in order:
            results[instrumented].append(run(instrumented, round_index))
            throughput, _, _, per_cpu_second, *_, compiled = results[instrumented][-1]
            arm = "traindeck" if instrumented else "plain"
            compiles = f" {compiled:3.0f} graphs compiled" if args.xla else ""
            print(f"  round {round_index + 1} {arm:<9} {throughput:8.1f} images/s "
                  f"{per_cpu_second:8.1f} images/CPU-s{compiles}", flush=True)  # fmt: skip

    plain = statistics.median(r[0] for r in results[False])
    traced = statistics.median(r[0] for r in results[True])
    plain_cpu = statistics.median(r[3] for r in results[False])
    traced_cpu = statistics.median(r[3] for r in results[True])
    print(f"plain fastai   {plain:8.1f} images/s  {plain_cpu:8.1f} images/CPU-s")
    print(f"traindeck      {traced:8.1f} images/s  {traced_cpu:8.1f} images/CPU-s")
    paired = statistics.median(
        b[0] / a[0] for a, b in zip(results[False], results[True], strict=True)
    )
    print(
        f"ratio traindeck/plain {traced / plain:.3f} wall-clock, {traced_cpu / plain_cpu:.3f} "
        "per CPU-second (target ≥ 0.98; on a shared machine the CPU-time ratio is the steadier)"
    )
    print(f"median of the rounds' own wall-clock ratios {paired:.3f} (each round's two fits "
          "side by side, the order alternating)")  # fmt: skip
    print_breakdown(costs, sum(instrumented_cpu), len(instrumented_cpu))
    if args.xla:
        print(f"device→host transfers / graph executions (torch_xla's metrics), "
              f"{len(dls.train)} training steps and {len(dls.valid)} validation batches an "
              f"epoch, N = {read_every} (TRAINDECK_XLA_READ_EVERY):")  # fmt: skip
        for instrumented, name in ((False, "plain fastai"), (True, "traindeck")):
            figures = [statistics.median(r[i] for r in results[instrumented]) for i in range(8)]
            transfers, executions = figures[1], figures[2]
            train_transfers, train_executions, valid_transfers, valid_executions = figures[4:]
            print(f"{name:<14} per training step {train_transfers:.3f} / {train_executions:.2f}; "
                  f"per validation pass {valid_transfers:.1f} / {valid_executions:.1f}; "
                  f"per step over the whole fit {transfers:.2f} / {executions:.2f}")  # fmt: skip
        print(f"target: traindeck ≤ 1/N = {1 / read_every:.3f} transfers per training step "
              "(plain fastai reads the loss every step: ≥ 1)")  # fmt: skip


if __name__ == "__main__":
    run_main(main)

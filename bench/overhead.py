"""What traindeck's instrumentation costs training: plain fastai vs the worker's run.

    .venv/bin/python bench/overhead.py [--rounds 3] [--epochs 2] [--img-size 16] [--xla]

Both arms build the same DataLoaders and Learner as the worker (`worker.data`,
`worker.training.build_learner`) and call `fit_one_cycle` with the same data, model, seed and
epochs; they alternate A, B, A, B… in one process so that the machine's noise hits both.
  A  plain fastai: no logging at all (on XLA it keeps the one `torch_xla.sync()` per step
     that any XLA training loop needs).
  B  traindeck: per-batch loss and lr, per-epoch metrics, progress, the background writer
     flushing to a real SQLite database, the stop check, a checkpoint every epoch, and on
     XLA the metrics report every epoch.
Prints each arm's training throughput (images/s), the ratio B/A (target ≥ 0.98), and on XLA
the device→host transfers and graph executions per step of each (target: B adds none).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench._fit import check_fit_finished, instrument_like_worker, prepare_digits_fit
from common.entry import run_main


def _counters() -> tuple[int, int]:
    import torch_xla.debug.metrics as met

    transfers = met.metric_data("TransferFromDeviceTime")
    executions = met.metric_data("ExecuteTime")
    return (transfers[0] if transfers else 0, executions[0] if executions else 0)


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

    def run(instrumented: bool, round_index: int) -> tuple[float, float, float, float]:
        from fastai.torch_core import set_seed

        set_seed(spec.seed)
        learn = build_learner(
            dls, spec, device, folder / f"arm-{instrumented}-{round_index}", setup.parallel
        )
        steps = len(dls.train) * args.epochs
        writer = None
        if instrumented:
            writer = instrument_like_worker(
                learn, engine, spec, folder, label, args.epochs, args.xla
            )
        before = _counters() if args.xla else (0, 0)
        started, cpu_started = time.perf_counter(), time.process_time()
        learn.fit_one_cycle(args.epochs, 1e-2)
        elapsed, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        after = _counters() if args.xla else (0, 0)
        if writer is not None:
            writer.close()
        check_fit_finished(learn, args.epochs)
        transfers = (after[0] - before[0]) / steps
        executions = (after[1] - before[1]) / steps
        return images_per_run / elapsed, transfers, executions, images_per_run / cpu_seconds

    run(False, -1)  # warm-up: first-touch costs (and on XLA the compiles) hit neither arm
    results: dict[bool, list[tuple[float, float, float, float]]] = {False: [], True: []}
    for round_index in range(args.rounds):
        for instrumented in (False, True):
            results[instrumented].append(run(instrumented, round_index))
            throughput, _, _, per_cpu_second = results[instrumented][-1]
            arm = "traindeck" if instrumented else "plain"
            print(f"  round {round_index + 1} {arm:<9} {throughput:8.1f} images/s "
                  f"{per_cpu_second:8.1f} images/CPU-s", flush=True)  # fmt: skip

    plain = statistics.median(r[0] for r in results[False])
    traced = statistics.median(r[0] for r in results[True])
    plain_cpu = statistics.median(r[3] for r in results[False])
    traced_cpu = statistics.median(r[3] for r in results[True])
    print(f"plain fastai   {plain:8.1f} images/s  {plain_cpu:8.1f} images/CPU-s")
    print(f"traindeck      {traced:8.1f} images/s  {traced_cpu:8.1f} images/CPU-s")
    print(
        f"ratio traindeck/plain {traced / plain:.3f} wall-clock, {traced_cpu / plain_cpu:.3f} "
        "per CPU-second (target ≥ 0.98; on a shared machine the CPU-time ratio is the steadier)"
    )
    if args.xla:
        for instrumented, name in ((False, "plain fastai"), (True, "traindeck")):
            transfers = statistics.median(r[1] for r in results[instrumented])
            executions = statistics.median(r[2] for r in results[instrumented])
            print(f"{name:<14} per step: {transfers:.2f} device→host transfers, "
                  f"{executions:.2f} graph executions")  # fmt: skip


if __name__ == "__main__":
    run_main(main)

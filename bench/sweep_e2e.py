"""Issue 14's end-to-end sweep at full size, on the CPU (not part of the test suite: it trains
8 trials on every digit image; tests/worker/test_sweep_workers.py is the small, killed-worker
version that CI runs).

    .venv/bin/python -m bench.sweep_e2e [--trials 8] [--epochs 4] [--img-size 16] [--workers 2]

A fresh SQLite database in a scratch folder, the built-in digits, a random sweep over lr in
[1e-5, 1e-1] log-uniform, objective accuracy, the successive-halving (ASHA) pruner, as many
trials at once as workers, run by that many real workers. Prints each trial (lr, status, the
epochs it trained, its accuracy by epoch), how many were pruned before their last epoch, the
best accuracy, and whether every trial's metric points are stored once (one point per step
and name, one epoch point per epoch trained). Exits 1 when a check of issue 14 fails: at
least 2 trials pruned before their last epoch, the best accuracy at least 0.9, every point
stored once.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script, the repository is not on the path

from common.entry import run_main  # noqa: E402


def _definition(args: argparse.Namespace) -> dict:
    return {
        "name": "issue 14 e2e",
        "base": {"dataset": "digits", "epochs": args.epochs, "img_size": args.img_size,
                 "device": "cpu"},
        "space": {"lr": {"type": "log_uniform", "low": 1e-5, "high": 1e-1}},
        "objective": {"metric": "accuracy"},
        "trials": args.trials,
        "max_concurrent": args.workers,
        "sampler": "random",
        "seed": args.seed,
        "pruner": "asha",
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--img-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="traindeck-sweep-e2e-"))
    env = {
        **os.environ,
        "TRAINDECK_DATA": str(folder),
        "DATABASE_URL": f"sqlite:///{folder / 'e2e.db'}",
        "PYTHONPATH": str(REPO),
    }
    os.environ.update({key: env[key] for key in ("TRAINDECK_DATA", "DATABASE_URL")})
    from datasets.builtin import register_builtin_datasets
    from db import sweeps, telemetry
    from db.engine import get_engine
    from db.migrate import upgrade

    engine = get_engine()
    upgrade(engine)
    register_builtin_datasets(engine)
    sweep_id = sweeps.submit_sweep(engine, _definition(args))
    started = time.monotonic()
    logs = [open(folder / f"worker-{n}.log", "w") for n in range(args.workers)]  # noqa: SIM115
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "worker",
                "--worker-id",
                f"e2e-{n}",
                "--device",
                "cpu",
                "--poll-interval",
                "0.5",
            ],
            cwd=REPO,
            env=env,
            stdout=logs[n],
            stderr=subprocess.STDOUT,
        )
        for n in range(args.workers)
    ]
    try:
        while sweeps.get_sweep(engine, sweep_id).status == "running":
            if any(worker.poll() is not None for worker in workers):
                print(f"a worker ended early; see {folder}/worker-*.log")
                return 1
            time.sleep(2)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=120)
    wall_s = time.monotonic() - started
    summary = sweeps.summary(engine, sweep_id)
    pruned_early = 0
    points_once = True
    print(f"sweep {sweep_id}: {len(summary.trials)} trials on {args.workers} workers, "
          f"{wall_s:.0f} s wall")  # fmt: skip
    for row in summary.trials:
        values = [
            value for _, value in telemetry.metric_series(engine, row.job_id, "epoch/accuracy")
        ]
        duplicates = telemetry.count_metric_duplicates(engine, row.job_id)
        once = duplicates == 0 and len(values) == row.epochs_reported
        points_once &= once
        if row.status == "pruned" and row.epochs_reported < args.epochs:
            pruned_early += 1
        shown = " ".join(f"{value:.3f}" for value in values)
        print(f"  trial {row.number}: lr {row.params['lr']:.2e}  {row.status:<9} "
              f"{row.epochs_reported}/{args.epochs} epochs  accuracy by epoch [{shown}]"
              f"{'' if once else f'  NOT STORED ONCE ({duplicates} duplicated)'}")  # fmt: skip
    best = summary.best
    best_accuracy = best.objective if best is not None else None
    print(f"pruned before their last epoch: {pruned_early} (want >= 2)")
    print(f"best accuracy: {'-' if best_accuracy is None else f'{best_accuracy:.4f}'} "
          "(want >= 0.9)")  # fmt: skip
    print(f"every trial's metric points stored once: {points_once}")
    ok = pruned_early >= 2 and best_accuracy is not None and best_accuracy >= 0.9 and points_once
    return 0 if ok else 1


if __name__ == "__main__":
    run_main(main)

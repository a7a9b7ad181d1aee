"""What pruning saves a sweep: the same sweep with the successive-halving (ASHA) pruner and
without a pruner, run by a real worker on the digits, interleaved.

    .venv/bin/python -m bench.sweep [--rounds 1] [--trials 8] [--epochs 4] [--img-size 16]
                                    [--per-class 0]

Each arm is a fresh SQLite database in a scratch folder, the built-in digits (or the first
--per-class images of each class), a random sweep over lr in [1e-5, 1e-1] log-uniform with the
same seed in both arms (so both draw the same trials in the same order), one trial at a time,
objective accuracy. Its cost is the CPU time of the worker and every training process it
started (getrusage of the waited-for children). Target: pruned/unpruned CPU time ≤ 0.6, and
both arms' best accuracy within 0.01 of each other. Prints the figures and the ratio; never
fails on timing. A trial that fails (not succeeded, not pruned) voids the ratio: it is printed
with its error instead.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script (make bench), the repository is not on the path

from common.entry import run_main  # noqa: E402

ARMS = ("asha", "none")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _definition(args: argparse.Namespace, dataset: str, pruner: str) -> dict:
    return {
        "name": f"bench {pruner}",
        "base": {"dataset": dataset, "epochs": args.epochs, "img_size": args.img_size,
                 "device": "cpu"},
        "space": {"lr": {"type": "log_uniform", "low": 1e-5, "high": 1e-1}},
        "objective": {"metric": "accuracy"},
        "trials": args.trials,
        "max_concurrent": 1,
        "sampler": "random",
        "seed": 0,
        "pruner": pruner,
    }  # fmt: skip


def _last_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else "no error text"


def run_arm(args: argparse.Namespace, pruner: str) -> tuple[float, float | None, int, list[str]]:
    """One sweep to its end: (CPU seconds, best accuracy, trials pruned, why trials failed)."""
    folder = Path(tempfile.mkdtemp(prefix=f"traindeck-bench-sweep-{pruner}-"))
    env = {
        **os.environ,
        "TRAINDECK_DATA": str(folder),
        "DATABASE_URL": f"sqlite:///{folder / 'bench.db'}",
        "PYTHONPATH": str(REPO),
    }
    os.environ.update({key: env[key] for key in ("TRAINDECK_DATA", "DATABASE_URL")})
    from datasets.builtin import register_builtin_datasets
    from datasets.register import register_folder
    from db import queue, sweeps
    from db.engine import dispose_engines, get_engine
    from db.migrate import upgrade
    from tests.support.workers import digits_subset

    dispose_engines()
    engine = get_engine()
    upgrade(engine)
    dataset = "digits"
    if args.per_class:
        dataset = "digits-bench"
        register_folder(engine, dataset, digits_subset(folder, args.per_class))
    else:
        register_builtin_datasets(engine)
    sweep_id = sweeps.submit_sweep(engine, _definition(args, dataset, pruner))
    before = _children_cpu_s()
    subprocess.run(
        [sys.executable, "-m", "worker", "--max-jobs", str(args.trials), "--device", "cpu",
         "--poll-interval", "0.2"],
        cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    cpu_s = _children_cpu_s() - before
    sweeps.drive(engine, sweep_id, "bench")
    summary = sweeps.summary(engine, sweep_id)
    best = summary.best
    pruned = sum(row.status == "pruned" for row in summary.trials)
    failed = [
        f"trial {row.number} {row.status}: {_last_line(queue.get_job(engine, row.job_id).error)}"
        for row in summary.trials
        if row.status not in ("succeeded", "pruned")
    ]
    return cpu_s, best.objective if best is not None else None, pruned, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--img-size", type=int, default=16)
    parser.add_argument("--per-class", type=int, default=0, help="0: every digit image")
    args = parser.parse_args()
    cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
    best: dict[str, list[float | None]] = {arm: [] for arm in ARMS}
    failures = []
    for round_number in range(args.rounds):
        for arm in ARMS if round_number % 2 == 0 else ARMS[::-1]:
            seconds, top, pruned, failed = run_arm(args, arm)
            failures += [f"round {round_number + 1} {arm}: {line}" for line in failed]
            cpu[arm].append(seconds)
            best[arm].append(top)
            shown = "-" if top is None else f"{top:.4f}"
            print(
                f"round {round_number + 1} {arm:>5}: {seconds:7.1f} CPU s, best accuracy "
                f"{shown}, {pruned} of {args.trials} trials pruned, {len(failed)} failed",
                flush=True,
            )
    if failures:
        # A failed trial costs next to nothing: a ratio over it would be no measurement.
        print("no ratio: trials failed, so the arms did not do the same work")
        for line in failures:
            print(f"  {line}")
        return
    ratio = statistics.median(cpu["asha"]) / statistics.median(cpu["none"])
    print(f"CPU time pruned/unpruned: {ratio:.2f} (target ≤ 0.6)")
    tops = [top for arm in ARMS for top in best[arm] if top is not None]
    if len(tops) == len(ARMS) * args.rounds:
        gap = max(tops) - min(tops)
        print(f"best accuracy gap between the arms: {gap:.4f} (target ≤ 0.01)")
    else:
        print("an arm found no best trial")


if __name__ == "__main__":
    run_main(main)

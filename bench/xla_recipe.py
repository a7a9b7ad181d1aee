"""The recipe our users bring, on XLA: fastai's augmentation in the batch transforms, a large
batch, bf16 mixed precision, fit_one_cycle. Does the XLA path run it whole and at speed?

    .venv/bin/python -m bench.xla_recipe [--epochs 3] [--img-size 32] [--bs 128] [--lr 0.01]
                                         [--grad-accum 1] [--grad-clip none] [--sizes 32 64 128]

Three jobs (resnet18 on the digits) through one worker, as it runs them: one with `augment`,
the same job again, and one without `augment`, the rest the same. The second job has the first
one's graphs, so the worker hands it to the first job's process (`worker/job_channel.py`); the
third has other graphs and gets a process of its own. Per job and epoch it prints the ops that
fell back to the CPU (`aten::` counters: the target is none), the graphs compiled after the
first epoch (target: none), the training images/s and the final accuracy; then the second
job's compile time as a share of the first's, from its own XLA report (target: under 10%), and
the augmented job's images/s (epochs 2 on, compiles done) as a share of the plain one's
(target: 0.85 or more).

Then, for a batch of `--bs` images at each of `--sizes`, the augmentation's own cost: one
batch through `worker.augment` on the XLA device (the graph compiled, timed per batch) and the
same computation eager on the host's CPU, as the prefetch thread would run it. On a TPU VM this
uses the TPU; elsewhere XLA's CPU backend (PJRT_DEVICE=CPU), whose "device" is the same CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common.entry import run_main

REPO = Path(__file__).resolve().parent.parent
TIMED_BATCHES = 5


def _run_jobs(engine, specs: list[dict], env: dict) -> list[dict]:
    """Queue the jobs and run them with one worker, in order; each one's figures."""
    from db import queue, telemetry
    from db.telemetry import metric_series

    job_ids = [queue.submit(engine, spec) for spec in specs]
    subprocess.run([sys.executable, "-m", "worker", "--max-jobs", str(len(specs))], cwd=REPO,
                   env=env, capture_output=True, check=True)  # fmt: skip
    figures = []
    for job_id in job_ids:
        job = queue.get_job(engine, job_id)
        reports = telemetry.xla_reports(engine, job_id)
        rates = [value for _, value in metric_series(engine, job_id, "epoch/images_per_s")]
        final = telemetry.final_metrics(engine, [job_id]).get(job_id, {})
        figures.append(
            {"job": job, "reports": reports, "rates": rates, "accuracy": final.get("accuracy")}
        )
    return figures


def _print_job(name: str, figures: dict) -> None:
    job, reports = figures["job"], figures["reports"]
    print(f"{name}: job {job.status} on {job.device}"
          + (f" ({job.error})" if job.error else ""), flush=True)  # fmt: skip
    previous: dict = {}
    for report, rate in zip(reports, figures["rates"], strict=False):
        fallbacks = report.summary["aten_fallbacks"]
        new = {
            op: n - previous.get(op, 0) for op, n in fallbacks.items() if n > previous.get(op, 0)
        }
        previous = fallbacks
        listed = ", ".join(f"aten::{op} ×{n}" for op, n in sorted(new.items())) or "none"
        print(f"  epoch {report.epoch + 1}: fallbacks {listed}; compiled so far "
              f"{report.summary['compile_count']}; {rate:.1f} images/s")  # fmt: skip
    if reports:
        after = reports[-1].summary["compile_count"] - reports[0].summary["compile_count"]
        print(f"  graphs compiled after epoch 1: {after} (target: 0)")
    if figures["accuracy"] is not None:
        print(f"  accuracy {figures['accuracy']:.4f}")


def _steady_rate(rates: list[float]) -> float:
    return statistics.mean(rates[1:]) if len(rates) > 1 else float("nan")


def augmentation_cost(bs: int, size: int) -> dict:
    """Seconds per batch of the augmentation alone: on the XLA device and eager on the host."""
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    from fastai.torch_core import TensorImage

    from worker.augment import XlaAugment, augment_batch

    augment = XlaAugment(size, seed=0)
    host = torch.rand(bs, 3, size, size)
    device = torch_xla.device()
    x = TensorImage(host).to(device)
    seconds = []
    for _ in range(TIMED_BATCHES + 1):  # the first compiles
        started = time.perf_counter()
        augment.receive(torch.from_numpy(augment.parameters_for(bs, size, size)).to(device))
        out = augment(x, split_idx=0)
        torch_xla.sync()
        xm.wait_device_ops()
        seconds.append(time.perf_counter() - started)
        del out
    host_seconds = []
    for _ in range(TIMED_BATCHES):
        started = time.perf_counter()
        parameters = torch.from_numpy(augment.parameters_for(bs, size, size))
        augment_batch(host, parameters, (size, size))
        host_seconds.append(time.perf_counter() - started)
    return {"device_s": statistics.median(seconds[1:]), "host_s": statistics.median(host_seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--img-size", type=int, default=32)
    parser.add_argument("--bs", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--grad-clip", type=float, default=None)
    parser.add_argument("--sizes", type=int, nargs="*", default=[32, 64, 128])
    parser.add_argument("--cost-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    from worker.devices import tpu_present

    if not tpu_present():
        os.environ.setdefault("PJRT_DEVICE", "CPU")
    if args.cost_only:  # in a fresh process: the XLA runtime and its metrics are per process
        for size in args.sizes:
            print(json.dumps({"size": size, **augmentation_cost(args.bs, size)}), flush=True)
        return

    folder = Path(tempfile.mkdtemp(prefix="traindeck-recipe-"))
    os.environ["TRAINDECK_DATA"] = str(folder)
    os.environ["DATABASE_URL"] = f"sqlite:///{folder / 'bench.db'}"
    from db.engine import get_engine
    from db.migrate import upgrade

    engine = get_engine()
    upgrade(engine)
    spec = {"arch": "resnet18", "epochs": args.epochs, "lr": args.lr, "img_size": args.img_size,
            "bs": args.bs, "device": "xla", "cores": 1, "mixed_precision": "bf16",
            "grad_accum": args.grad_accum, "grad_clip": args.grad_clip,
            "schedule": "one_cycle"}  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO))
    print(f"the recipe on XLA: resnet18, digits {args.img_size} px, bs {args.bs}, bf16, "
          f"fit_one_cycle {args.epochs} epochs, lr {args.lr}, grad_accum {args.grad_accum}, "
          f"grad_clip {args.grad_clip}", flush=True)  # fmt: skip
    names = ("with augment", "with augment, again", "without augment")
    specs = [{**spec, "augment": name != "without augment", "name": name} for name in names]
    jobs = dict(zip(names, _run_jobs(engine, specs, env), strict=True))
    for name, figures in jobs.items():
        _print_job(name, figures)
    first, second = (jobs[name]["reports"][-1].summary for name in names[:2])
    print(f"second job's compile time: {second['compile_time_s']:.2f} s, "
          f"{second['compile_time_s'] / first['compile_time_s'] * 100:.1f}% of the first's "
          f"{first['compile_time_s']:.2f} s (target: under 10%); "
          f"{second.get('graphs_kept', 0)} graphs kept from job "
          f"{second.get('graphs_kept_from_job')}")  # fmt: skip
    augmented = _steady_rate(jobs["with augment"]["rates"])
    plain = _steady_rate(jobs["without augment"]["rates"])
    print(f"images/s from epoch 2 on: {augmented:.1f} with augment, {plain:.1f} without; "
          f"ratio {augmented / plain:.2f} (target: 0.85 or more)")  # fmt: skip

    if args.sizes:
        print(f"the augmentation alone, per batch of {args.bs} (median of {TIMED_BATCHES}):")
        result = subprocess.run(
            [sys.executable, __file__, "--cost-only", "--bs", str(args.bs), "--sizes",
             *map(str, args.sizes)],
            cwd=REPO, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        for line in result.stdout.splitlines():
            if line.startswith("{"):
                cost = json.loads(line)
                print(f"  {cost['size']} px: {cost['device_s'] * 1e3:.1f} ms on the XLA device, "
                      f"{cost['host_s'] * 1e3:.1f} ms eager on the host CPU")  # fmt: skip


if __name__ == "__main__":
    run_main(main)

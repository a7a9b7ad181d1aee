"""The persistent XLA compilation cache: the same job twice, through the worker, on one data
folder. Does the second job load its graphs instead of compiling them?

    .venv/bin/python -m bench.compile_cache [--epochs 1] [--img-size 16] [--bs 64]

Each job runs in its own process (as the worker always runs them), so only the cache under
`<data>/xla_cache` carries compiled graphs from the first to the second. Prints per job: graphs
compiled and seconds spent compiling (torch_xla's CompileTime), cache hits, misses and load
failures, and the first epoch's wall time; then the second job's compile time as a share of
the first's (target: under 10%).

On a TPU VM this uses the TPU. Elsewhere it runs XLA on the CPU (PJRT_DEVICE=CPU), whose PJRT
client in torch_xla 2.9 writes executables to the cache but cannot load them
("Deserializing serialized executable not supported"): there the lookups are counted as load
failures and every graph is compiled again, and this benchmark says so. torch_xla 2.8 and 2.9
cannot load them on a TPU either (pytorch/xla#9094, not measured here). What spares a second
job its compiles on this stack is the worker keeping the process: bench/xla_recipe.py.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common.entry import run_main

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--img-size", type=int, default=16)
    parser.add_argument("--bs", type=int, default=64)
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="traindeck-cache-"))
    os.environ["TRAINDECK_DATA"] = str(folder)
    os.environ["DATABASE_URL"] = f"sqlite:///{folder / 'bench.db'}"
    from db import queue, telemetry
    from db.engine import get_engine
    from db.migrate import upgrade
    from db.telemetry import metric_series
    from worker.devices import tpu_present

    if not tpu_present():
        os.environ.setdefault("PJRT_DEVICE", "CPU")
    engine = get_engine()
    upgrade(engine)
    spec = {"arch": "resnet18", "epochs": args.epochs, "lr": 1e-2, "img_size": args.img_size,
            "bs": args.bs, "device": "xla", "cores": 1}  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO))
    figures = []
    for run in ("first", "second"):
        job_id = queue.submit(engine, {**spec, "name": f"{run} job"})
        subprocess.run([sys.executable, "-m", "worker", "--once"], cwd=REPO, env=env,
                       capture_output=True, check=True)  # fmt: skip
        job = queue.get_job(engine, job_id)
        if job.status != "succeeded":
            raise SystemExit(f"the {run} job {job.status}: {job.error}")
        summary = telemetry.xla_reports(engine, job_id)[-1].summary
        first_epoch_s = metric_series(engine, job_id, "epoch/time_s")[0][1]
        figures.append(summary)
        print(f"{run} job on {job.device}: {summary['compile_count']} graphs compiled in "
              f"{summary['compile_time_s']:.1f} s; cache: {summary['persistent_cache_hits']} "
              f"hits, {summary['persistent_cache_misses']} misses, "
              f"{summary.get('persistent_cache_load_failures', 0)} load failures; first epoch "
              f"{first_epoch_s:.1f} s", flush=True)  # fmt: skip
    first, second = figures
    share = second["compile_time_s"] / first["compile_time_s"]
    print(f"second job's compile time: {share * 100:.1f}% of the first's (target: under 10%)")
    if second.get("persistent_cache_load_failures", 0):
        print("the second job found its graphs in the cache but this XLA backend could not load "
              "them (torch_xla 2.8 and 2.9 cannot: pytorch/xla#9094), so it compiled them "
              "again")  # fmt: skip


if __name__ == "__main__":
    run_main(main)

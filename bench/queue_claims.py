"""Queue benchmark: claim throughput and submit→claim latency, SQLite and Postgres, 1 and 4
claimers (separate processes, as workers are). Prints figures; never fails on timing.

    .venv/bin/python -m bench.queue_claims [--jobs 1000] [--latency-jobs 200]
        [--backends sqlite,postgres]

Throughput: N queued jobs, K claimers start together and claim until the queue is empty.
Latency: K idle claimers wait the way `python -m worker` does (Postgres: LISTEN/NOTIFY; SQLite:
polling every --poll-interval s); jobs are submitted one by one at random gaps, and each
job's claim time minus its submit time is measured. Every run also counts double claims.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text

from common.entry import run_main
from db import queue
from db.engine import create_db_engine
from db.migrate import upgrade
from db.spec import JobSpec

sys.path.insert(0, sys.argv[6])

REPO = Path(__file__).resolve().parent.parent
POSTGRES_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
CLAIMER = """

url, worker_id, go_file, out_file, stop_file = sys.argv[1:6]
poll = float(sys.argv[7])
engine = create_db_engine(url)
signal = JobSignal(engine)
engine.connect().close()
Path(out_file + ".ready").touch()
while not Path(go_file).exists():
    time.sleep(0.002)
claims = []
while True:
    job = claim(engine, worker_id)
    if job is not None:
        claims.append([job.id, time.time()])
        continue
    if Path(stop_file).exists():
        break
    signal.wait(poll)
Path(out_file).write_text(json.dumps(claims))
"""


def _fresh_database(backend: str, folder: Path) -> tuple[str, callable]:
    if backend == "sqlite":
        return f"sqlite:///{folder / 'bench.db'}", lambda: None
    name = f"traindeck_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(POSTGRES_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return POSTGRES_ADMIN.rsplit("/", 1)[0] + "/" + name, drop


def _start_claimers(url: str, count: int, folder: Path, poll: float) -> tuple[list, list[Path]]:
    go, stop = folder / "go", folder / "stop"
    go.unlink(missing_ok=True)
    stop.unlink(missing_ok=True)
    outputs = [folder / f"claims-{uuid.uuid4().hex[:6]}.json" for _ in range(count)]
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CLAIMER,
                url,
                f"w{i}",
                str(go),
                str(out),
                str(stop),
                str(REPO),
                str(poll),
            ]
        )
        for i, out in enumerate(outputs)
    ]
    deadline = time.monotonic() + 120
    while not all(Path(f"{out}.ready").exists() for out in outputs):
        if time.monotonic() > deadline:
            raise RuntimeError("claimers did not start")
        time.sleep(0.02)
    return processes, outputs


def _collect(processes: list, outputs: list[Path], folder: Path) -> list[list[float]]:
    (folder / "stop").touch()
    for process in processes:
        process.wait(timeout=300)
    return [claim for out in outputs for claim in json.loads(out.read_text())]


def throughput(backend: str, claimers: int, jobs: int, poll: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        url, drop = _fresh_database(backend, folder)
        try:
            engine = create_db_engine(url)
            upgrade(engine)
            spec = JobSpec()
            for _ in range(jobs):
                queue.enqueue(engine, spec)
            processes, outputs = _start_claimers(url, claimers, folder, poll)
            (folder / "stop").touch()  # claim until empty, then exit
            started = time.time()
            (folder / "go").touch()
            claims = _collect(processes, outputs, folder)
            elapsed = max(at for _, at in claims) - started
            engine.dispose()
        finally:
            drop()
    ids = [job_id for job_id, _ in claims]
    return {
        "claims_per_s": len(ids) / elapsed,
        "double_claims": len(ids) - len(set(ids)),
        "missed": jobs - len(set(ids)),
    }


def latency(backend: str, claimers: int, jobs: int, poll: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        url, drop = _fresh_database(backend, folder)
        try:
            engine = create_db_engine(url)
            upgrade(engine)
            processes, outputs = _start_claimers(url, claimers, folder, poll)
            (folder / "go").touch()
            time.sleep(0.5)  # every claimer is idle, waiting
            submitted: dict[int, float] = {}
            spec = JobSpec()
            rng = random.Random(7)
            for _ in range(jobs):
                time.sleep(rng.uniform(0.02, 0.08))
                before = time.time()
                job_id = queue.enqueue(engine, spec)
                submitted[job_id] = before
            time.sleep(poll + 0.5)
            claims = _collect(processes, outputs, folder)
            engine.dispose()
        finally:
            drop()
    delays_ms = sorted((at - submitted[job_id]) * 1000 for job_id, at in claims)
    ids = [job_id for job_id, _ in claims]
    return {
        "p50_ms": statistics.median(delays_ms),
        "p99_ms": delays_ms[min(len(delays_ms) - 1, int(len(delays_ms) * 0.99))],
        "double_claims": len(ids) - len(set(ids)),
        "missed": jobs - len(set(ids)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--latency-jobs", type=int, default=200)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=0.25,
        help="SQLite claimers' poll interval (Postgres waits on NOTIFY)",
    )
    args = parser.parse_args()
    print(f"queue benchmark: {args.jobs} jobs for throughput, {args.latency_jobs} for latency")
    for backend in args.backends.split(","):
        for claimers in (1, 4):
            result = throughput(backend, claimers, args.jobs, args.poll_interval)
            print(
                f"{backend:<8} claimers={claimers}  throughput {result['claims_per_s']:8.0f} "
                f"claims/s  double claims {result['double_claims']}  missed {result['missed']}",
                flush=True,
            )
            result = latency(backend, claimers, args.latency_jobs, args.poll_interval)
            how = "notify" if backend == "postgres" else f"poll {args.poll_interval:g}s"
            print(
                f"{backend:<8} claimers={claimers}  submit→claim p50 {result['p50_ms']:7.1f} ms"
                f"  p99 {result['p99_ms']:7.1f} ms ({how})  double claims "
                f"{result['double_claims']}  missed {result['missed']}",
                flush=True,
            )


if __name__ == "__main__":
    run_main(main)

"""How fast the dashboard reads what it draws, on SQLite. Prints figures; never fails on time.

1. A job with 10^4, 10^5 and 10^6 `batch/train_loss` points (and as many `batch/lr` points):
   the job page's first read (query + min/max bucketing, `db.series.read_series`) plus the
   figure built from it, against the naive way (fetch every row, then MinMaxLTTB); and a
   refresh (`db.series.rows_since` for the 100 newest rows). Target: under 300 ms at 10^6,
   growing no faster than the number of points.
2. The jobs page's query (`db.jobs_table.job_rows`) with 1,000 jobs of 300 metric points each.

    .venv/bin/python -m bench.dashboard_queries [--quick] [--postgres ADMIN_URL]
        --quick: 10^4 and 10^5 points only
        --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test: the same in a temporary
        Postgres database as well
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from sqlalchemy import create_engine, insert, text
from tsdownsample import MinMaxLTTBDownsampler

from common.entry import run_main
from dashboard.charts import batch_loss_figure
from db.engine import create_db_engine, write_tx
from db.jobs_table import job_rows
from db.migrate import upgrade
from db.models import Job, Metric, utcnow
from db.series import read_series, rows_since, snapshot
from db.telemetry import metric_series

BENCH = Path(__file__).resolve().parent

TARGET_MS = 300.0
INSERT_CHUNK = 50_000


def best_ms(function: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def add_job(engine, name: str, status: str = "running") -> int:
    with write_tx(engine) as connection:
        return connection.execute(
            insert(Job)
            .values(
                name=name,
                status=status,
                spec={"dataset": "digits", "arch": "resnet18"},
                created_at=utcnow(),
            )
            .returning(Job.id)
        ).scalar_one()


def add_points(engine, job_id: int, points: int) -> None:
    """`points` train-loss points (noisy decay with a few spikes) and as many lr points."""
    rng = np.random.default_rng(job_id)
    steps = np.arange(points)
    loss = 2.0 * np.exp(-steps / (points / 5)) + 0.1 + rng.normal(0, 0.05, points)
    loss[rng.integers(0, points, 5)] += 3.0
    lr = 1e-3 * np.sin(np.pi * steps / points)
    for start in range(0, points, INSERT_CHUNK):
        chunk = range(start, min(points, start + INSERT_CHUNK))
        rows = [
            {
                "job_id": job_id,
                "name": name,
                "step": i,
                "epoch": 0,
                "value": float(v[i]),
                "wall_time": 0.0,
            }
            for name, v in (("batch/train_loss", loss), ("batch/lr", lr))
            for i in chunk
        ]
        with write_tx(engine) as connection:
            connection.execute(insert(Metric), rows)


def series_figures(engine) -> None:
    print("job page, batch/train_loss (best of 5; ms)")
    print(f"{'points':>10} {'query+bucket':>13} {'+figure':>9} {'refresh':>9} {'naive':>9}")
    sizes = (10**4, 10**5) if "--quick" in sys.argv else (10**4, 10**5, 10**6)
    previous: tuple[int, float] | None = None
    for points in sizes:
        job_id = add_job(engine, f"{points} points")
        add_points(engine, job_id, points)
        read_ms = best_ms(lambda j=job_id: read_series(engine, j, "batch/train_loss"), 5)
        figure_ms = best_ms(
            lambda j=job_id: batch_loss_figure(read_series(engine, j, "batch/train_loss")), 5
        )
        last_id = snapshot(engine, job_id, names=[]).last_id - 100
        refresh_ms = best_ms(lambda j=job_id, a=last_id: rows_since(engine, j, a), 5)

        def naive(j: int = job_id) -> None:
            rows = metric_series(engine, j, "batch/train_loss")
            x = np.fromiter((step for step, _ in rows), dtype=np.int64, count=len(rows))
            y = np.fromiter((value for _, value in rows), dtype=np.float64, count=len(rows))
            MinMaxLTTBDownsampler().downsample(x, y, n_out=4000)

        naive_ms = best_ms(naive, 2)
        print(
            f"{points:>10,} {read_ms:>13.1f} {figure_ms:>9.1f} {refresh_ms:>9.1f} {naive_ms:>9.1f}"
        )
        if previous is not None:
            ratio = read_ms / previous[1]
            print(f"{'':>10} x{points / previous[0]:.0f} points -> x{ratio:.1f} time")
        previous = (points, read_ms)
    if previous[0] == 10**6:
        verdict = "meets" if previous[1] < TARGET_MS else "misses"
        print(f"at 10^6 points: {previous[1]:.0f} ms, {verdict} the {TARGET_MS:.0f} ms target")


def jobs_page_figures(engine, jobs: int = 1000, points_per_job: int = 300) -> None:
    for index in range(jobs):
        job_id = add_job(engine, f"job {index}", "succeeded" if index % 10 == 0 else "running")
        rows = [
            {
                "job_id": job_id,
                "name": "batch/train_loss",
                "step": step,
                "epoch": step // 100,
                "value": 1.0 / (step + 1),
                "wall_time": 0.0,
            }
            for step in range(points_per_job)
        ] + [
            {
                "job_id": job_id,
                "name": f"epoch/{name}",
                "step": epoch,
                "epoch": epoch,
                "value": 0.5,
                "wall_time": 0.0,
            }
            for name in ("valid_loss", "accuracy", "train_loss")
            for epoch in range(3)
        ]
        with write_tx(engine) as connection:
            connection.execute(insert(Metric), rows)
    print(f"\njobs page, {jobs:,} jobs with {points_per_job} points each (best of 5; ms)")
    for limit in (500, 1000):
        shown = len(job_rows(engine, limit=limit))
        took = best_ms(lambda n=limit: job_rows(engine, limit=n), 5)
        print(f"  job_rows(limit={limit}): {took:.1f} ms ({shown} rows)")
    shown = len(job_rows(engine, ["succeeded"], limit=500))
    took = best_ms(lambda: job_rows(engine, ["succeeded"], limit=500), 5)
    print(f"  job_rows(status=succeeded): {took:.1f} ms ({shown} rows)")


def run(engine) -> None:
    upgrade(engine)
    series_figures(engine)
    jobs_page_figures(engine)
    engine.dispose()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="traindeck-bench-") as folder:
        print("== SQLite")
        run(create_db_engine(f"sqlite:///{folder}/bench.db"))
    if "--postgres" in sys.argv:
        admin_url = sys.argv[sys.argv.index("--postgres") + 1]
        name = f"traindeck_bench_{os.getpid()}"
        admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            print("\n== Postgres")
            run(create_db_engine(admin_url.rsplit("/", 1)[0] + "/" + name))
        finally:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


if __name__ == "__main__":
    run_main(main)

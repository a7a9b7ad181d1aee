"""Jobs as TensorBoard runs: `traindeck export tensorboard JOB… --dir DIR` and the job page's zip.

A job is the run `job-ID`, holding:
- every metric point it stored, under the metric's name as tag (`batch/train_loss`,
  `batch/lr`, `epoch/…`, `lr_find/…`, any other), at its step, with its wall time (a point
  stored without one takes the job's start);
- per epoch (step = epoch, counted from 0 as the metrics are) the XLA graphs compiled and the
  seconds spent compiling them, `xla/compiles` and `xla/compile_s`, as the Diagnostics tab
  counts them (`db.xla_epochs`), when the job ran on XLA;
- its spec as hyper-parameters (the HParams dashboard), the trial named `job-ID`.

The rows are read here, a page at a time so that memory stays flat however long the job;
the event files are written by `common.tb_events` (the tensorboard package, no TensorFlow).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from sqlalchemy import Engine, select, tuple_

from common.tb_events import Run, RunWriter, write_runs, zip_runs
from db.engine import read_tx
from db.models import Job, Metric
from db.queue import get_job
from db.telemetry import xla_reports
from db.xla_epochs import per_epoch

PAGE = 20_000
XLA_COMPILES = "xla/compiles"
XLA_COMPILE_S = "xla/compile_s"


def run_name(job_id: int) -> str:
    return f"job-{job_id}"


def _metric_rows(engine: Engine, job_id: int, page: int) -> Iterator[tuple[str, int, float, float]]:
    """(name, step, value, wall time) of every point of the job, by name then step, read `page`
    rows at a time along the (job_id, name, step) index."""
    after: tuple[str, int] | None = None
    while True:
        statement = select(Metric.name, Metric.step, Metric.value, Metric.wall_time).where(
            Metric.job_id == job_id
        )
        if after is not None:
            statement = statement.where(tuple_(Metric.name, Metric.step) > tuple_(*after))
        statement = statement.order_by(Metric.name, Metric.step).limit(page)
        with read_tx(engine) as connection:
            rows = [tuple(row) for row in connection.execute(statement)]
        yield from rows
        if len(rows) < page:
            return
        after = (rows[-1][0], rows[-1][1])


def _seconds(moment: datetime | None) -> float:
    return moment.timestamp() if moment is not None else 0.0


def _fill(engine: Engine, job: Job, writer: RunWriter) -> None:
    started = _seconds(job.started_at) or _seconds(job.created_at)
    rows = _metric_rows(engine, job.id, PAGE)
    for name, points in itertools.groupby(rows, key=lambda row: row[0]):
        writer.scalars(name, ((step, value, wall or started) for _, step, value, wall in points))
    reports = xla_reports(engine, job.id)
    if reports:
        times = {row.epoch: _seconds(row.created_at) for row in reports}
        epochs = per_epoch([(row.epoch, row.summary) for row in reports])
        writer.scalars(XLA_COMPILES, ((e.epoch, e.compiles, times[e.epoch]) for e in epochs))
        writer.scalars(XLA_COMPILE_S, ((e.epoch, e.compile_s, times[e.epoch]) for e in epochs))
    writer.hparams(job.spec, started, trial_id=run_name(job.id))


def tensorboard_runs(engine: Engine, job_ids: Sequence[int]) -> list[Run]:
    """The jobs as runs for `common.tb_events`; an unknown job is JobNotFound before any is
    read further."""
    jobs = [get_job(engine, job_id) for job_id in dict.fromkeys(job_ids)]
    return [(run_name(job.id), lambda writer, job=job: _fill(engine, job, writer)) for job in jobs]


def export_tensorboard(engine: Engine, job_ids: Sequence[int], folder: Path) -> list[Path]:
    """Write the jobs as runs under `folder` (`common.tb_events.write_runs`): their folders."""
    return write_runs(folder, tensorboard_runs(engine, job_ids))


def zip_tensorboard(engine: Engine, job_ids: Sequence[int], out: BinaryIO) -> None:
    """The jobs' runs as a zip written to `out`."""
    zip_runs(out, tensorboard_runs(engine, job_ids))

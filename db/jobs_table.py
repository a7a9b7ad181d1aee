"""The rows of the dashboard's jobs table: each job with its progress and latest metrics.

One query: the latest `batch/train_loss`, `epoch/valid_loss`, `epoch/accuracy` and
`epoch/input_wait_share` of each job are correlated subqueries, each one backward seek on the
(job_id, name, step) index, so the cost grows with the number of jobs shown, not with the
number of metric points.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, select

from db.engine import read_tx
from db.ids import one_of
from db.joblist import EVERY_JOB, Cursor, JobFilter, Order, count, fetch, job_number
from db.labels import tags_of
from db.models import Job, Metric
from db.telemetry import INPUT_WAIT_SHARE

LATEST_METRICS = {
    "train_loss": "batch/train_loss",
    "valid_loss": "epoch/valid_loss",
    "accuracy": "epoch/accuracy",
    "input_wait": INPUT_WAIT_SHARE,
}


@dataclass(frozen=True)
class JobRow:
    id: int
    name: str
    status: str
    spec: dict[str, Any]
    priority: int
    attempts: int
    max_attempts: int
    cancel_requested: bool
    worker_id: str | None
    device: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    epoch: int
    step: int
    total_epochs: int
    total_steps: int
    eta_seconds: float | None
    train_loss: float | None
    valid_loss: float | None
    accuracy: float | None
    input_wait: float | None = None  # the share of a step spent waiting for data, latest epoch
    note: str = ""
    tags: tuple[str, ...] = ()

    @property
    def progress(self) -> float:
        return progress_fraction(
            self.status, self.epoch, self.step, self.total_epochs, self.total_steps
        )


def progress_fraction(
    status: str, epoch: int, step: int, total_epochs: int, total_steps: int
) -> float:
    """How far a job is, 0..1: by steps when the worker knows their total, else by epochs."""
    if status == "succeeded":
        return 1.0
    if total_steps > 0:
        return min(1.0, step / total_steps)
    if total_epochs > 0:
        return min(1.0, epoch / total_epochs)
    return 0.0


def _latest(name: str) -> Any:
    return (
        select(Metric.value)
        .where(Metric.job_id == Job.id, Metric.name == name)
        .order_by(Metric.step.desc())
        .limit(1)
        .scalar_subquery()
    )


_COLUMNS = (
    Job.id,
    Job.name,
    Job.status,
    Job.spec,
    Job.priority,
    Job.attempts,
    Job.max_attempts,
    Job.cancel_requested,
    Job.worker_id,
    Job.device,
    Job.created_at,
    Job.started_at,
    Job.finished_at,
    Job.epoch,
    Job.step,
    Job.total_epochs,
    Job.total_steps,
    Job.eta_seconds,
    Job.note,
)


def _columns() -> list[Any]:
    return [
        *_COLUMNS,
        *(_latest(name).label(label) for label, name in LATEST_METRICS.items()),
    ]


def _job_rows(connection: Connection, rows: list[Any]) -> list[JobRow]:
    """JobRows of rows of `_columns()`, each with its tags."""
    tags = tags_of(connection, [row.id for row in rows])
    return [JobRow(**row._mapping, tags=tags.get(row.id, ())) for row in rows]


def job_rows(
    engine: Engine, statuses: list[str] | None = None, limit: int | None = 500
) -> list[JobRow]:
    """Jobs, newest first, optionally only those in `statuses`, at most `limit`."""
    statement = select(*_columns()).order_by(Job.id.desc())
    if statuses:
        statement = statement.where(Job.status.in_(statuses))
    if limit is not None:
        statement = statement.limit(limit)
    with read_tx(engine) as connection:
        return _job_rows(connection, connection.execute(statement).all())


@dataclass(frozen=True)
class JobPage:
    """One page of a list: its rows in the list's order, and whether rows come before the
    first (`earlier`) or after the last (`later`)."""

    rows: list[JobRow]
    earlier: bool
    later: bool

    @property
    def first(self) -> Cursor | None:
        return Cursor(self.rows[0].id, self.rows[0].priority) if self.rows else None

    @property
    def last(self) -> Cursor | None:
        return Cursor(self.rows[-1].id, self.rows[-1].priority) if self.rows else None


def job_page(
    engine: Engine,
    filters: JobFilter = EVERY_JOB,
    order: Order = "newest",
    *,
    after: Cursor | None = None,
    before: Cursor | None = None,
    to_end: bool = False,
    limit: int = 50,
) -> JobPage:
    """A page of jobs in `order`: the first one, the one after the cursor `after`, the one
    before the cursor `before`, or the last one (`to_end`). Each is a few index ranges
    (`db.joblist`), however many jobs there are."""
    backward = before is not None or to_end
    with read_tx(engine) as connection:
        rows = fetch(
            connection, _columns(), filters, order, before if backward else after, limit + 1,
            backward=backward,
        )  # fmt: skip
        beyond = len(rows) > limit
        rows = rows[:limit]
        if backward:
            rows.reverse()
            earlier = beyond
            later = bool(rows) and _any_beyond(connection, filters, order, rows[-1])
        else:
            later = beyond
            earlier = bool(rows) and _any_beyond(connection, filters, order, rows[0], back=True)
        page_rows = _job_rows(connection, rows)
    return JobPage(page_rows, earlier=earlier, later=later)


def _any_beyond(connection: Any, filters: JobFilter, order: Order, row: Any, back: bool = False):
    cursor = Cursor(row.id, row.priority)
    return bool(fetch(connection, (Job.id, Job.priority), filters, order, cursor, 1, backward=back))


def jobs_by_id(engine: Engine, job_ids: list[int]) -> list[JobRow]:
    """These jobs (those that exist), in the order given."""
    if not job_ids:
        return []
    with read_tx(engine) as connection:
        statement = select(*_columns()).where(one_of(connection, Job.id, job_ids))
        found = {row.id: row for row in _job_rows(connection, connection.execute(statement).all())}
    return [found[job_id] for job_id in dict.fromkeys(job_ids) if job_id in found]


def find_jobs(
    engine: Engine, text: str, limit: int = 50, filters: JobFilter = EVERY_JOB
) -> list[JobRow]:
    """Jobs for a picker: the job numbered `text` ("12" or "#12") first, then the newest that
    `filters` admit whose name or note holds `text` (any case); the newest when it is empty."""
    number = job_number(text)
    exact = jobs_by_id(engine, [number]) if number is not None else []
    rest = job_page(engine, replace(filters, search=text), limit=limit).rows
    return (exact + [row for row in rest if row.id != number])[:limit]


def count_jobs(engine: Engine, filters: JobFilter = EVERY_JOB, order: Order = "newest") -> int:
    with read_tx(engine) as connection:
        return count(connection, filters, order)

"""The rows of the dashboard's jobs table: each job with its progress and latest metrics.

One query: the latest `batch/train_loss`, `epoch/valid_loss` and `epoch/accuracy` of each job
are correlated subqueries, each one backward seek on the (job_id, name, step) index, so the
cost grows with the number of jobs shown, not with the number of metric points.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select

from db.engine import read_tx
from db.models import Job, Metric

LATEST_METRICS = {
    "train_loss": "batch/train_loss",
    "valid_loss": "epoch/valid_loss",
    "accuracy": "epoch/accuracy",
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


def job_rows(
    engine: Engine, statuses: list[str] | None = None, limit: int | None = 500
) -> list[JobRow]:
    """Jobs, newest first, optionally only those in `statuses`, at most `limit`."""
    statement = select(
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
        *(_latest(name).label(label) for label, name in LATEST_METRICS.items()),
    ).order_by(Job.id.desc())
    if statuses:
        statement = statement.where(Job.status.in_(statuses))
    if limit is not None:
        statement = statement.limit(limit)
    with read_tx(engine) as connection:
        return [JobRow(**row._mapping) for row in connection.execute(statement)]

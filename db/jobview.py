"""Jobs as plain dictionaries, for `--json` output and for anything that wants one object."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from db.artifacts import list_artifacts
from db.engine import read_tx
from db.joblist import EVERY_JOB, Cursor, JobFilter, Order, fetch
from db.labels import tags_of
from db.models import Job
from db.queue import get_job
from db.telemetry import final_metrics

BATCH = 500
_JOB_COLUMNS = tuple(Job.__table__.columns)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def job_to_dict(job: Any, tags: tuple[str, ...] = ()) -> dict[str, Any]:
    """A Job, or a row of the jobs table's columns, with its tags, as a dictionary."""
    return {
        "id": job.id,
        "name": job.name,
        "tags": list(tags),
        "note": job.note,
        "status": job.status,
        "priority": job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "cancel_requested": job.cancel_requested,
        "worker_id": job.worker_id,
        "device": job.device,
        "error": job.error,
        "spec": job.spec,
        "progress": {
            "epoch": job.epoch,
            "step": job.step,
            "total_epochs": job.total_epochs,
            "total_steps": job.total_steps,
            "eta_seconds": job.eta_seconds,
        },
        "created_at": _iso(job.created_at),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
        "heartbeat_at": _iso(job.heartbeat_at),
        "cloned_from": job.cloned_from,
    }


def describe_job(engine: Engine, job_id: int) -> dict[str, Any]:
    """One job with its final metrics and artifacts (what `python -m db show --json` prints)."""
    job = get_job(engine, job_id)
    with read_tx(engine) as connection:
        tags = tags_of(connection, [job_id]).get(job_id, ())
    described = job_to_dict(job, tags)
    described["final_metrics"] = final_metrics(engine, [job_id])[job_id]
    described["artifacts"] = [
        {"kind": a.kind, "path": a.path, "bytes": a.bytes, "sha256": a.sha256}
        for a in list_artifacts(engine, job_id)
    ]
    return described


def iter_jobs(
    engine: Engine,
    filters: JobFilter = EVERY_JOB,
    *,
    order: Order = "newest",
    after: Cursor | None = None,
    limit: int | None = None,
    batch: int = BATCH,
) -> Iterator[dict[str, Any]]:
    """Jobs as dictionaries with their final metrics, in `order` from `after` on, at most
    `limit` (None: all of them). Read `batch` jobs at a time, each batch a keyset page
    (`db.joblist`), so that memory stays flat however many jobs there are."""
    while limit is None or limit > 0:
        size = batch if limit is None else min(batch, limit)
        with read_tx(engine) as connection:
            rows = fetch(connection, _JOB_COLUMNS, filters, order, after, size)
            tags = tags_of(connection, [row.id for row in rows])
        if not rows:
            return
        finals = final_metrics(engine, [row.id for row in rows])
        for row in rows:
            item = job_to_dict(row, tags.get(row.id, ()))
            item["final_metrics"] = finals[row.id]
            yield item
        if len(rows) < size:
            return
        after = Cursor(rows[-1].id, rows[-1].priority)
        if limit is not None:
            limit -= len(rows)


def describe_jobs(
    engine: Engine, statuses: list[str] | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """Jobs, newest first, optionally only those in `statuses`, as a list (see `iter_jobs`)."""
    return list(iter_jobs(engine, JobFilter(tuple(statuses or ())), limit=limit))

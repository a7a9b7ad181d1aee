"""Jobs as plain dictionaries, for `--json` output and for anything that wants one object."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from db.artifacts import list_artifacts
from db.models import Job
from db.queue import get_job, list_jobs
from db.telemetry import final_metrics


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def job_to_dict(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
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
    described = job_to_dict(job)
    described["final_metrics"] = final_metrics(engine, [job_id])[job_id]
    described["artifacts"] = [
        {"kind": a.kind, "path": a.path, "bytes": a.bytes, "sha256": a.sha256}
        for a in list_artifacts(engine, job_id)
    ]
    return described


def describe_jobs(
    engine: Engine, statuses: list[str] | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    jobs = list_jobs(engine, statuses, limit)
    finals = final_metrics(engine, [job.id for job in jobs])
    described = []
    for job in jobs:
        item = job_to_dict(job)
        item["final_metrics"] = finals[job.id]
        described.append(item)
    return described

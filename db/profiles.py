"""Profile captures: a person asks for the next N training steps of a running job to be
recorded with a profiler (the job page, `traindeck profile JOB --steps N`); the job's process
takes the request between two batches, records the steps (`worker.profiling`) and stores the
trace as the job's `profile` artifact.

A job has at most one capture open (requested or recording) at a time. Taking a request is a
conditional UPDATE (requested → recording), so it is taken once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, insert, select, update

from db.engine import read_tx, write_tx
from db.models import Job, ProfileCapture, utcnow
from db.queue import JobNotFound, JobStateError

MAX_PROFILE_STEPS = 1000
OPEN = ("requested", "recording")


@dataclass(frozen=True)
class Capture:
    id: int
    job_id: int
    steps: int
    status: str
    requested_at: datetime
    finished_at: datetime | None
    first_step: int | None
    last_step: int | None
    tool: str
    message: str


def _capture(row: Any) -> Capture:
    return Capture(
        row.id, row.job_id, row.steps, row.status, row.requested_at, row.finished_at,
        row.first_step, row.last_step, row.tool, row.message,
    )  # fmt: skip


_COLUMNS = tuple(ProfileCapture.__table__.columns)


def request_profile(engine: Engine, job_id: int, steps: int) -> int:
    """Ask the running job `job_id` to record its next `steps` training steps; the capture's
    id. JobNotFound, or JobStateError saying why not (not running, a capture already open)."""
    if not 1 <= steps <= MAX_PROFILE_STEPS:
        raise JobStateError(f"a profile records 1 to {MAX_PROFILE_STEPS} steps, not {steps}")
    with write_tx(engine) as connection:
        status = connection.execute(select(Job.status).where(Job.id == job_id)).scalar()
        if status is None:
            raise JobNotFound(job_id)
        if status != "running":
            raise JobStateError(
                f"job {job_id} is {status}: a profile records the steps of a running job"
            )
        open_one = connection.execute(
            select(ProfileCapture.id, ProfileCapture.status, ProfileCapture.steps).where(
                ProfileCapture.job_id == job_id, ProfileCapture.status.in_(OPEN)
            )
        ).first()
        if open_one is not None:
            raise JobStateError(
                f"job {job_id} already has a capture of {open_one.steps} steps "
                f"{open_one.status} (#{open_one.id}); ask again when it is done"
            )
        return connection.execute(
            insert(ProfileCapture)
            .values(job_id=job_id, steps=steps, status="requested", requested_at=utcnow())
            .returning(ProfileCapture.id)
        ).scalar_one()


def take_request(engine: Engine, job_id: int) -> Capture | None:
    """The job's requested capture, now marked recording; None when there is none."""
    with write_tx(engine) as connection:
        row = connection.execute(
            select(*_COLUMNS)
            .where(ProfileCapture.job_id == job_id, ProfileCapture.status == "requested")
            .order_by(ProfileCapture.id)
            .limit(1)
        ).first()
        if row is None:
            return None
        taken = connection.execute(
            update(ProfileCapture)
            .where(ProfileCapture.id == row.id, ProfileCapture.status == "requested")
            .values(status="recording")
        ).rowcount
    if not taken:
        return None
    return replace(_capture(row), status="recording")


def finish_capture(
    engine: Engine,
    capture_id: int,
    status: str,
    message: str,
    *,
    first_step: int | None = None,
    last_step: int | None = None,
    tool: str = "",
) -> None:
    """Record what became of a capture: `stored` or `failed`, with a sentence."""
    with write_tx(engine) as connection:
        connection.execute(
            update(ProfileCapture)
            .where(ProfileCapture.id == capture_id)
            .values(
                status=status,
                message=message,
                first_step=first_step,
                last_step=last_step,
                tool=tool,
                finished_at=utcnow(),
            )
        )


def fail_open_captures(engine: Engine, job_id: int, message: str) -> int:
    """End the job's open captures as failed (the job ended before recording them)."""
    with write_tx(engine) as connection:
        return connection.execute(
            update(ProfileCapture)
            .where(ProfileCapture.job_id == job_id, ProfileCapture.status.in_(OPEN))
            .values(status="failed", message=message, finished_at=utcnow())
        ).rowcount


def fail_orphaned_recordings(engine: Engine, job_id: int) -> int:
    """End as failed the job's captures marked recording by a process of it that is gone (a
    killed or preempted attempt): a job has one process at a time, so a new one calls this
    before it takes any request."""
    with write_tx(engine) as connection:
        return connection.execute(
            update(ProfileCapture)
            .where(ProfileCapture.job_id == job_id, ProfileCapture.status == "recording")
            .values(
                status="failed",
                message="not stored: the job's process that was recording it ended",
                finished_at=utcnow(),
            )
        ).rowcount


def captures(engine: Engine, job_id: int, limit: int = 20) -> list[Capture]:
    """The job's newest captures, newest first."""
    with read_tx(engine) as connection:
        rows = connection.execute(
            select(*_COLUMNS)
            .where(ProfileCapture.job_id == job_id)
            .order_by(ProfileCapture.id.desc())
            .limit(limit)
        ).all()
    return [_capture(row) for row in rows]

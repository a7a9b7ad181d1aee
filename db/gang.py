"""The hosts of a multi-host job's attempt: who joined, who is ready, who beats, who trains.

A job whose spec says `hosts` N > 1 runs on every host of one TPU pod slice at once. The worker
on the slice's host 0 claims it (`db.queue.claim` with its slice), which seats host 0 in the
attempt; the workers on the slice's other hosts `join` that attempt. Each host's job process
marks itself `ready` at the start barrier and waits until every host's is (`ready_hosts`):
nobody trains before. Each host's supervisor `beat`s its row, and its job process records each
step it trains (`record_progress`), so that a host whose worker went away, or whose process
hangs while its worker still beats, shows. A host whose process ended says why (`leave`);
host 0 says it in the transaction that ends the attempt (`Departure`).

Host 0's supervisor reads the rows (`members`), judges the gang (`worker.gang`), and ends the
attempt through `db.queue` (requeued, released or failed, the reason in the job's log); the
other hosts learn from their `beat` that the job's lease moved on, and kill their processes.

Each state change is one statement. Rows are keyed by (job, the attempt's lease, host), so a
row of an old attempt never counts for a new one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, exists, func, insert, literal, select, update
from sqlalchemy.exc import IntegrityError

from db.engine import read_tx, write_tx
from db.models import HOST_STATES, Job, JobEvent, JobHost, UTCDateTime, utcnow
from db.queue import ClaimedJob, Lease

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Seat:
    """A host's place in one attempt of a multi-host job."""

    job_id: int
    lease: int
    host: int


@dataclass(frozen=True)
class HostRow:
    host: int
    worker_id: str
    state: str
    joined_at: datetime
    heartbeat_at: datetime
    ready_at: datetime | None
    progress_at: datetime | None
    step: int
    reason: str | None


@dataclass(frozen=True)
class AttemptState:
    """What a host's heartbeat learns of the attempt it sits in."""

    seated: bool  # its row is still `joined`
    status: str | None  # the job's status now (None: the job is gone)
    lease: int | None  # the job's lease now
    cancel_requested: bool

    def current(self, seat: Seat) -> bool:
        """Whether the attempt goes on, with this host in it."""
        return self.seated and self.status == "running" and self.lease == seat.lease


def _seat(seat: Seat) -> Any:
    return (
        (JobHost.job_id == seat.job_id)
        & (JobHost.lease == seat.lease)
        & (JobHost.host == seat.host)
    )


def _event(job_id: int, level: str, message: str) -> Any:
    return insert(JobEvent).values(job_id=job_id, time=utcnow(), level=level, message=message)


def add_host_zero(job_id: int, lease: int, worker_id: str) -> Any:
    """The statement that seats host 0 in the attempt it just claimed (db.queue.claim runs it
    in the claim's transaction)."""
    now = utcnow()
    return insert(JobHost).values(
        job_id=job_id,
        lease=lease,
        host=0,
        worker_id=worker_id,
        state="joined",
        joined_at=now,
        heartbeat_at=now,
        step=0,
    )


def join(
    engine: Engine, worker_id: str, slice_name: str, hosts: int, host: int
) -> ClaimedJob | None:
    """Seat host `host` (≥ 1) of slice `slice_name` in the attempt its host 0 claimed, or None
    when there is none to join (or this host already sits in it). One INSERT … SELECT: two
    workers that both think they are this host cannot both sit."""
    if host < 1 or host >= hosts:
        raise ValueError(
            f"host {host}: the other hosts of a slice of {hosts} join (1 to {hosts - 1})"
        )
    now = literal(utcnow(), UTCDateTime())
    taken = exists().where(
        JobHost.job_id == Job.id, JobHost.lease == Job.lease, JobHost.host == host
    )
    attempt = (
        select(
            Job.id,
            Job.lease,
            literal(host),
            literal(worker_id),
            literal("joined"),
            now,
            now,
            literal(0),
        )
        .where(
            Job.status == "running",
            Job.slice_name == slice_name,
            Job.hosts == hosts,
            ~taken,
        )
        .order_by(Job.id)
        .limit(1)
    )
    columns = [
        JobHost.job_id,
        JobHost.lease,
        JobHost.host,
        JobHost.worker_id,
        JobHost.state,
        JobHost.joined_at,
        JobHost.heartbeat_at,
        JobHost.step,
    ]
    statement = (
        insert(JobHost).from_select(columns, attempt).returning(JobHost.job_id, JobHost.lease)
    )
    try:
        with write_tx(engine) as connection:
            row = connection.execute(statement).one_or_none()
            if row is None:
                return None
            job = connection.execute(
                select(Job.name, Job.spec, Job.attempts, Job.max_attempts).where(
                    Job.id == row.job_id
                )
            ).one()
            connection.execute(
                _event(
                    row.job_id,
                    "info",
                    f"host {host} of slice {slice_name} joined attempt {job.attempts} "
                    f"(worker {worker_id})",
                )
            )
    except IntegrityError:
        log.warning("another worker took host %d of slice %s's seat first", host, slice_name)
        return None
    return ClaimedJob(
        lease=Lease(row.job_id, worker_id, row.lease),
        name=job.name,
        spec=job.spec,
        attempts=job.attempts,
        max_attempts=job.max_attempts,
    )


def beat(engine: Engine, seat: Seat) -> AttemptState:
    """Mark the host alive in its attempt; tells whether the attempt goes on."""
    with write_tx(engine) as connection:
        seated = connection.execute(
            update(JobHost)
            .where(_seat(seat) & (JobHost.state == "joined"))
            .values(heartbeat_at=utcnow())
        ).rowcount
        job = connection.execute(
            select(Job.status, Job.lease, Job.cancel_requested).where(Job.id == seat.job_id)
        ).one_or_none()
    if job is None:
        return AttemptState(bool(seated), None, None, False)
    return AttemptState(bool(seated), job.status, job.lease, bool(job.cancel_requested))


def mark_ready(engine: Engine, seat: Seat) -> bool:
    """The host's job process is at the start barrier. False when it no longer sits there."""
    now = utcnow()
    with write_tx(engine) as connection:
        return (
            connection.execute(
                update(JobHost)
                .where(_seat(seat) & (JobHost.state == "joined") & JobHost.ready_at.is_(None))
                .values(ready_at=now, progress_at=now)
            ).rowcount
            == 1
        )


def ready_hosts(engine: Engine, job_id: int, lease: int) -> int:
    """How many hosts of the attempt have their job process at the start barrier."""
    with read_tx(engine) as connection:
        return connection.execute(
            select(func.count()).where(
                JobHost.job_id == job_id,
                JobHost.lease == lease,
                JobHost.state == "joined",
                JobHost.ready_at.is_not(None),
            )
        ).scalar_one()


def record_progress(engine: Engine, seat: Seat, step: int) -> bool:
    """The host's process has trained up to `step`: the watchdog's clock restarts when the
    step moves on (and only then: a process that flushes without training makes no progress)."""
    with write_tx(engine) as connection:
        return (
            connection.execute(
                update(JobHost)
                .where(_seat(seat) & (JobHost.state == "joined") & (JobHost.step < step))
                .values(step=step, progress_at=utcnow())
            ).rowcount
            == 1
        )


def _check_leaving(state: str) -> None:
    if state not in HOST_STATES or state == "joined":
        raise ValueError(f"a host leaves as one of {HOST_STATES[1:]}, not {state!r}")


def _leaving(seat: Seat, state: str, reason: str | None) -> Any:
    return (
        update(JobHost)
        .where(_seat(seat) & (JobHost.state == "joined"))
        .values(state=state, reason=reason)
    )


@dataclass(frozen=True)
class Departure:
    """How host 0 leaves its seat when its worker ends the attempt through the job's status
    (db.queue runs `host_zero_leaves` in that change's transaction: the job page never shows
    a finished job whose host 0 still sits in the attempt). The states are `leave`'s."""

    state: str
    reason: str | None = None

    def __post_init__(self) -> None:
        _check_leaving(self.state)


def host_zero_leaves(lease: Lease, departure: Departure) -> Any:
    """The statement that ends host 0's seat in the attempt `lease` holds (a single-host job's
    attempt has no seat: it touches nothing)."""
    return _leaving(Seat(lease.job_id, lease.lease, 0), departure.state, departure.reason)


def leave(engine: Engine, seat: Seat, state: str, reason: str | None = None) -> bool:
    """The host's job process ended: `done`, `failed` (its error in `reason`), `died` or
    `left` (see db.models.HOST_STATES). False when it had already left. (Host 0 leaves with
    the job's own change: `Departure`.)"""
    _check_leaving(state)
    with write_tx(engine) as connection:
        changed = connection.execute(_leaving(seat, state, reason)).rowcount
        if changed and state != "done":
            level = "warning" if state == "left" else "error"
            message = f"host {seat.host} left the attempt ({state})" + (
                f": {reason.strip().splitlines()[-1]}" if reason and reason.strip() else ""
            )
            connection.execute(_event(seat.job_id, level, message))
    return bool(changed)


def members(engine: Engine, job_id: int, lease: int) -> list[HostRow]:
    """The hosts of one attempt, by host number."""
    with read_tx(engine) as connection:
        rows = connection.execute(
            select(
                JobHost.host,
                JobHost.worker_id,
                JobHost.state,
                JobHost.joined_at,
                JobHost.heartbeat_at,
                JobHost.ready_at,
                JobHost.progress_at,
                JobHost.step,
                JobHost.reason,
            )
            .where(JobHost.job_id == job_id, JobHost.lease == lease)
            .order_by(JobHost.host)
        ).all()
    return [HostRow(*row) for row in rows]

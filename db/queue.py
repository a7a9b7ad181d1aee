"""The job queue: every state change of a job, each one SQL statement, all of them here.

A job's life: `queued` → (claim) → `running` → `succeeded` | `failed` | `cancelled` |
`pruned` (a sweep's trial its pruner stopped, db.sweeps), or back to `queued` when its worker
stops gracefully or is declared stale. Each claim bumps the job's `lease`; a worker passes
its `Lease` to every later change, and a change whose lease is no longer current touches
nothing, so a worker that lost its claim cannot overwrite the job.
"""

from __future__ import annotations

import contextlib
import logging
import select as select_module
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, delete, func, insert, select, text, update
from sqlalchemy.orm import Session

from db import alerts
from db.engine import is_sqlite, read_tx, write_tx
from db.models import FINISHED_STATUSES, Job, JobEvent, utcnow
from db.spec import JobSpec, SpecError, batch_size_problem, parse_spec

if TYPE_CHECKING:
    from db.gang import Departure

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "traindeck_jobs"
MAX_ERROR_CHARS = 20_000


class JobNotFound(LookupError):
    def __init__(self, job_id: int):
        super().__init__(f"no job with id {job_id}")
        self.job_id = job_id


class JobStateError(ValueError):
    """The job is in a state where the asked change makes no sense."""


@dataclass(frozen=True)
class Lease:
    """Proof that a worker holds a job: the job id, the worker, and the claim number."""

    job_id: int
    worker_id: str
    lease: int


@dataclass(frozen=True)
class ClaimedJob:
    lease: Lease
    name: str
    spec: dict[str, Any]
    attempts: int
    max_attempts: int

    @property
    def id(self) -> int:
        return self.lease.job_id


@dataclass(frozen=True)
class HeartbeatReply:
    """What the queue tells a worker at each heartbeat."""

    still_owned: bool
    cancel_requested: bool


def _session(connection) -> Session:
    return Session(bind=connection, expire_on_commit=False)


def _owned(lease: Lease):
    return (
        (Job.id == lease.job_id)
        & (Job.worker_id == lease.worker_id)
        & (Job.lease == lease.lease)
        & (Job.status == "running")
    )


def _event(job_id: int, level: str, message: str) -> Any:
    return insert(JobEvent).values(job_id=job_id, time=utcnow(), level=level, message=message)


def _host_zero_leaves(connection: Any, lease: Lease, departure: Departure | None) -> None:
    """A multi-host job's host 0 leaves its seat (db.gang) in the transaction that ends its
    attempt, first: its process ended, whether or not the lease was still held."""
    if departure is not None:
        from db.gang import host_zero_leaves

        connection.execute(host_zero_leaves(lease, departure))


# --- submit ---------------------------------------------------------------------------------


def known_dataset_names(engine: Engine) -> set[str]:
    """Names a spec may use: every registered dataset, plus the built-in ones."""
    from db.datasets import BUILTIN_DATASETS, dataset_names

    return dataset_names(engine) | set(BUILTIN_DATASETS)


def submit(
    engine: Engine, data: dict[str, Any] | JobSpec, *, cloned_from: int | None = None
) -> int:
    """Validate `data` as a job spec (raising `SpecError`) and queue it. Returns the job id."""
    spec = parse_spec(data, known_dataset_names(engine))
    refuse_batch_larger_than_dataset(engine, spec)
    return enqueue(engine, spec, cloned_from=cloned_from)


def refuse_batch_larger_than_dataset(engine: Engine, spec: JobSpec) -> None:
    """SpecError when the registry shows the batch cannot be filled, which the worker would
    otherwise find only once the job runs."""
    from db.datasets import get_dataset, training_images_of

    count = training_images_of(get_dataset(engine, spec.dataset), spec.valid_pct)
    problem = batch_size_problem(spec.bs, count, spec.dataset)
    if problem:
        raise SpecError({"bs": problem})


def enqueue(engine: Engine, spec: JobSpec, *, cloned_from: int | None = None) -> int:
    """Insert an already validated spec as a queued job; wakes idle Postgres workers."""
    with write_tx(engine) as connection:
        return insert_job(connection, spec, cloned_from=cloned_from)


def insert_job(connection: Any, spec: JobSpec, **columns: Any) -> int:
    """Insert a validated spec as a queued job in the caller's transaction, its tags and note
    in their own places (`db.labels`), with `columns` (cloned_from; a sweep's trial: sweep_id,
    trial_number); wakes idle Postgres workers when the transaction commits."""
    from db.labels import insert_tags

    job_id = connection.execute(
        insert(Job)
        .values(
            name=spec.display_name,
            spec=spec.stored(),
            note=spec.note,
            status="queued",
            priority=spec.priority,
            max_attempts=spec.max_attempts,
            total_epochs=spec.epochs,
            hosts=spec.hosts,
            created_at=utcnow(),
            **columns,
        )
        .returning(Job.id)
    ).scalar_one()
    insert_tags(connection, job_id, spec.tags)
    if not is_sqlite(connection):
        connection.execute(text("SELECT pg_notify(:channel, '')"), {"channel": NOTIFY_CHANNEL})
    return job_id


# --- claim and run --------------------------------------------------------------------------


def claim(
    engine: Engine, worker_id: str, *, slice_name: str | None = None, hosts: int = 1
) -> ClaimedJob | None:
    """Atomically take the highest-priority, oldest queued job, or None when there is none.

    A worker takes the jobs that run on as many hosts as it has: a single-host worker those of
    one host; the worker on host 0 of the multi-host slice `slice_name` those of its `hosts`,
    recording itself as the attempt's host 0 (the other hosts join it: db.gang).

    Postgres: the candidate row is locked with `FOR UPDATE SKIP LOCKED` in a CTE, so racing
    workers each take a different row without waiting. SQLite: the transaction is `BEGIN
    IMMEDIATE` (one writer at a time) and the UPDATE re-checks `status = 'queued'`. Either way
    the candidate is the first entry of `ix_jobs_claim` (status, priority DESC, id), which is
    in the claim's order: a claim costs the same with 200 queued jobs as with 70,000.
    """
    now = utcnow()
    if (hosts > 1) != (slice_name is not None):
        raise ValueError("a slice's worker names its slice and its hosts; others neither")
    candidate = (
        select(Job.id)
        .where(Job.status == "queued", Job.hosts == hosts)
        .order_by(Job.priority.desc(), Job.id)
        .limit(1)
    )
    changes = {
        "status": "running",
        "slice_name": slice_name,
        "worker_id": worker_id,
        "attempts": Job.attempts + 1,
        "lease": Job.lease + 1,
        "started_at": now,
        "heartbeat_at": now,
        "finished_at": None,
        "error": None,
    }
    returning = (Job.id, Job.lease, Job.name, Job.spec, Job.attempts, Job.max_attempts)
    with write_tx(engine) as connection:
        if is_sqlite(connection):
            statement = (
                update(Job)
                .where(Job.id == candidate.scalar_subquery(), Job.status == "queued")
                .values(**changes)
                .returning(*returning)
            )
        else:
            next_job = candidate.with_for_update(skip_locked=True).cte("next_job")
            statement = (
                update(Job).where(Job.id == next_job.c.id).values(**changes).returning(*returning)
            )
        row = connection.execute(statement).one_or_none()
        if row is None:
            return None
        where = ""
        if slice_name is not None:
            from db.gang import add_host_zero

            connection.execute(add_host_zero(row.id, row.lease, worker_id))
            where = f" as host 0 of the {hosts} hosts of slice {slice_name}"
        connection.execute(
            _event(row.id, "info", f"claimed by worker {worker_id}{where} (attempt {row.attempts})")
        )
    return ClaimedJob(
        lease=Lease(row.id, worker_id, row.lease),
        name=row.name,
        spec=row.spec,
        attempts=row.attempts,
        max_attempts=row.max_attempts,
    )


def heartbeat(engine: Engine, lease: Lease) -> HeartbeatReply:
    """Mark the job alive; tells whether the worker still holds it and whether to cancel."""
    with write_tx(engine) as connection:
        row = connection.execute(
            update(Job)
            .where(_owned(lease))
            .values(heartbeat_at=utcnow())
            .returning(Job.cancel_requested)
        ).one_or_none()
    if row is None:
        return HeartbeatReply(still_owned=False, cancel_requested=False)
    return HeartbeatReply(still_owned=True, cancel_requested=bool(row.cancel_requested))


def set_progress(
    engine: Engine,
    lease: Lease,
    *,
    epoch: int,
    step: int,
    total_epochs: int,
    total_steps: int,
    eta_seconds: float | None,
    device: str | None = None,
) -> bool:
    """Record how far the job is. False when the lease is no longer held."""
    values: dict[str, Any] = {
        "epoch": epoch,
        "step": step,
        "total_epochs": total_epochs,
        "total_steps": total_steps,
        "eta_seconds": eta_seconds,
    }
    if device is not None:
        values["device"] = device
    with write_tx(engine) as connection:
        result = connection.execute(update(Job).where(_owned(lease)).values(**values))
    return result.rowcount == 1


def finish(
    engine: Engine,
    lease: Lease,
    status: str,
    error: str | None = None,
    *,
    host_zero: Departure | None = None,
) -> bool:
    """End a running job as succeeded, failed, cancelled or (a sweep's trial) pruned, and a
    multi-host job's host 0 leaves as `host_zero` says. False when the lease was lost."""
    if status not in FINISHED_STATUSES:
        raise ValueError(f"a job finishes as one of {FINISHED_STATUSES}, not {status!r}")
    if error is not None and len(error) > MAX_ERROR_CHARS:
        error = "…" + error[-MAX_ERROR_CHARS:]
    message = f"finished: {status}" + (f" — {error.strip().splitlines()[-1]}" if error else "")
    with write_tx(engine) as connection:
        _host_zero_leaves(connection, lease, host_zero)
        result = connection.execute(
            update(Job)
            .where(_owned(lease))
            .values(status=status, error=error, finished_at=utcnow(), eta_seconds=None)
        )
        if result.rowcount != 1:
            return False
        connection.execute(_event(lease.job_id, "error" if status == "failed" else "info", message))
        alerts.record_finish(connection, lease.job_id, lease.lease, status, error)
    return True


def release(
    engine: Engine, lease: Lease, reason: str, *, host_zero: Departure | None = None
) -> bool:
    """Give a running job back to the queue without spending an attempt (graceful shutdown);
    a multi-host job's host 0 leaves as `host_zero` says."""
    with write_tx(engine) as connection:
        _host_zero_leaves(connection, lease, host_zero)
        result = connection.execute(
            update(Job)
            .where(_owned(lease))
            .values(
                status="queued",
                worker_id=None,
                heartbeat_at=None,
                attempts=Job.attempts - 1,
                eta_seconds=None,
            )
        )
        if result.rowcount != 1:
            return False
        connection.execute(_event(lease.job_id, "warning", f"requeued: {reason}"))
    return True


def requeue_after_crash(
    engine: Engine, lease: Lease, reason: str, *, host_zero: Departure | None = None
) -> str | None:
    """Back to the queue after the job's process died (the attempt counts), or failed when
    its attempts are used up; a multi-host job's host 0 leaves as `host_zero` says. Returns
    the new status, or None when the lease was lost."""
    now = utcnow()
    with write_tx(engine) as connection:
        _host_zero_leaves(connection, lease, host_zero)
        requeued = connection.execute(
            update(Job)
            .where(_owned(lease) & (Job.attempts < Job.max_attempts))
            .values(status="queued", worker_id=None, heartbeat_at=None, eta_seconds=None)
        ).rowcount
        if requeued:
            connection.execute(_event(lease.job_id, "warning", f"requeued: {reason}"))
            return "queued"
        failed = connection.execute(
            update(Job)
            .where(_owned(lease))
            .values(
                status="failed",
                finished_at=now,
                eta_seconds=None,
                error=f"{reason}, and all its attempts are used",
            )
        ).rowcount
        if failed:
            connection.execute(_event(lease.job_id, "error", f"failed: {reason}"))
            alerts.record_finish(connection, lease.job_id, lease.lease, "failed", reason)
            return "failed"
    return None


def requeue_stale(engine: Engine, timeout_s: float) -> list[tuple[int, str]]:
    """Recover running jobs whose heartbeat is older than `timeout_s`.

    Each goes back to `queued` while it has attempts left, else to `failed`; one whose
    cancel was requested becomes `cancelled`. Returns (job id, new status) pairs.
    """
    now = utcnow()
    stale = (Job.status == "running") & (Job.heartbeat_at < now - timedelta(seconds=timeout_s))
    return _recover(engine, stale, f"its worker sent no heartbeat for {timeout_s:g} s")


def _recover(engine: Engine, lost: Any, reason: str) -> list[tuple[int, str]]:
    """Take the running jobs matching `lost` away from their worker: cancelled when a cancel
    was asked for, failed when their attempts are used, else back to the queue. Each change
    is one statement, and each job gets a log line naming `reason`."""
    now = utcnow()
    outcomes: list[tuple[int, str]] = []
    with write_tx(engine) as connection:
        cancelled = connection.execute(
            update(Job)
            .where(lost & Job.cancel_requested)
            .values(status="cancelled", finished_at=now, error=f"cancelled; {reason}")
            .returning(Job.id)
        ).scalars()
        outcomes += [(job_id, "cancelled") for job_id in cancelled]
        failed = connection.execute(
            update(Job)
            .where(lost & (Job.attempts >= Job.max_attempts))
            .values(
                status="failed",
                finished_at=now,
                error=f"{reason}, and all its attempts are used",
            )
            .returning(Job.id)
        ).scalars()
        outcomes += [(job_id, "failed") for job_id in failed]
        requeued = connection.execute(
            update(Job)
            .where(lost)
            .values(status="queued", worker_id=None, heartbeat_at=None, eta_seconds=None)
            .returning(Job.id)
        ).scalars()
        outcomes += [(job_id, "queued") for job_id in requeued]
        for job_id, status in outcomes:
            verb = "requeued" if status == "queued" else status
            level = "error" if status == "failed" else "warning"
            connection.execute(_event(job_id, level, f"{verb}: {reason}"))
            alerts.record_worker_lost(connection, job_id, status, reason)
    return outcomes


# --- what a person does ---------------------------------------------------------------------


def cancel(engine: Engine, job_id: int) -> str:
    """Cancel a job: a queued one at once, a running one at its next batch. Returns its status."""
    with write_tx(engine) as connection:
        now = utcnow()
        cancelled = connection.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "queued")
            .values(status="cancelled", finished_at=now, error="cancelled before it started")
        ).rowcount
        if cancelled:
            connection.execute(_event(job_id, "info", "cancelled while queued"))
            return "cancelled"
        requested = connection.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "running")
            .values(cancel_requested=True)
        ).rowcount
        if requested:
            connection.execute(_event(job_id, "info", "cancel requested"))
            return "cancelling"
        status = connection.execute(select(Job.status).where(Job.id == job_id)).scalar()
    if status is None:
        raise JobNotFound(job_id)
    raise JobStateError(f"job {job_id} is already {status}")


def retry(engine: Engine, job_id: int) -> int:
    """Queue a finished job again, as a new job with the same spec. Returns the new id."""
    job = get_job(engine, job_id)
    if job.status not in FINISHED_STATUSES:
        raise JobStateError(f"job {job_id} is {job.status}; only a finished job can be retried")
    return clone(engine, job_id)


def clone(engine: Engine, job_id: int, changes: dict[str, Any] | None = None) -> int:
    """A new queued job with the spec, tags and note of `job_id`, with `changes` applied
    (validated)."""
    from db.labels import job_labels

    job = get_job(engine, job_id)
    labels = job_labels(engine, job_id).model_dump()
    return submit(engine, {**job.spec, **labels, **(changes or {})}, cloned_from=job_id)


def delete_job(engine: Engine, job_id: int) -> None:
    """Delete a finished job and all its rows. (Its files are the caller's: `common.files`.)"""
    with write_tx(engine) as connection:
        deleted = connection.execute(
            delete(Job).where(Job.id == job_id, Job.status.in_(FINISHED_STATUSES))
        ).rowcount
        if deleted:
            return
        status = connection.execute(select(Job.status).where(Job.id == job_id)).scalar()
    if status is None:
        raise JobNotFound(job_id)
    raise JobStateError(f"job {job_id} is {status}; cancel it and wait until it has stopped")


# --- reading --------------------------------------------------------------------------------


def get_job(engine: Engine, job_id: int) -> Job:
    with read_tx(engine) as connection, _session(connection) as session:
        job = session.get(Job, job_id)
    if job is None:
        raise JobNotFound(job_id)
    return job


def list_jobs(
    engine: Engine, statuses: list[str] | None = None, limit: int | None = None
) -> list[Job]:
    """Jobs, newest first, optionally only those in `statuses`."""
    statement = select(Job).order_by(Job.id.desc())
    if statuses:
        statement = statement.where(Job.status.in_(statuses))
    if limit is not None:
        statement = statement.limit(limit)
    with read_tx(engine) as connection, _session(connection) as session:
        return list(session.scalars(statement))


def count_by_status(engine: Engine) -> dict[str, int]:
    with read_tx(engine) as connection:
        rows = connection.execute(select(Job.status, func.count()).group_by(Job.status))
        return {status: count for status, count in rows}


# --- waiting for work -----------------------------------------------------------------------


class JobSignal:
    """Lets an idle worker sleep until a job may be there.

    On Postgres it LISTENs on the channel `enqueue` notifies, so a submit wakes the worker
    at once; on SQLite (or if listening fails) it simply sleeps the poll interval.
    """

    def __init__(self, engine: Engine):
        self._engine = engine
        self._connection: Any = None

    def wait(self, timeout_s: float) -> None:
        if is_sqlite(self._engine):
            time.sleep(timeout_s)
            return
        try:
            connection = self._listen()
            ready, _, _ = select_module.select([connection.fileno()], [], [], timeout_s)
            if ready:
                for _ in connection.notifies(timeout=0, stop_after=1):
                    pass
                # Drain the rest so that a burst of submits wakes the worker only once.
                for _ in connection.notifies(timeout=0):
                    pass
        except Exception as exc:  # the database went away: fall back to sleeping
            log.warning("job signal unavailable (%s); polling instead", exc)
            self.close()
            time.sleep(timeout_s)

    def _listen(self) -> Any:
        if self._connection is None or self._connection.closed:
            import psycopg

            url = self._engine.url.set(drivername="postgresql")
            self._connection = psycopg.connect(
                url.render_as_string(hide_password=False), autocommit=True, connect_timeout=5
            )
            self._connection.execute(f"LISTEN {NOTIFY_CHANNEL}")
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                self._connection.close()
            self._connection = None


# --- machines that went away ----------------------------------------------------------------


def requeue_jobs_of_worker(engine: Engine, worker_id: str, reason: str) -> list[tuple[int, str]]:
    """Recover the running jobs of a worker whose machine is gone (a preempted TPU VM, say).

    Like `requeue_stale`, but at once instead of after the heartbeat timeout: each job goes
    back to `queued` while it has attempts left (it resumes from its checkpoint on another
    worker), else to `failed`; one whose cancel was requested becomes `cancelled`. Each gets
    a job event naming `reason`. Returns (job id, new status) pairs; none when the worker
    runs nothing, so calling it again is harmless.
    """
    lost = (Job.status == "running") & (Job.worker_id == worker_id)
    return _recover(engine, lost, reason)

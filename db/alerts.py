"""Alerts: where they go, which events they follow, and the outbox that sends each exactly once.

An event (a job succeeded, failed, diverged, stopped early, kept recompiling after the warm-up;
a worker was lost) is `record`ed inside the transaction of the change that caused it: one
outbox row per destination that follows the event, unique per (event key, destination), so
that an event recorded twice is still one row. Any process (every worker and every dashboard
runs a drainer, `alerts.drain`) `claim`s due rows: a conditional UPDATE (Postgres: with the
candidates locked `FOR UPDATE SKIP LOCKED`; SQLite: in `BEGIN IMMEDIATE`) sets the claim and
its deadline, so two processes never hold one row. The holder sends it and marks it `sent`,
or `retry_later` with a doubling back-off, giving up after MAX_ATTEMPTS. A holder that died
mid-send leaves a claim that expires after CLAIM_S; the row is then sent again (the one case
where an alert can arrive twice). Rows sent or given up on are deleted after
TRAINDECK_ALERT_RETENTION_DAYS by the drainers (`delete_ended`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from db.engine import is_sqlite, read_tx, write_tx
from db.inputs import FieldError, one_line_name
from db.models import ALERT_EVENTS, AlertDestination, AlertOutbox, Job, JobEvent, utcnow

CLAIM_S = 120.0
FIRST_RETRY_S = 10.0
MAX_RETRY_S = 900.0
MAX_ATTEMPTS = 12
MAX_NAME_LENGTH = 100
EVENT_LABELS = {
    "succeeded": "a job succeeded",
    "failed": "a job failed",
    "diverged": "a job diverged (its loss stopped being a number)",
    "stopped_early": "a job stopped early (or a sweep pruned its trial)",
    "recompiling": "XLA kept compiling after the warm-up",
    "input_bound": "a job waited for its input more than half of an epoch",
    "worker_lost": "a job lost its worker (no heartbeat, or its VM went away)",
}
# The worker's words for these events in a job's log (worker/best_epoch.py, xla_report.py,
# prefetch.py): a line that starts so is the event.
DIVERGED_PREFIX = "training diverged"
_LOG_EVENTS = (
    ("stopped_early", re.compile(r"^stopped early at epoch ")),
    (
        "recompiling",
        re.compile(r"^XLA compiled \d+ new graph\(s\) during epoch \d+, after the warm"),
    ),
    ("input_bound", re.compile(r"^input-bound: training waited for its input ")),
)


# --- destinations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Destination:
    id: int
    name: str
    shown_url: str  # the URL with its secrets masked: the only form ever shown
    events: tuple[str, ...]


def check_events(events: Any) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(events or ()))
    unknown = [event for event in chosen if event not in ALERT_EVENTS]
    if unknown:
        raise FieldError("events", f"unknown event {unknown[0]!r}; one of {ALERT_EVENTS}")
    if not chosen:
        raise FieldError("events", "choose at least one event")
    return chosen


def add_destination(engine: Engine, name: str, url: str, shown_url: str, events: Any) -> int:
    """Save a destination (its URL already checked by `alerts.destinations`)."""
    name = one_line_name(name, MAX_NAME_LENGTH)
    chosen = check_events(events)
    with write_tx(engine) as connection:
        if connection.execute(
            select(AlertDestination.id).where(AlertDestination.name == name)
        ).first():
            raise FieldError("name", f"a destination named {name!r} exists already")
        return connection.execute(
            insert(AlertDestination)
            .values(
                name=name, url=url, shown_url=shown_url, events=list(chosen), created_at=utcnow()
            )
            .returning(AlertDestination.id)
        ).scalar_one()


def list_destinations(engine: Engine) -> list[Destination]:
    columns = (AlertDestination.id, AlertDestination.name, AlertDestination.shown_url,
               AlertDestination.events)  # fmt: skip
    with read_tx(engine) as connection:
        rows = connection.execute(select(*columns).order_by(AlertDestination.name)).all()
    return [Destination(row.id, row.name, row.shown_url, tuple(row.events)) for row in rows]


def remove_destination(engine: Engine, name: str) -> bool:
    """Remove a destination and its unsent alerts; False when there is none of that name."""
    with write_tx(engine) as connection:
        removed = connection.execute(delete(AlertDestination).where(AlertDestination.name == name))
    return removed.rowcount == 1


# --- recording events -----------------------------------------------------------------------


def record(connection: Connection, event: str, key: str, job_id: int | None, text: str) -> int:
    """Queue the alerts of one event, in the caller's transaction: a row per destination that
    follows `event`, none twice for the same `key`. Returns how many destinations follow it."""
    rows = connection.execute(select(AlertDestination.id, AlertDestination.events)).all()
    following = [row.id for row in rows if event in row.events]
    if not following:
        return 0
    name = None
    if job_id is not None:
        name = connection.execute(select(Job.name).where(Job.id == job_id)).scalar()
    subject = f"job #{job_id} ({name})" if name is not None else f"job #{job_id}"
    title = f"traindeck: {subject if job_id is not None else 'alert'}: {event.replace('_', ' ')}"
    now = utcnow()
    values = [
        {"event_key": key, "destination_id": destination, "event": event, "job_id": job_id,
         "title": title[:300], "body": text, "created_at": now, "attempts": 0,
         "next_attempt_at": now}
        for destination in following
    ]  # fmt: skip
    dialect_insert = sqlite.insert if is_sqlite(connection) else postgresql.insert
    statement = dialect_insert(AlertOutbox).on_conflict_do_nothing(
        index_elements=["event_key", "destination_id"]
    )
    connection.execute(statement, values)
    return len(following)


def record_finish(connection: Connection, job_id: int, lease: int, status: str, error: str | None):
    """The alert of a job's end: succeeded, failed, diverged (a failure the NaN stop caused),
    or pruned (a sweep's trial its pruner stopped: a `stopped_early` alert)."""
    if status == "succeeded":
        return record(connection, "succeeded", f"job:{job_id}:end:{lease}", job_id,
                      f"Job #{job_id} succeeded.")  # fmt: skip
    reason = (error or "").strip().splitlines()[-1] if (error or "").strip() else "no error text"
    if status == "pruned":
        text = f"Job #{job_id} was pruned by its sweep: {reason}"
        return record(connection, "stopped_early", f"job:{job_id}:end:{lease}", job_id, text)
    if status != "failed":
        return 0
    event = "diverged" if (error or "").startswith(DIVERGED_PREFIX) else "failed"
    text = f"Job #{job_id} {event}: {reason}"
    return record(connection, event, f"job:{job_id}:end:{lease}", job_id, text)


def record_worker_lost(connection: Connection, job_id: int, status: str, reason: str) -> int:
    """The alert of a job taken from a lost worker (`status`: where the job went)."""
    attempts = connection.execute(select(Job.attempts).where(Job.id == job_id)).scalar()
    where = {"queued": "back in the queue", "failed": "failed", "cancelled": "cancelled"}
    text = f"Job #{job_id} lost its worker ({reason}); it is {where.get(status, status)}."
    return record(connection, "worker_lost", f"job:{job_id}:lost:{attempts}", job_id, text)


def record_log_lines(connection: Connection, job_id: int, messages: list[str]) -> None:
    """The alerts that lines of a job's log stand for (the worker reports these events so):
    each once per job."""
    for message in messages:
        for event, pattern in _LOG_EVENTS:
            if pattern.match(message):
                record(connection, event, f"job:{job_id}:{event}", job_id,
                       f"Job #{job_id}: {message}")  # fmt: skip


# --- draining -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pending:
    """A claimed alert, with what sending it needs."""

    id: int
    url: str
    destination: str
    event: str
    job_id: int | None
    title: str
    body: str
    attempts: int


def _due(now: datetime) -> Any:
    return (
        AlertOutbox.sent_at.is_(None)
        & AlertOutbox.gave_up_at.is_(None)
        & (AlertOutbox.next_attempt_at <= now)
        & (AlertOutbox.claimed_until.is_(None) | (AlertOutbox.claimed_until < now))
    )


def claim(
    engine: Engine, owner: str, limit: int = 20, now: datetime | None = None
) -> list[Pending]:
    """Take up to `limit` due alerts for `owner` until CLAIM_S from now; nobody else gets them
    meanwhile."""
    now = now or utcnow()
    candidates = select(AlertOutbox.id).where(_due(now)).order_by(AlertOutbox.id).limit(limit)
    with write_tx(engine) as connection:
        if not is_sqlite(connection):
            candidates = candidates.with_for_update(skip_locked=True)
        claimed = (
            connection.execute(
                update(AlertOutbox)
                .where(AlertOutbox.id.in_(candidates.scalar_subquery()), _due(now))
                .values(claimed_by=owner, claimed_until=now + timedelta(seconds=CLAIM_S))
                .returning(AlertOutbox.id)
            )
            .scalars()
            .all()
        )
        if not claimed:
            return []
        rows = connection.execute(
            select(
                AlertOutbox.id,
                AlertDestination.url,
                AlertDestination.name,
                AlertOutbox.event,
                AlertOutbox.job_id,
                AlertOutbox.title,
                AlertOutbox.body,
                AlertOutbox.attempts,
            )
            .join(AlertDestination, AlertDestination.id == AlertOutbox.destination_id)
            .where(AlertOutbox.id.in_(claimed))
            .order_by(AlertOutbox.id)
        ).all()
    return [Pending(*row) for row in rows]  # fmt: skip


def _held(alert_id: int, owner: str) -> Any:
    return (
        (AlertOutbox.id == alert_id)
        & (AlertOutbox.claimed_by == owner)
        & AlertOutbox.sent_at.is_(None)
    )


def _log(connection: Connection, alert: Pending, level: str, message: str) -> None:
    if alert.job_id is not None:
        connection.execute(
            insert(JobEvent).values(
                job_id=alert.job_id, time=utcnow(), level=level, message=message
            )
        )


def mark_sent(engine: Engine, alert: Pending, owner: str) -> bool:
    """The alert went out; False when `owner` no longer held it."""
    with write_tx(engine) as connection:
        done = connection.execute(
            update(AlertOutbox).where(_held(alert.id, owner))
            .values(sent_at=utcnow(), attempts=AlertOutbox.attempts + 1, claimed_until=None)
        ).rowcount  # fmt: skip
        if done:
            _log(connection, alert, "info", f"alert '{alert.event}' sent to {alert.destination}")
    return done == 1


def retry_wait_s(attempts: int) -> float:
    """Seconds before the next try after `attempts` failed ones: 10 s, doubling, at most 15 min."""
    return min(MAX_RETRY_S, FIRST_RETRY_S * 2.0 ** max(0, attempts - 1))


def retry_later(
    engine: Engine, alert: Pending, owner: str, error: str, now: datetime | None = None
):
    """The destination refused or was unreachable: try again after the back-off, or give up
    after MAX_ATTEMPTS. Returns when it will be tried again (None: given up)."""
    now = now or utcnow()
    attempts = alert.attempts + 1
    retry_at = None if attempts >= MAX_ATTEMPTS else now + timedelta(seconds=retry_wait_s(attempts))
    values: dict[str, Any] = {
        "attempts": attempts,
        "last_error": error[:2000],
        "claimed_until": None,
    }
    values |= {"next_attempt_at": retry_at} if retry_at else {"gave_up_at": now}
    with write_tx(engine) as connection:
        if connection.execute(
            update(AlertOutbox).where(_held(alert.id, owner)).values(**values)
        ).rowcount:
            what = (f"retrying in {retry_wait_s(attempts):.0f} s" if retry_at
                    else f"gave up after {attempts} attempts")  # fmt: skip
            line = f"alert '{alert.event}' to {alert.destination} failed ({error}); {what}"
            _log(connection, alert, "warning", line)
    return retry_at


def delete_ended(engine: Engine, before: datetime) -> int:
    """Delete the alerts sent, or given up on, before `before`; returns how many. Pending ones
    stay however old. (An event recorded again after its row is gone would be sent again: the
    retention is meant to be far longer than any event can be recorded twice.)"""
    ended = (AlertOutbox.sent_at < before) | (
        AlertOutbox.sent_at.is_(None) & (AlertOutbox.gave_up_at < before)
    )
    with write_tx(engine) as connection:
        return connection.execute(delete(AlertOutbox).where(ended)).rowcount


@dataclass(frozen=True)
class OutboxRow:
    id: int
    event: str
    job_id: int | None
    destination: str
    created_at: datetime
    attempts: int
    sent_at: datetime | None
    gave_up_at: datetime | None
    next_attempt_at: datetime
    last_error: str | None

    @property
    def outcome(self) -> str:
        if self.sent_at is not None:
            return "sent"
        return "gave up" if self.gave_up_at is not None else "pending"


def recent_alerts(engine: Engine, limit: int = 100) -> list[OutboxRow]:
    """The newest alerts with their outcome, newest first."""
    statement = (
        select(AlertOutbox.id, AlertOutbox.event, AlertOutbox.job_id,
               AlertDestination.name.label("destination"), AlertOutbox.created_at,
               AlertOutbox.attempts, AlertOutbox.sent_at, AlertOutbox.gave_up_at,
               AlertOutbox.next_attempt_at, AlertOutbox.last_error)
        .join(AlertDestination, AlertDestination.id == AlertOutbox.destination_id)
        .order_by(AlertOutbox.id.desc())
        .limit(limit)
    )  # fmt: skip
    with read_tx(engine) as connection:
        return [OutboxRow(**row._mapping) for row in connection.execute(statement)]

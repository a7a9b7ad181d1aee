"""The tables, as SQLAlchemy 2.0 typed models. Schema changes go through Alembic migrations."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# `pruned`: a sweep's trial that its pruner stopped early (db.sweeps); its curves and last
# checkpoint are kept, it has no export.
JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled", "pruned")
FINISHED_STATUSES = ("succeeded", "failed", "cancelled", "pruned")
SWEEP_STATUSES = ("running", "finished", "cancelled")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Stored as naive UTC on every backend; read back as timezone-aware UTC."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        list[Any]: JSON(),
    }


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    spec: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16), default="queued")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Bumped at every claim: a worker's heartbeats and state changes name the lease they
    # hold, so a worker that lost its claim (declared stale, job taken by another) finds out.
    lease: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    device: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    step: Mapped[int] = mapped_column(Integer, default=0)
    total_epochs: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int] = mapped_column(Integer, default=0)
    eta_seconds: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    cloned_from: Mapped[int | None] = mapped_column(Integer)
    # A person's Markdown note, edited on the job page; shown as plain text.
    note: Mapped[str] = mapped_column(Text, default="", server_default="")
    # A sweep's trial: its sweep and Optuna's trial number (db.sweeps); None for other jobs.
    sweep_id: Mapped[int | None] = mapped_column(Integer)
    trial_number: Mapped[int | None] = mapped_column(Integer)
    # The TPU VM hosts the job runs on at once (its spec's `hosts`): 1, or every host of one
    # multi-host pod slice, whose hosts' workers run it together (db.gang).
    hosts: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # The slice of the current (or last) attempt of a multi-host job; None for other jobs.
    slice_name: Mapped[str | None] = mapped_column(String(200))

    __table_args__ = (
        # ix_jobs_claim follows the class: it names a column's order.
        # Lists filtered by status, newest first (`traindeck jobs --status`, the Jobs page).
        Index("ix_jobs_status_id", "status", "id"),
        Index("ix_jobs_created_at", "created_at"),
        # A trial is one job, whoever enqueued it; and a sweep's trials in order.
        Index("ux_jobs_sweep_trial", "sweep_id", "trial_number", unique=True),
    )


# The claim (db.queue.claim): the next queued job, highest priority first, then the oldest.
# The index is in that very order, so a claim reads its first entry instead of sorting every
# queued row; the Jobs page pages through the queue in run order along it too.
Index("ix_jobs_claim", Job.status, Job.priority.desc(), Job.id)


# What a host of a multi-host job's attempt does (db.gang): `joined` (its worker runs the job's
# process), `done` (the process ended well, or was told to), `failed` (the process reported an
# error: the job fails with it), `died` (killed, crashed or hung: the job is requeued whole),
# `left` (its worker was shut down: the job goes back to the queue without spending an attempt).
HOST_STATES = ("joined", "done", "failed", "died", "left")


class JobHost(Base):
    """One host of one attempt of a multi-host job (db.gang): its worker, its heartbeat, when
    its job process reached the start barrier, and how far that process has trained."""

    __tablename__ = "job_hosts"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    # The attempt: the job's lease when the slice's host 0 claimed it.
    lease: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker_id: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16), default="joined")
    joined_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Its job process is at the start barrier; nobody trains until every host's is.
    ready_at: Mapped[datetime | None]
    # The last time its training step moved on (the progress watchdog's clock).
    progress_at: Mapped[datetime | None]
    step: Mapped[int] = mapped_column(Integer, default=0)
    reason: Mapped[str | None] = mapped_column(Text)


class JobTag(Base):
    """One free tag of a job (`db.labels`); lists filter by tag along (tag, job_id)."""

    __tablename__ = "job_tags"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(50), primary_key=True)

    __table_args__ = (Index("ix_job_tags_tag_job_id", "tag", "job_id"),)


class Metric(Base):
    __tablename__ = "metrics"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    # Byte order ("C") on Postgres as on SQLite, so that a prefix is a range of the index
    # whatever the database's locale: `epoch/` is `name >= 'epoch/' AND name < 'epoch0'`.
    name: Mapped[str] = mapped_column(
        String(64).with_variant(String(64, collation="C"), "postgresql")
    )
    step: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[int | None] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Float)
    wall_time: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        # A resumed job re-sends points it may already have written: they must not double.
        UniqueConstraint("job_id", "name", "step", name="uq_metrics_job_name_step"),
        # The job page asks for "rows of this job newer than the last one I drew".
        Index("ix_metrics_job_id_id", "job_id", "id"),
        # Charts read a long series in buckets of steps from this index alone (db.series).
        Index("ix_metrics_series", "job_id", "name", "step", "value"),
    )


class XlaReport(Base):
    __tablename__ = "xla_reports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    summary: Mapped[dict[str, Any]]
    raw: Mapped[str] = mapped_column(Text)


class Artifact(Base):
    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    path: Mapped[str] = mapped_column(Text)
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("job_id", "kind", name="uq_artifacts_job_kind"),)


# A profile capture's life: asked for (`requested`), taken by the job's process (`recording`),
# then its trace in the store as the job's `profile` artifact (`stored`) or not (`failed`).
PROFILE_STATUSES = ("requested", "recording", "stored", "failed")


class ProfileCapture(Base):
    """A request to record the next `steps` training steps of a running job with a profiler,
    and what became of it (`db.profiles`)."""

    __tablename__ = "profile_captures"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    steps: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="requested")
    requested_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    # The global training steps recorded (0-based, as `batch/` metrics count them).
    first_step: Mapped[int | None] = mapped_column(Integer)
    last_step: Mapped[int | None] = mapped_column(Integer)
    tool: Mapped[str] = mapped_column(String(32), default="", server_default="")
    message: Mapped[str] = mapped_column(Text, default="", server_default="")


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    device: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16), default="idle")
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)
    current_job_id: Mapped[int | None] = mapped_column(Integer)
    jobs_done: Mapped[int] = mapped_column(Integer, default=0)


class JobEvent(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    time: Mapped[datetime] = mapped_column(default=utcnow)
    level: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)

    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)


class Dataset(Base):
    __tablename__ = "datasets"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    location: Mapped[str] = mapped_column(Text)
    label_rule: Mapped[dict[str, Any]]
    classes: Mapped[list[Any]]
    class_counts: Mapped[dict[str, Any]]
    item_count: Mapped[int] = mapped_column(Integer, default=0)
    bad_files: Mapped[list[Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # With a shared store (a bucket): the dataset's files packed once, which workers on other
    # machines fetch (`datasets.archive`); None where the folder is read in place.
    archive_url: Mapped[str | None] = mapped_column(Text, default=None)
    archive_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    # What registration found (files, labels, split, sizes and times), kept in the store so
    # that a job neither scans nor decodes (`datasets.manifest`); None for rows from before it.
    manifest_url: Mapped[str | None] = mapped_column(Text, default=None)
    manifest_sha256: Mapped[str | None] = mapped_column(String(64), default=None)


class Result(Base):
    """What a finished job's model does on its validation set, computed once by the worker.

    `per_class` rows are {class, precision, recall, support}; `top_losses` rows are {path,
    actual, predicted, probability, loss, thumbnail (base64 PNG)}; `predictions` rows are
    [path, actual, predicted] for every validation image, in the order fastai saw them.
    """

    __tablename__ = "results"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    classes: Mapped[list[Any]]
    confusion: Mapped[list[Any]]
    per_class: Mapped[list[Any]]
    top_losses: Mapped[list[Any]]
    predictions: Mapped[list[Any]]
    accuracy: Mapped[float] = mapped_column(Float)
    valid_loss: Mapped[float] = mapped_column(Float)


class ApiToken(Base):
    """A token of the HTTP API (`db.tokens`): only its SHA-256 is kept, and its first
    characters (`prefix`) so that a person can tell their tokens apart."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100))
    token_sha256: Mapped[str] = mapped_column(String(64))
    prefix: Mapped[str] = mapped_column(String(16))
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]

    __table_args__ = (UniqueConstraint("token_sha256", name="uq_api_tokens_token_sha256"),)


ALERT_EVENTS = (
    "succeeded",
    "failed",
    "diverged",
    "stopped_early",
    "recompiling",
    "input_bound",
    "worker_lost",
)


class AlertDestination(Base):
    """Where alerts go (`db.alerts`): an Apprise URL, which holds its secrets (shown only as
    `shown_url`, masked), and the events it is sent."""

    __tablename__ = "alert_destinations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100))
    url: Mapped[str] = mapped_column(Text)
    shown_url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("name", name="uq_alert_destinations_name"),)


class AlertOutbox(Base):
    """One alert to send to one destination: written with the change that caused it, sent by
    whichever process claims it (`claimed_by` until `claimed_until`), retried with back-off."""

    __tablename__ = "alert_outbox"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_key: Mapped[str] = mapped_column(String(200))
    destination_id: Mapped[int] = mapped_column(
        ForeignKey("alert_destinations.id", ondelete="CASCADE")
    )
    event: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[int | None] = mapped_column(Integer)
    title: Mapped[str] = mapped_column(String(300))
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime]
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    claimed_until: Mapped[datetime | None]
    sent_at: Mapped[datetime | None]
    gave_up_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        UniqueConstraint("event_key", "destination_id", name="uq_alert_outbox_event"),
        Index("ix_alert_outbox_pending", "sent_at", "gave_up_at", "id"),
    )


class Sweep(Base):
    """A hyperparameter search over jobs (db.sweeps): its checked definition, its Optuna
    study's name, and the advisory claim of the process that enqueues its trials."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    definition: Mapped[dict[str, Any]]
    study_name: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(16), default="running")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    # The driver's claim: who holds it, until when, and a token bumped at every claim, which
    # each enqueue checks in its own transaction (a driver whose claim lapsed enqueues nothing).
    driver: Mapped[str | None] = mapped_column(String(200))
    driver_until: Mapped[datetime | None]
    driver_token: Mapped[int] = mapped_column(Integer, default=0)
    # Its own tags and a person's note (the rules of a job's, db.spec.Labels); edited after
    # submit, so kept here and not in the definition.
    tags: Mapped[list[Any]] = mapped_column(default=list, server_default="[]")
    note: Mapped[str] = mapped_column(Text, default="", server_default="")

    __table_args__ = (UniqueConstraint("study_name", name="uq_sweeps_study_name"),)

"""What a running job reports: metric points, its log (job events) and XLA metrics reports.

Metric names carry their cadence as a prefix, and step means:
- `batch/…`: one point per optimizer step, step = global training iteration (0-based):
  `batch/train_loss` (raw loss of the batch), `batch/lr`.
- `epoch/…`: one point per epoch, step = epoch index (0-based): `epoch/train_loss`,
  `epoch/valid_loss`, `epoch/accuracy`, `epoch/error_rate`, `epoch/top5_accuracy` (more
  than 5 classes), `epoch/time_s`, `epoch/images_per_s`, `epoch/input_wait_share` (the share
  of the training pass spent waiting for the next batch, 0 to 1: `worker.input_wait`), and on
  CUDA `epoch/cuda_max_memory_mb`.
- `lr_find/…`: step = lr_find iteration: `lr_find/lr`, `lr_find/loss`; and
  `lr_find/suggestion` (step 0), the learning rate the job then used.
- `sys/…`: the system while the job runs, sampled every TRAINDECK_SYSTEM_METRICS_INTERVAL
  seconds (`worker.system_metrics`), step = whole seconds since the job was submitted, epoch
  empty: `sys/cpu_pct` (the host's CPU, % of all its cores), `sys/process_cpu_pct` and
  `sys/loader_cpu_pct` (the job process's and its DataLoader worker processes' CPU, % of one
  core), `sys/rss_mb` (the job process's resident memory, MiB), `sys/disk_read_mb_s` (the
  host's disk reads, MiB/s); per TPU chip N `sys/tpuN/duty_cycle_pct` (TensorCore duty
  cycle), `sys/tpuN/hbm_used_gib` and `sys/tpuN/hbm_total_gib`; on a GPU N
  `sys/cudaN/allocated_mb`, `sys/cudaN/reserved_mb` (PyTorch's allocator) and
  `sys/cudaN/util_pct` (NVML).

A point is unique by (job, name, step): writing it again is a no-op, so a resumed job that
re-sends points never doubles them. A value that is not a finite number (the loss of a diverged
run) is not stored: SQLite turns NaN into NULL, and a chart cannot draw it; the worker fails
such a job with the reason.

An XLA report's `summary` holds cumulative counters since the job's process started:
`compile_count`, `compile_time_s`, `execute_count`, `execute_time_s`,
`transfer_to_device_time_s`, `transfer_from_device_time_s`, `cached_compile`,
`uncached_compile`, `persistent_cache_hits`, `persistent_cache_misses` (compiled and stored
in the data folder's cache), `persistent_cache_load_failures` (found in the cache but not
loadable: torch_xla 2.8 and 2.9, pytorch/xla#9094), `device_syncs`, and `aten_fallbacks` (op
name → count of calls that fell back to the CPU). Under SPMD (several devices) execute counts
and times are those of the replicated executions, one per step over all the devices. A job
that ran in a worker process after another job with the same graphs (`worker.job_channel`)
counts from its own start, and its reports add `graphs_kept` (compiled graphs in the process's
memory when it started) and `graphs_kept_from_job` (that previous job's id).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, and_, func, insert, select
from sqlalchemy.dialects import postgresql, sqlite

from db.alerts import record_log_lines
from db.engine import is_sqlite, read_tx, write_tx
from db.ids import one_of
from db.models import JobEvent, Metric, XlaReport, utcnow

BATCH = "batch/"
EPOCH = "epoch/"
EPOCH_END = EPOCH[:-1] + chr(ord(EPOCH[-1]) + 1)  # "epoch0": every name with the prefix is below
LR_FIND = "lr_find/"
SYS = "sys/"
SYS_END = SYS[:-1] + chr(ord(SYS[-1]) + 1)  # "sys0": every name with the prefix is below
INPUT_WAIT_SHARE = EPOCH + "input_wait_share"
# Past this share of a training pass spent waiting for input, the job is input-bound: the
# device mostly idles while the host loads.
INPUT_BOUND_SHARE = 0.5
MAX_EVENT_CHARS = 20_000


@dataclass(frozen=True)
class MetricPoint:
    name: str
    step: int
    value: float
    epoch: int | None = None
    wall_time: float = 0.0


@dataclass(frozen=True)
class EventRow:
    id: int
    time: datetime
    level: str
    message: str


def write_metrics(engine: Engine, job_id: int, points: Sequence[MetricPoint]) -> int:
    """Insert points, skipping any (job, name, step) already stored and any value that is not
    a finite number. Returns rows offered."""
    rows = [
        {
            "job_id": job_id,
            "name": point.name,
            "step": point.step,
            "epoch": point.epoch,
            "value": float(point.value),
            "wall_time": point.wall_time,
        }
        for point in points
        if math.isfinite(point.value)
    ]
    if not rows:
        return 0
    with write_tx(engine) as connection:
        dialect_insert = sqlite.insert if is_sqlite(connection) else postgresql.insert
        statement = dialect_insert(Metric).on_conflict_do_nothing(
            index_elements=["job_id", "name", "step"]
        )
        connection.execute(statement, rows)
    return len(rows)


def metrics_since(
    engine: Engine, job_id: int, after_id: int = 0, names: Iterable[str] | None = None
) -> list[Any]:
    """Rows (id, name, step, epoch, value, wall_time) of a job with id > `after_id`, by id."""
    statement = (
        select(Metric.id, Metric.name, Metric.step, Metric.epoch, Metric.value, Metric.wall_time)
        .where(Metric.job_id == job_id, Metric.id > after_id)
        .order_by(Metric.id)
    )
    if names is not None:
        statement = statement.where(Metric.name.in_(list(names)))
    with read_tx(engine) as connection:
        return list(connection.execute(statement))


def metric_series(engine: Engine, job_id: int, name: str) -> list[tuple[int, float]]:
    """(step, value) of one metric of a job, by step."""
    statement = (
        select(Metric.step, Metric.value)
        .where(Metric.job_id == job_id, Metric.name == name)
        .order_by(Metric.step)
    )
    with read_tx(engine) as connection:
        return [(step, value) for step, value in connection.execute(statement)]


def final_metrics(engine: Engine, job_ids: Sequence[int]) -> dict[int, dict[str, float]]:
    """Per job, each `epoch/` metric's value at its last epoch, keyed without the prefix.

    The cost follows the jobs' epoch points, not their batch points nor the table: `epoch/`
    is a range of names (`name >= 'epoch/' AND name < 'epoch0'`, '0' being the character after
    '/'), so each job's epoch points are one range of the (job_id, name, step) index, where a
    LIKE would read every point of the job (on Postgres, of the table). The ids are one bound
    parameter however many there are (`db.ids.one_of`).
    """
    if not job_ids:
        return {}
    result: dict[int, dict[str, float]] = {job_id: {} for job_id in job_ids}
    with read_tx(engine) as connection:
        last = (
            select(Metric.job_id, Metric.name, func.max(Metric.step).label("step"))
            .where(
                one_of(connection, Metric.job_id, result),
                Metric.name >= EPOCH,
                Metric.name < EPOCH_END,
            )
            .group_by(Metric.job_id, Metric.name)
            .subquery()
        )
        statement = select(Metric.job_id, Metric.name, Metric.value).join(
            last,
            and_(
                Metric.job_id == last.c.job_id,
                Metric.name == last.c.name,
                Metric.step == last.c.step,
            ),
        )
        for job_id, name, value in connection.execute(statement):
            result[job_id][name.removeprefix(EPOCH)] = value
    return result


def latest_system_values(
    engine: Engine, job_ids: Sequence[int]
) -> dict[int, tuple[float, dict[str, float]]]:
    """Per job that has `sys/` points: the wall time of its newest sample and each `sys/`
    metric's newest value, keyed without the prefix.

    Each name is found by one index seek in the `sys/` range of the (job_id, name, step) index
    and its newest value by another (reading backwards), so the cost follows the number of
    names, not how long the jobs have run.
    """
    result: dict[int, tuple[float, dict[str, float]]] = {}
    with read_tx(engine) as connection:
        for job_id in job_ids:
            values: dict[str, float] = {}
            newest = 0.0
            name: str | None = SYS
            while True:
                name = connection.execute(
                    select(Metric.name)
                    .where(Metric.job_id == job_id, Metric.name > name, Metric.name < SYS_END)
                    .order_by(Metric.name)
                    .limit(1)
                ).scalar()
                if name is None:
                    break
                value, wall_time = connection.execute(
                    select(Metric.value, Metric.wall_time)
                    .where(Metric.job_id == job_id, Metric.name == name)
                    .order_by(Metric.step.desc())
                    .limit(1)
                ).one()
                values[name.removeprefix(SYS)] = value
                newest = max(newest, wall_time)
            if values:
                result[job_id] = (newest, values)
    return result


def count_metric_duplicates(engine: Engine, job_id: int) -> int:
    """How many (name, step) pairs of a job appear more than once (always 0 if all is well)."""
    grouped = (
        select(Metric.name, Metric.step)
        .where(Metric.job_id == job_id)
        .group_by(Metric.name, Metric.step)
        .having(func.count() > 1)
        .subquery()
    )
    with read_tx(engine) as connection:
        return connection.execute(select(func.count()).select_from(grouped)).scalar_one()


# --- the job's log --------------------------------------------------------------------------


def add_events(engine: Engine, job_id: int, events: Sequence[tuple[str, str]]) -> None:
    """Append (level, message) lines to a job's log."""
    if not events:
        return
    now = utcnow()
    rows = [
        {"job_id": job_id, "time": now, "level": level, "message": message[:MAX_EVENT_CHARS]}
        for level, message in events
    ]
    with write_tx(engine) as connection:
        connection.execute(insert(JobEvent), rows)
        record_log_lines(connection, job_id, [row["message"] for row in rows])


def add_event(engine: Engine, job_id: int, level: str, message: str) -> None:
    add_events(engine, job_id, [(level, message)])


def events_since(
    engine: Engine, job_id: int, after_id: int = 0, limit: int | None = None
) -> list[EventRow]:
    statement = (
        select(JobEvent.id, JobEvent.time, JobEvent.level, JobEvent.message)
        .where(JobEvent.job_id == job_id, JobEvent.id > after_id)
        .order_by(JobEvent.id)
    )
    if limit is not None:
        statement = statement.limit(limit)
    with read_tx(engine) as connection:
        return [EventRow(*row) for row in connection.execute(statement)]


def _log_filter(job_id: int, query: str) -> list[Any]:
    conditions = [JobEvent.job_id == job_id]
    if query:
        # Matched as plain text, whatever the case: % and _ a person types are not wildcards.
        conditions.append(func.lower(JobEvent.message).contains(query.lower(), autoescape=True))
    return conditions


def log_page(
    engine: Engine,
    job_id: int,
    limit: int,
    *,
    before_id: int | None = None,
    after_id: int | None = None,
    query: str = "",
) -> list[EventRow]:
    """One page of a job's log, oldest first: the newest `limit` lines (below `before_id` when
    given), or the oldest `limit` lines above `after_id`; only lines containing `query`. Read
    by a range on (job_id, id), so a page costs the same at the start and the end of a long log."""
    statement = select(JobEvent.id, JobEvent.time, JobEvent.level, JobEvent.message).where(
        *_log_filter(job_id, query)
    )
    if after_id is not None:
        statement = statement.where(JobEvent.id > after_id).order_by(JobEvent.id)
    else:
        if before_id is not None:
            statement = statement.where(JobEvent.id < before_id)
        statement = statement.order_by(JobEvent.id.desc())
    with read_tx(engine) as connection:
        rows = [EventRow(*row) for row in connection.execute(statement.limit(limit))]
    return rows if after_id is not None else rows[::-1]


def log_line_count(
    engine: Engine, job_id: int, query: str = "", before_id: int | None = None
) -> int:
    """Lines of a job's log containing `query` (below `before_id` when given)."""
    conditions = _log_filter(job_id, query)
    if before_id is not None:
        conditions.append(JobEvent.id < before_id)
    with read_tx(engine) as connection:
        return int(connection.execute(select(func.count()).where(*conditions)).scalar_one())


# --- XLA metrics reports --------------------------------------------------------------------


def add_xla_report(
    engine: Engine, job_id: int, epoch: int, summary: dict[str, Any], raw: str
) -> None:
    with write_tx(engine) as connection:
        connection.execute(
            insert(XlaReport).values(
                job_id=job_id, epoch=epoch, created_at=utcnow(), summary=summary, raw=raw
            )
        )


def xla_reports(engine: Engine, job_id: int, after_id: int = 0) -> list[Any]:
    """Rows (id, epoch, created_at, summary, raw) of a job's XLA reports, oldest first."""
    statement = (
        select(
            XlaReport.id, XlaReport.epoch, XlaReport.created_at, XlaReport.summary, XlaReport.raw
        )
        .where(XlaReport.job_id == job_id, XlaReport.id > after_id)
        .order_by(XlaReport.id)
    )
    with read_tx(engine) as connection:
        return list(connection.execute(statement))

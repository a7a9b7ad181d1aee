"""Metric series for charts: min/max buckets computed in SQL, and a job's rows newer than an id.

A chart needs a few thousand points however long the series is, and a job may write 10^6
`batch/train_loss` points. So a long series is read as at most `max_buckets` buckets of
consecutive steps, each with its first and last step, min, max, sum and count: the chart draws
the raw line as the min/max envelope (a spike stays visible however far it is zoomed out) and a
smoothed line from the means. A short series comes back point by point (buckets of one).

How the buckets are computed was chosen by measuring 10^6 points on SQLite (`bench/dashboard.py`):
fetching the raw rows costs 0.6–0.8 s in Python object creation alone, and a GROUP BY on
`step / width` 0.45 s because SQLite sorts every row in a temporary B-tree. One indexed range
query per bucket on the raw DB-API cursor reads the rows in index order and sorts nothing
(about 0.2 s). Postgres aggregates a GROUP BY in a hash table, so it gets that one query.

After the first read a page asks only for rows with an id above the last one it drew
(`rows_since`, on the `(job_id, id)` index) and appends them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Connection, Engine, func, select

from db.engine import is_sqlite, read_tx
from db.models import Metric

DEFAULT_MAX_BUCKETS = 2000


@dataclass(frozen=True)
class Buckets:
    """Consecutive runs of a series' points, in step order; a bucket of one is one point."""

    first_step: np.ndarray
    last_step: np.ndarray
    low: np.ndarray
    high: np.ndarray
    total: np.ndarray
    count: np.ndarray

    @classmethod
    def empty(cls) -> Buckets:
        return cls.from_points(np.empty(0, np.int64), np.empty(0, np.float64))

    @classmethod
    def from_points(cls, steps: np.ndarray, values: np.ndarray) -> Buckets:
        steps = np.asarray(steps, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        return cls(steps, steps.copy(), values, values.copy(), values.copy(), np.ones_like(steps))

    @classmethod
    def from_rows(cls, rows: list[tuple]) -> Buckets:
        """From (first_step, last_step, low, high, total, count) rows."""
        if not rows:
            return cls.empty()
        columns = np.array(rows, dtype=np.float64).T
        first, last, low, high, total, count = columns
        return cls(
            first.astype(np.int64),
            last.astype(np.int64),
            low,
            high,
            total,
            count.astype(np.int64),
        )

    def __len__(self) -> int:
        return len(self.first_step)

    @property
    def point_count(self) -> int:
        return int(self.count.sum())

    @property
    def mean(self) -> np.ndarray:
        return self.total / self.count

    @property
    def is_raw(self) -> bool:
        """Every bucket holds one point: the series is exact."""
        return bool(np.all(self.count == 1))

    def extend(self, other: Buckets) -> Buckets:
        """Both series' buckets, in step order."""
        if not len(other):
            return self
        if not len(self):
            return other
        merged = Buckets(
            *(
                np.concatenate([a, b])
                for a, b in zip(self._columns(), other._columns(), strict=True)
            )
        )
        if other.first_step[0] > self.last_step[-1]:
            return merged
        order = np.argsort(merged.first_step, kind="stable")
        return Buckets(*(column[order] for column in merged._columns()))

    def coarsen(self, max_buckets: int) -> Buckets:
        """Merge neighbouring buckets into at most `max_buckets` of equal step width."""
        if len(self) <= max_buckets:
            return self
        start = int(self.first_step[0])
        width = math.ceil((int(self.last_step[-1]) - start + 1) / max_buckets)
        group = (self.first_step - start) // width
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        ends = np.r_[starts[1:], len(self)] - 1
        return Buckets(
            self.first_step[starts],
            self.last_step[ends],
            np.minimum.reduceat(self.low, starts),
            np.maximum.reduceat(self.high, starts),
            np.add.reduceat(self.total, starts),
            np.add.reduceat(self.count, starts),
        )

    def _columns(self) -> tuple[np.ndarray, ...]:
        return (self.first_step, self.last_step, self.low, self.high, self.total, self.count)


@dataclass(frozen=True)
class SeriesSnapshot:
    """Every series of a job up to metric row `last_id`, by metric name."""

    last_id: int
    series: dict[str, Buckets]


@dataclass(frozen=True)
class NewRows:
    """A job's metric rows after some id, grouped by name. `complete` is False when there were
    more than the limit: the caller should take a new snapshot instead."""

    last_id: int
    series: dict[str, Buckets]
    complete: bool


def _last_metric_id(connection: Connection, job_id: int) -> int:
    statement = select(func.max(Metric.id)).where(Metric.job_id == job_id)
    return connection.execute(statement).scalar() or 0


def _series_names(connection: Connection, job_id: int) -> list[str]:
    """The job's metric names, each found by one index seek (no scan of all its rows)."""
    names: list[str] = []
    while True:
        statement = select(Metric.name).where(Metric.job_id == job_id)
        if names:
            statement = statement.where(Metric.name > names[-1])
        name = connection.execute(statement.order_by(Metric.name).limit(1)).scalar()
        if name is None:
            return names
        names.append(name)


def _step_range(
    connection: Connection, job_id: int, name: str, last_id: int
) -> tuple[int, int] | None:
    where = (Metric.job_id == job_id, Metric.name == name, Metric.id <= last_id)
    # Two single-aggregate subqueries: each is one index seek, where min() and max() side by
    # side would scan the whole series on SQLite.
    low = select(func.min(Metric.step)).where(*where).scalar_subquery()
    high = select(func.max(Metric.step)).where(*where).scalar_subquery()
    row = connection.execute(select(low, high)).one()
    if row[0] is None:
        return None
    return int(row[0]), int(row[1])


def _raw_points(connection: Connection, job_id: int, name: str, last_id: int) -> Buckets:
    statement = (
        select(Metric.step, Metric.value)
        .where(Metric.job_id == job_id, Metric.name == name, Metric.id <= last_id)
        .order_by(Metric.step)
    )
    rows = connection.execute(statement).all()
    if not rows:
        return Buckets.empty()
    steps, values = np.array(rows, dtype=np.float64).T
    return Buckets.from_points(steps.astype(np.int64), values)


# The rows of one bucket, read from the covering index ix_metrics_series (job_id, name, step,
# value). No `id <= last_id` here: a SQLite read transaction sees one snapshot, the same one
# `last_id` was read from. The bucket's first and last step are its bounds (clipped to the
# series' last step): asking for min(step) and max(step) as well costs a fifth more time.
_SQLITE_BUCKET_QUERY = (
    "SELECT min(value), max(value), sum(value), count(*) FROM metrics "
    "WHERE job_id = ? AND name = ? AND step >= ? AND step < ?"
)


def _sqlite_buckets(
    connection: Connection, job_id: int, name: str, low: int, high: int, width: int
) -> Buckets:
    # The raw DB-API cursor of this same read transaction: going through SQLAlchemy for each
    # of the ~2,000 small queries would cost more than the queries themselves.
    cursor = connection.connection.cursor()
    try:
        rows = []
        for start in range(low, high + 1, width):
            end = start + width
            low_value, high_value, total, count = cursor.execute(
                _SQLITE_BUCKET_QUERY, (job_id, name, start, end)
            ).fetchone()
            if count:
                rows.append((start, min(end - 1, high), low_value, high_value, total, count))
    finally:
        cursor.close()
    return Buckets.from_rows(rows)


def _grouped_buckets(
    connection: Connection, job_id: int, name: str, last_id: int, low: int, width: int
) -> Buckets:
    bucket = ((Metric.step - low) // width).label("bucket")
    statement = (
        select(
            bucket,
            func.min(Metric.step),
            func.max(Metric.step),
            func.min(Metric.value),
            func.max(Metric.value),
            func.sum(Metric.value),
            func.count(),
        )
        .where(Metric.job_id == job_id, Metric.name == name, Metric.id <= last_id)
        .group_by(bucket)
        .order_by(bucket)
    )
    return Buckets.from_rows([tuple(row[1:]) for row in connection.execute(statement)])


def _read_series(
    connection: Connection, job_id: int, name: str, last_id: int, max_buckets: int
) -> Buckets:
    step_range = _step_range(connection, job_id, name, last_id)
    if step_range is None:
        return Buckets.empty()
    low, high = step_range
    if high - low + 1 <= 2 * max_buckets:
        return _raw_points(connection, job_id, name, last_id)
    width = math.ceil((high - low + 1) / max_buckets)
    if is_sqlite(connection):
        return _sqlite_buckets(connection, job_id, name, low, high, width)
    return _grouped_buckets(connection, job_id, name, last_id, low, width)


def read_series(
    engine: Engine,
    job_id: int,
    name: str,
    max_buckets: int = DEFAULT_MAX_BUCKETS,
    last_id: int | None = None,
) -> Buckets:
    """One series of a job (rows up to `last_id`, default all) in at most `max_buckets` buckets,
    or point by point when it has at most twice that many steps."""
    with read_tx(engine) as connection:
        if last_id is None:
            last_id = _last_metric_id(connection, job_id)
        return _read_series(connection, job_id, name, last_id, max_buckets)


def snapshot(
    engine: Engine,
    job_id: int,
    max_buckets: int = DEFAULT_MAX_BUCKETS,
    names: list[str] | None = None,
) -> SeriesSnapshot:
    """Every series of a job (or those in `names`), each read as by `read_series`."""
    with read_tx(engine) as connection:
        last_id = _last_metric_id(connection, job_id)
        if names is None:
            names = _series_names(connection, job_id)
        series = {
            name: _read_series(connection, job_id, name, last_id, max_buckets) for name in names
        }
    return SeriesSnapshot(last_id, {name: b for name, b in series.items() if len(b)})


def rows_since(
    engine: Engine, job_id: int, after_id: int, limit: int = 100_000, names: list[str] | None = None
) -> NewRows:
    """The job's metric rows with id > `after_id` (at most `limit`), as points by name."""
    statement = (
        select(Metric.id, Metric.name, Metric.step, Metric.value)
        .where(Metric.job_id == job_id, Metric.id > after_id)
        .order_by(Metric.id)
        .limit(limit + 1)
    )
    with read_tx(engine) as connection:
        rows = connection.execute(statement).all()
    complete = len(rows) <= limit
    rows = rows[:limit]
    by_name: dict[str, tuple[list[int], list[float]]] = {}
    for _, name, step, value in rows:
        if names is not None and name not in names:
            continue
        steps, values = by_name.setdefault(name, ([], []))
        steps.append(step)
        values.append(value)
    series = {}
    for name, (steps, values) in by_name.items():
        order = np.argsort(np.asarray(steps), kind="stable")
        series[name] = Buckets.from_points(np.asarray(steps)[order], np.asarray(values)[order])
    last_id = rows[-1][0] if rows else after_id
    return NewRows(last_id, series, complete)

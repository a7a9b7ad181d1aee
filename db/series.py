"""Metric series for charts: min/max buckets computed in SQL, and a job's rows newer than an id.

A chart needs a few thousand points however long the series is, and a job may write 10^6
`batch/train_loss` points. So a long series is read as at most `max_buckets` buckets of
consecutive steps, each with its first and last step, min, max, sum and count: the chart draws
the raw line as the min/max envelope (a spike stays visible however far it is zoomed out) and a
smoothed line from the means. A short series comes back point by point (buckets of one).

How the buckets are computed was chosen by measuring 10^6 points (`bench/dashboard_queries.py`):
on SQLite, fetching the raw rows costs 0.6 s (DB-API cursor) to 1.3 s (SQLAlchemy rows), and
a GROUP BY on `step / width` 0.45 s because SQLite sorts every row in a temporary B-tree (and
Postgres sorts them too: 0.33 s). One range query per bucket on a covering index reads the
rows in index order and sorts nothing: about 0.2 s on either backend (SQLite: a loop on the
raw DB-API cursor; Postgres: one statement, generate_series joined LATERAL).

After the first read a page asks only for rows with an id above the last one it drew
(`rows_since`, on the `(job_id, id)` index) and appends them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Connection, Engine, func, select, text

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


@contextmanager
def _snapshot_tx(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction whose statements all see one snapshot of the database.

    A SQLite read transaction is one already. Postgres reads each statement afresh under READ
    COMMITTED, so it gets REPEATABLE READ: the series read after `_last_metric_id` then hold
    exactly the rows up to that id, and no row filter on id keeps them out of the index.
    """
    if is_sqlite(engine):
        with read_tx(engine) as connection:
            yield connection
        return
    with engine.connect() as connection:
        connection = connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            yield connection


def _last_metric_id(connection: Connection, job_id: int) -> int:
    statement = select(func.max(Metric.id)).where(Metric.job_id == job_id)
    return connection.execute(statement).scalar() or 0


def _series_names(connection: Connection, job_id: int) -> list[str]:
    """The job's metric names, each found by one index seek (no scan of all its rows)."""

    def name_after(previous: str | None) -> str | None:
        statement = select(Metric.name).where(Metric.job_id == job_id)
        if previous is not None:
            statement = statement.where(Metric.name > previous)
        return connection.execute(statement.order_by(Metric.name).limit(1)).scalar()

    names: list[str] = []
    name = name_after(None)
    while name is not None:
        names.append(name)
        name = name_after(name)
    return names


def _step_range(connection: Connection, job_id: int, name: str) -> tuple[int, int] | None:
    where = (Metric.job_id == job_id, Metric.name == name)
    # Two single-aggregate subqueries: each is one index seek, where min() and max() side by
    # side would scan the whole series on SQLite.
    low = select(func.min(Metric.step)).where(*where).scalar_subquery()
    high = select(func.max(Metric.step)).where(*where).scalar_subquery()
    row = connection.execute(select(low, high)).one()
    if row[0] is None:
        return None
    return int(row[0]), int(row[1])


def _raw_points(connection: Connection, job_id: int, name: str) -> Buckets:
    statement = (
        select(Metric.step, Metric.value)
        .where(Metric.job_id == job_id, Metric.name == name)
        .order_by(Metric.step)
    )
    rows = connection.execute(statement).all()
    if not rows:
        return Buckets.empty()
    steps, values = np.array(rows, dtype=np.float64).T
    return Buckets.from_points(steps.astype(np.int64), values)


# Both backends aggregate each bucket with one range query on the covering index
# ix_metrics_series (job_id, name, step, value), reading rows in index order and sorting
# nothing. A bucket's first and last step are its bounds (the last clipped to the series' last
# step): asking for min(step) and max(step) as well costs a fifth more time.
_SQLITE_BUCKET_QUERY = (
    "SELECT min(value), max(value), sum(value), count(*) FROM metrics "
    "WHERE job_id = ? AND name = ? AND step >= ? AND step < ?"
)
_POSTGRES_BUCKETS_QUERY = text(
    "SELECT bucket.start, agg.low, agg.high, agg.total, agg.count "
    "FROM generate_series(CAST(:low AS bigint), CAST(:high AS bigint), CAST(:width AS bigint)) "
    "AS bucket(start) "
    "CROSS JOIN LATERAL ("
    "  SELECT min(value) AS low, max(value) AS high, sum(value) AS total, count(*) AS count"
    "  FROM metrics WHERE job_id = :job_id AND name = :name"
    "  AND step >= bucket.start AND step < bucket.start + :width"
    ") AS agg "
    "WHERE agg.count > 0 ORDER BY bucket.start"
)


def _sqlite_buckets(
    connection: Connection, job_id: int, name: str, low: int, high: int, width: int
) -> list[tuple]:
    # The raw DB-API cursor of this same read transaction: going through SQLAlchemy for each
    # of the ~2,000 small queries would cost more than the queries themselves.
    cursor = connection.connection.cursor()
    try:
        rows = []
        for start in range(low, high + 1, width):
            row = cursor.execute(_SQLITE_BUCKET_QUERY, (job_id, name, start, start + width))
            rows.append((start, *row.fetchone()))
    finally:
        cursor.close()
    return [row for row in rows if row[4]]


def _postgres_buckets(
    connection: Connection, job_id: int, name: str, low: int, high: int, width: int
) -> list[tuple]:
    parameters = {"low": low, "high": high, "width": width, "job_id": job_id, "name": name}
    return [tuple(row) for row in connection.execute(_POSTGRES_BUCKETS_QUERY, parameters)]


def _read_series(
    connection: Connection, job_id: int, name: str, max_buckets: int | None
) -> Buckets:
    """In buckets; point by point when `max_buckets` is None."""
    step_range = _step_range(connection, job_id, name)
    if step_range is None:
        return Buckets.empty()
    low, high = step_range
    if max_buckets is None or high - low + 1 <= 2 * max_buckets:
        return _raw_points(connection, job_id, name)
    width = math.ceil((high - low + 1) / max_buckets)
    read_buckets = _sqlite_buckets if is_sqlite(connection) else _postgres_buckets
    rows = read_buckets(connection, job_id, name, low, high, width)
    return Buckets.from_rows(
        [
            (start, min(start + width - 1, high), low_value, high_value, total, count)
            for start, low_value, high_value, total, count in rows
        ]
    )


def read_series(
    engine: Engine, job_id: int, name: str, max_buckets: int = DEFAULT_MAX_BUCKETS
) -> Buckets:
    """One series of a job in at most `max_buckets` buckets, or point by point when it has at
    most twice that many steps."""
    with _snapshot_tx(engine) as connection:
        return _read_series(connection, job_id, name, max_buckets)


def snapshot(
    engine: Engine,
    job_id: int,
    max_buckets: int | None = DEFAULT_MAX_BUCKETS,
    names: list[str] | None = None,
    *,
    only: tuple[str, ...] = (),
    skip: tuple[str, ...] = (),
) -> SeriesSnapshot:
    """Every series of a job (or those in `names`; else those whose name starts with one of
    `only` when given, and with none of `skip`) as by `read_series` (every point when
    `max_buckets` is None), and the id of the newest row they hold, all from one snapshot of
    the database. A view that draws some prefixes passes them, so that the others (a long
    job's `sys/` series) cost it nothing but their names."""
    with _snapshot_tx(engine) as connection:
        last_id = _last_metric_id(connection, job_id)
        if names is None:
            names = [
                name
                for name in _series_names(connection, job_id)
                if (not only or name.startswith(only)) and not name.startswith(skip)
            ]
        series = {name: _read_series(connection, job_id, name, max_buckets) for name in names}
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

"""Reading metric series for charts (db.series), on SQLite and on Postgres."""

from __future__ import annotations

import numpy as np

from db import queue
from db.series import Buckets, read_series, rows_since, snapshot
from db.telemetry import MetricPoint, write_metrics


def _job(engine) -> int:
    return queue.submit(engine, {"name": "series"})


def _write_loss(engine, job_id: int, values: np.ndarray, first_step: int = 0) -> None:
    points = [
        MetricPoint("batch/train_loss", first_step + i, float(v)) for i, v in enumerate(values)
    ]
    write_metrics(engine, job_id, points)


def test_short_series_comes_back_point_by_point(engine):
    job_id = _job(engine)
    values = np.linspace(2.0, 0.5, 30)
    _write_loss(engine, job_id, values)

    series = read_series(engine, job_id, "batch/train_loss", max_buckets=20)

    assert series.is_raw
    assert series.first_step.tolist() == list(range(30))
    np.testing.assert_allclose(series.low, values)


def test_long_series_is_bucketed_and_keeps_its_extremes(engine):
    job_id = _job(engine)
    other_job = _job(engine)
    rng = np.random.default_rng(3)
    values = 1.0 + rng.normal(0, 0.01, 3000)
    values[1234] = 9.0  # a spike
    values[2500] = -4.0  # and a dip
    _write_loss(engine, job_id, values)
    _write_loss(engine, other_job, np.full(3000, 100.0))

    series = read_series(engine, job_id, "batch/train_loss", max_buckets=40)

    assert 30 <= len(series) <= 40
    assert not series.is_raw
    assert series.point_count == 3000
    assert series.high.max() == 9.0
    assert series.low.min() == -4.0
    spike_bucket = int(np.argmax(series.high))
    assert series.first_step[spike_bucket] <= 1234 <= series.last_step[spike_bucket]
    np.testing.assert_allclose(series.total.sum(), values.sum())
    assert series.first_step[0] == 0
    assert series.last_step[-1] == 2999
    assert np.all(np.diff(series.first_step) > 0)


def test_snapshot_then_only_newer_rows(engine):
    job_id = _job(engine)
    _write_loss(engine, job_id, np.arange(10, dtype=float))
    write_metrics(
        engine,
        job_id,
        [MetricPoint("epoch/valid_loss", 0, 0.7, epoch=0), MetricPoint("epoch/accuracy", 0, 0.5)],
    )

    first = snapshot(engine, job_id)
    assert sorted(first.series) == ["batch/train_loss", "epoch/accuracy", "epoch/valid_loss"]
    assert first.series["batch/train_loss"].point_count == 10

    nothing = rows_since(engine, job_id, first.last_id)
    assert nothing.series == {} and nothing.complete and nothing.last_id == first.last_id

    _write_loss(engine, job_id, np.array([5.0, 6.0]), first_step=10)
    write_metrics(engine, job_id, [MetricPoint("epoch/valid_loss", 1, 0.6, epoch=1)])
    newer = rows_since(engine, job_id, first.last_id)
    assert newer.complete
    assert newer.series["batch/train_loss"].first_step.tolist() == [10, 11]
    assert newer.series["epoch/valid_loss"].low.tolist() == [0.6]
    assert newer.last_id > first.last_id

    merged = first.series["batch/train_loss"].extend(newer.series["batch/train_loss"])
    assert merged.first_step.tolist() == list(range(12))


def test_rows_since_says_when_there_were_more_than_the_limit(engine):
    job_id = _job(engine)
    _write_loss(engine, job_id, np.ones(25))

    partial = rows_since(engine, job_id, 0, limit=10)

    assert not partial.complete
    assert partial.series["batch/train_loss"].point_count == 10


def test_coarsen_merges_neighbours_and_keeps_min_max_sum():
    steps = np.arange(1000)
    values = np.sin(steps / 50.0)
    values[777] = 5.0
    raw = Buckets.from_points(steps, values)

    coarse = raw.coarsen(100)

    assert len(coarse) <= 100
    assert coarse.point_count == 1000
    assert coarse.high.max() == 5.0
    np.testing.assert_allclose(coarse.total.sum(), values.sum())
    assert coarse.first_step[0] == 0 and coarse.last_step[-1] == 999
    assert raw.coarsen(2000) is raw


def test_extend_sorts_points_that_arrive_out_of_order():
    early = Buckets.from_points(np.array([0, 1, 5]), np.array([1.0, 2.0, 3.0]))
    late = Buckets.from_points(np.array([3, 6]), np.array([4.0, 5.0]))

    merged = early.extend(late)

    assert merged.first_step.tolist() == [0, 1, 3, 5, 6]
    assert merged.low.tolist() == [1.0, 2.0, 4.0, 3.0, 5.0]
    assert Buckets.empty().extend(late) is late

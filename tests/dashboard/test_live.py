"""What a job page keeps between refreshes (dashboard.live.LiveJob)."""

from __future__ import annotations

import numpy as np

from dashboard import live
from db import queue
from db.telemetry import MetricPoint, write_metrics


def _points(first: int, count: int) -> list[MetricPoint]:
    return [
        MetricPoint("batch/train_loss", step, float(step)) for step in range(first, first + count)
    ]


def test_refresh_appends_new_points_and_merges_buckets_past_the_budget(sqlite_engine):
    job_id = queue.submit(sqlite_engine, {"name": "live"})
    write_metrics(sqlite_engine, job_id, _points(0, 15))
    state = live.LiveJob(job_id, max_buckets=10)

    assert state.refresh(sqlite_engine) == 15
    assert state.get("batch/train_loss").is_raw  # 15 steps: within twice the budget

    write_metrics(sqlite_engine, job_id, _points(15, 30))
    assert state.refresh(sqlite_engine) == 30

    series = state.get("batch/train_loss")
    assert len(series) <= 20 and series.point_count == 45
    assert series.low.min() == 0 and series.high.max() == 44
    np.testing.assert_allclose(series.total.sum(), sum(range(45)))
    assert state.refresh(sqlite_engine) == 0


def test_a_page_far_behind_reads_the_series_afresh(sqlite_engine, monkeypatch):
    job_id = queue.submit(sqlite_engine, {"name": "behind"})
    write_metrics(sqlite_engine, job_id, _points(0, 5))
    state = live.LiveJob(job_id, max_buckets=10)
    state.refresh(sqlite_engine)

    monkeypatch.setattr(live, "MAX_NEW_ROWS", 20)
    write_metrics(sqlite_engine, job_id, _points(5, 100))
    state.refresh(sqlite_engine)

    series = state.get("batch/train_loss")
    assert series.point_count == 105
    assert len(series) <= 10


def test_points_arriving_in_late_chunks_are_drawn_once_each_with_no_gap(sqlite_engine):
    """On XLA a job's per-batch losses reach the database in chunks, a few steps after their
    steps ran (worker.device_values), while other rows (the epoch's metrics, another series
    running ahead) are written in between: every refresh appends them, and the page ends up
    drawing what one read of the whole series gives."""
    job_id = queue.submit(sqlite_engine, {"name": "chunks"})
    state = live.LiveJob(job_id, max_buckets=10)
    fresh = live.LiveJob(job_id, max_buckets=1000)

    def chunk(name: str, first: int, count: int) -> list[MetricPoint]:
        return [MetricPoint(name, step, float(step % 7)) for step in range(first, first + count)]

    write_metrics(sqlite_engine, job_id, chunk("batch/lr", 0, 25))  # a series ahead
    state.refresh(sqlite_engine)
    for first in range(0, 20, 10):
        write_metrics(sqlite_engine, job_id, chunk("batch/train_loss", first, 10))
        state.refresh(sqlite_engine)
    write_metrics(sqlite_engine, job_id, [MetricPoint("epoch/valid_loss", 0, 1.0)])
    state.refresh(sqlite_engine)
    write_metrics(sqlite_engine, job_id, chunk("batch/train_loss", 20, 5))  # the epoch's tail
    write_metrics(sqlite_engine, job_id, chunk("batch/lr", 25, 20))
    state.refresh(sqlite_engine)
    for first in range(25, 45, 10):
        write_metrics(sqlite_engine, job_id, chunk("batch/train_loss", first, 10))
        state.refresh(sqlite_engine)
    fresh.refresh(sqlite_engine)

    for name in ("batch/train_loss", "batch/lr"):
        drawn, whole = state.get(name), fresh.get(name)
        assert whole.is_raw and list(whole.first_step) == list(range(45))
        assert drawn.point_count == 45, name  # every step once: no gap, no repeat
        assert np.all(np.diff(drawn.first_step) > 0) and drawn.last_step[-1] == 44
        assert np.all(drawn.first_step[1:] == drawn.last_step[:-1] + 1)  # buckets abut
        np.testing.assert_allclose(drawn.total.sum(), whole.total.sum())
        assert drawn.low.min() == whole.low.min() and drawn.high.max() == whole.high.max()
    assert state.get("epoch/valid_loss").point_count == 1

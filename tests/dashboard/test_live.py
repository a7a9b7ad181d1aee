"""What a job page keeps between refreshes (dashboard.live.LiveJob)."""

from __future__ import annotations

import numpy as np

from dashboard import live
from db import queue
from db.telemetry import MetricPoint, add_event, write_metrics


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
    add_event(sqlite_engine, job_id, "info", "epoch 1")
    assert state.refresh(sqlite_engine) == 30

    series = state.get("batch/train_loss")
    assert len(series) <= 20 and series.point_count == 45
    assert series.low.min() == 0 and series.high.max() == 44
    np.testing.assert_allclose(series.total.sum(), sum(range(45)))
    assert [event.message for event in state.log][-1] == "epoch 1"
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

"""Metric points on both backends."""

from __future__ import annotations

import math

from db import queue
from db.telemetry import MetricPoint, metric_series, write_metrics


def test_non_finite_values_are_skipped_and_the_rest_of_the_batch_is_stored(engine):
    """A diverged run's NaN loss must not fail the batch it came in (SQLite would store NULL
    into a NOT NULL column and the whole write would be refused, again and again)."""
    job_id = queue.submit(engine, {"name": "diverging"})
    points = [
        MetricPoint("batch/train_loss", 0, 2.3),
        MetricPoint("batch/train_loss", 1, math.inf),
        MetricPoint("batch/train_loss", 2, math.nan),
        MetricPoint("batch/train_loss", 3, -math.inf),
        MetricPoint("batch/lr", 3, 1e-3),
    ]
    assert write_metrics(engine, job_id, points) == 2
    assert metric_series(engine, job_id, "batch/train_loss") == [(0, 2.3)]
    assert metric_series(engine, job_id, "batch/lr") == [(3, 1e-3)]
    assert write_metrics(engine, job_id, [MetricPoint("epoch/valid_loss", 0, math.nan)]) == 0
    assert metric_series(engine, job_id, "epoch/valid_loss") == []

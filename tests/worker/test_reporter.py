"""The telemetry writer keeps every point through failed writes, whatever the error says."""

from __future__ import annotations

import pytest

from common.errors import error_summary, first_line
from db import queue, telemetry
from db.telemetry import MetricPoint, metric_series
from worker.reporter import TelemetryWriter


@pytest.mark.parametrize("error", [TimeoutError(), OSError(""), RuntimeError("  \n")])
def test_a_write_failing_with_an_empty_message_loses_no_point(engine, monkeypatch, error):
    job_id = queue.submit(engine, {"name": "telemetry"})
    lease = queue.claim(engine, "w1").lease
    real_write = telemetry.write_metrics
    calls = []

    def fail_once(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise error
        return real_write(*args, **kwargs)

    monkeypatch.setattr(telemetry, "write_metrics", fail_once)
    writer = TelemetryWriter(engine, lease, flush_interval_s=0.05)
    try:
        writer.add_points([MetricPoint("batch/train_loss", step, 1.0 + step) for step in range(5)])
        writer.add_event("info", "epoch 1 started")
        assert writer.flush(timeout_s=30), "the writer thread gave up after the failed write"
        writer.add_points([MetricPoint("batch/train_loss", 5, 6.0)])
        assert writer.flush(timeout_s=30)
    finally:
        writer.close()
    assert len(calls) >= 2, "the failed write was retried"
    assert metric_series(engine, job_id, "batch/train_loss") == [
        (step, 1.0 + step) for step in range(6)
    ]
    messages = [event.message for event in telemetry.events_since(engine, job_id)]
    assert messages.count("epoch 1 started") == 1


def test_first_line_names_the_error_when_it_has_no_message():
    assert first_line(TimeoutError()) == "TimeoutError"
    assert first_line(ValueError("  first\nsecond")) == "first"
    assert error_summary(TimeoutError()) == "TimeoutError"
    assert error_summary(OSError("disk\nmore")) == "OSError: disk"

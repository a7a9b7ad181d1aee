"""The supervisor around a real training child: cancel, time limit, SIGTERM, failures."""

from __future__ import annotations

import shutil
import signal

import pytest

from common.files import job_dir
from db import queue, telemetry
from tests.support.workers import run_worker, start_worker, wait_for

pytestmark = pytest.mark.slow

LONG_JOB = {"epochs": 200, "img_size": 16, "bs": 16, "device": "cpu"}


def _trained_batches(engine, job_id: int) -> int:
    return len(telemetry.metric_series(engine, job_id, "batch/train_loss"))


def test_cancel_stops_a_running_job_within_moments(sqlite_engine, small_digits):
    job_id = queue.submit(sqlite_engine, {**LONG_JOB, "dataset": small_digits(per_class=20)})
    worker = start_worker("--once", TRAINDECK_HEARTBEAT_INTERVAL="0.5")
    try:
        wait_for(lambda: queue.get_job(sqlite_engine, job_id).epoch >= 1, 300, "an epoch")
        assert queue.cancel(sqlite_engine, job_id) == "cancelling"
        output, _ = worker.communicate(timeout=120)
    finally:
        worker.kill()
    assert worker.returncode == 0, output[-3000:]
    job = queue.get_job(sqlite_engine, job_id)
    assert job.status == "cancelled"
    assert job.epoch < 10, "stopped long before the end"
    assert (job_dir(job_id) / "checkpoint.pth").exists(), "the last checkpoint is kept"


def test_time_limit_stops_and_fails_the_job_with_that_reason(sqlite_engine, small_digits):
    job_id = queue.submit(
        sqlite_engine, {**LONG_JOB, "dataset": small_digits(per_class=20), "time_limit": 20}
    )
    result = run_worker("--once", TRAINDECK_HEARTBEAT_INTERVAL="0.5")
    assert result.returncode == 0, result.stderr[-3000:]
    job = queue.get_job(sqlite_engine, job_id)
    assert job.status == "failed"
    assert "time limit of 20 s" in job.error


def test_sigterm_requeues_the_running_job_and_exits(sqlite_engine, small_digits):
    job_id = queue.submit(sqlite_engine, {**LONG_JOB, "dataset": small_digits(per_class=20)})
    worker = start_worker(TRAINDECK_HEARTBEAT_INTERVAL="0.5")
    try:
        wait_for(lambda: _trained_batches(sqlite_engine, job_id) >= 3, 300, "a few batches")
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=120)
    finally:
        worker.kill()
    assert worker.returncode == 0, output[-3000:]
    job = queue.get_job(sqlite_engine, job_id)
    assert job.status == "queued"
    assert job.attempts == 0, "a graceful shutdown does not spend an attempt"
    messages = [event.message for event in telemetry.events_since(sqlite_engine, job_id)]
    assert any("requeued" in m and "shut down" in m for m in messages), messages


def test_failing_jobs_fail_with_a_clear_message_and_the_worker_goes_on(
    sqlite_engine, small_digits, data_dir
):
    dataset = small_digits(per_class=10, classes=3)
    missing = queue.submit(
        sqlite_engine, {"dataset": dataset, "epochs": 1, "bs": 8, "device": "cpu"}
    )
    shutil.rmtree(data_dir / "subsets")
    offline = queue.submit(
        sqlite_engine, {"pretrained": True, "arch": "resnet34", "epochs": 1, "device": "cpu"}
    )
    result = run_worker("--max-jobs", "2")
    assert result.returncode == 0, result.stderr[-3000:]

    gone = queue.get_job(sqlite_engine, missing)
    assert gone.status == "failed"
    assert "does not exist" in gone.error and "Traceback" not in gone.error

    no_weights = queue.get_job(sqlite_engine, offline)
    assert no_weights.status == "failed"
    assert "resnet34-" in no_weights.error and ".pth" in no_weights.error
    assert "Pre-fetch" in no_weights.error and "Traceback" not in no_weights.error

"""`queue.requeue_jobs_of_worker`: a vanished machine's jobs go back to the queue at once."""

from __future__ import annotations

from db import queue
from db.telemetry import events_since

REASON = "its TPU VM 'spot-1' was preempted"


def _running_on(engine, worker_id: str, count: int) -> list[int]:
    job_ids = [queue.submit(engine, {"name": f"job {i}"}) for i in range(count)]
    for _ in job_ids:
        assert queue.claim(engine, worker_id) is not None
    return job_ids


def test_running_jobs_of_the_worker_are_requeued_with_the_reason(engine):
    mine = _running_on(engine, "tpu-spot-1", 2)
    other = _running_on(engine, "tpu-other", 1)

    outcomes = queue.requeue_jobs_of_worker(engine, "tpu-spot-1", REASON)

    assert sorted(outcomes) == [(job_id, "queued") for job_id in mine]
    for job_id in mine:
        job = queue.get_job(engine, job_id)
        assert (job.status, job.worker_id, job.heartbeat_at) == ("queued", None, None)
        messages = [event.message for event in events_since(engine, job_id, 0)]
        assert messages[-1] == f"requeued: {REASON}"
    assert queue.get_job(engine, other[0]).status == "running"
    assert queue.get_job(engine, other[0]).worker_id == "tpu-other"


def test_the_old_lease_is_void_and_another_worker_resumes_the_job(engine):
    job_id = queue.submit(engine, {"name": "resumable"})
    first = queue.claim(engine, "tpu-spot-1")
    queue.requeue_jobs_of_worker(engine, "tpu-spot-1", REASON)

    second = queue.claim(engine, "tpu-survivor")

    assert second is not None and second.id == job_id and second.attempts == 2
    assert not queue.heartbeat(engine, first.lease).still_owned
    assert not queue.finish(engine, first.lease, "succeeded")
    assert queue.get_job(engine, job_id).status == "running"


def test_spent_attempts_fail_and_requested_cancels_cancel(engine):
    exhausted = queue.submit(engine, {"name": "last try", "max_attempts": 1})
    cancelling = queue.submit(engine, {"name": "being cancelled"})
    assert queue.claim(engine, "tpu-spot-1").id == exhausted
    assert queue.claim(engine, "tpu-spot-1").id == cancelling
    queue.cancel(engine, cancelling)

    outcomes = dict(queue.requeue_jobs_of_worker(engine, "tpu-spot-1", REASON))

    assert outcomes == {exhausted: "failed", cancelling: "cancelled"}
    assert queue.get_job(engine, exhausted).error == f"{REASON}, and all its attempts are used"
    assert queue.get_job(engine, cancelling).status == "cancelled"


def test_a_second_call_changes_nothing(engine):
    (job_id,) = _running_on(engine, "tpu-spot-1", 1)
    queue.requeue_jobs_of_worker(engine, "tpu-spot-1", REASON)

    assert queue.requeue_jobs_of_worker(engine, "tpu-spot-1", REASON) == []
    assert queue.requeue_jobs_of_worker(engine, "tpu-nobody", REASON) == []
    assert queue.get_job(engine, job_id).status == "queued"
    assert len([e for e in events_since(engine, job_id, 0) if REASON in e.message]) == 1

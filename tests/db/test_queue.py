"""The job queue on SQLite and on the real PostgreSQL server."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from db import queue
from db.engine import write_tx
from db.models import Job, utcnow
from db.spec import SpecError
from db.telemetry import events_since

CLAIMER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from db.engine import create_db_engine
    from db.queue import claim

    url, worker_id, go_file, out_file = sys.argv[1:]
    engine = create_db_engine(url)
    engine.connect().close()
    Path(out_file + ".ready").touch()
    while not Path(go_file).exists():
        time.sleep(0.005)
    claimed = []
    while (job := claim(engine, worker_id)) is not None:
        claimed.append(job.id)
    Path(out_file).write_text(json.dumps(claimed))
    """
)


def _submit_many(engine, count: int, **fields) -> list[int]:
    return [queue.submit(engine, {"name": f"job {i}", **fields}) for i in range(count)]


def _age_heartbeat(engine, job_id: int, seconds: float) -> None:
    with write_tx(engine) as connection:
        connection.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(heartbeat_at=utcnow() - timedelta(seconds=seconds))
        )


@pytest.mark.slow
def test_racing_claimers_take_each_job_exactly_once(engine, database_url, tmp_path: Path):
    job_ids = _submit_many(engine, 240)
    go_file = tmp_path / "go"
    outputs = [tmp_path / f"claimed-{i}.json" for i in range(4)]
    claimers = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, database_url, f"w{i}", str(go_file), str(out)]
        )
        for i, out in enumerate(outputs)
    ]
    deadline = time.monotonic() + 60
    while not all(Path(f"{out}.ready").exists() for out in outputs):
        assert time.monotonic() < deadline, "claimers did not start"
        time.sleep(0.05)
    go_file.touch()  # every claimer is connected and waiting: now they race
    for claimer in claimers:
        assert claimer.wait(timeout=120) == 0
    claimed = [job_id for out in outputs for job_id in json.loads(out.read_text())]

    assert sorted(claimed) == sorted(job_ids), "every job claimed exactly once"
    # SQLite's busy handler may let one process take a long run of jobs; what matters is
    # that several claimers really competed and none took a job another one had.
    assert sum(1 for out in outputs if json.loads(out.read_text())) >= 2, "claimers raced"
    jobs = queue.list_jobs(engine)
    assert {job.status for job in jobs} == {"running"}
    assert {job.attempts for job in jobs} == {1}


def test_claim_takes_priority_first_then_oldest(engine):
    low = queue.submit(engine, {"priority": -5})
    first_normal = queue.submit(engine, {})
    high = queue.submit(engine, {"priority": 10})
    second_normal = queue.submit(engine, {})
    order = [queue.claim(engine, "w").id for _ in range(4)]
    assert order == [high, first_normal, second_normal, low]
    assert queue.claim(engine, "w") is None


def test_claim_on_empty_queue_returns_none(engine):
    assert queue.claim(engine, "w") is None


def test_claimed_job_carries_its_spec_and_lease(engine):
    job_id = queue.submit(engine, {"epochs": 7, "bs": 16})
    claimed = queue.claim(engine, "worker-a")
    assert claimed.id == job_id
    assert claimed.spec["epochs"] == 7 and claimed.spec["bs"] == 16
    assert claimed.lease.worker_id == "worker-a"
    assert claimed.attempts == 1
    job = queue.get_job(engine, job_id)
    assert job.status == "running" and job.worker_id == "worker-a"
    assert job.started_at is not None and job.heartbeat_at is not None


def test_finish_succeeded_and_failed(engine):
    ok, bad = _submit_many(engine, 2)
    ok_lease = queue.claim(engine, "w").lease
    bad_lease = queue.claim(engine, "w").lease
    assert queue.finish(engine, ok_lease, "succeeded")
    assert queue.finish(engine, bad_lease, "failed", "Traceback...\nValueError: broken data")
    assert queue.get_job(engine, ok).status == "succeeded"
    failed = queue.get_job(engine, bad)
    assert failed.status == "failed" and "broken data" in failed.error
    assert failed.finished_at is not None
    # A finished job cannot be finished again by a worker holding the old lease.
    assert not queue.finish(engine, ok_lease, "failed", "late")
    assert queue.get_job(engine, ok).status == "succeeded"


def test_stale_running_job_is_requeued_then_failed_when_attempts_run_out(engine):
    job_id = queue.submit(engine, {"max_attempts": 2})
    first = queue.claim(engine, "dead-worker")
    _age_heartbeat(engine, job_id, 120)
    assert queue.requeue_stale(engine, timeout_s=60) == [(job_id, "queued")]
    job = queue.get_job(engine, job_id)
    assert job.status == "queued" and job.worker_id is None

    # The dead worker's lease is gone: its heartbeat and finish change nothing.
    assert not queue.heartbeat(engine, first.lease).still_owned
    assert not queue.finish(engine, first.lease, "succeeded")

    second = queue.claim(engine, "other-worker")
    assert second.id == job_id and second.attempts == 2
    assert queue.heartbeat(engine, second.lease).still_owned
    _age_heartbeat(engine, job_id, 120)
    assert queue.requeue_stale(engine, timeout_s=60) == [(job_id, "failed")]
    job = queue.get_job(engine, job_id)
    assert job.status == "failed" and "no heartbeat" in job.error
    messages = [event.message for event in events_since(engine, job_id)]
    assert any("requeued" in m for m in messages) and any("failed" in m for m in messages)


def test_fresh_heartbeat_is_not_stale(engine):
    queue.submit(engine, {})
    claimed = queue.claim(engine, "w")
    assert queue.heartbeat(engine, claimed.lease).still_owned
    assert queue.requeue_stale(engine, timeout_s=60) == []


def test_cancel_queued_job_is_immediate(engine):
    job_id = queue.submit(engine, {})
    assert queue.cancel(engine, job_id) == "cancelled"
    assert queue.get_job(engine, job_id).status == "cancelled"
    assert queue.claim(engine, "w") is None
    with pytest.raises(queue.JobStateError, match="already cancelled"):
        queue.cancel(engine, job_id)


def test_cancel_running_job_is_requested_and_seen_at_heartbeat(engine):
    job_id = queue.submit(engine, {})
    claimed = queue.claim(engine, "w")
    assert not queue.heartbeat(engine, claimed.lease).cancel_requested
    assert queue.cancel(engine, job_id) == "cancelling"
    assert queue.get_job(engine, job_id).status == "running"
    assert queue.heartbeat(engine, claimed.lease).cancel_requested
    assert queue.finish(engine, claimed.lease, "cancelled")
    assert queue.get_job(engine, job_id).status == "cancelled"


def test_stale_job_with_cancel_requested_becomes_cancelled(engine):
    job_id = queue.submit(engine, {})
    queue.claim(engine, "w")
    queue.cancel(engine, job_id)
    _age_heartbeat(engine, job_id, 300)
    assert queue.requeue_stale(engine, timeout_s=60) == [(job_id, "cancelled")]


def test_cancel_unknown_job(engine):
    with pytest.raises(queue.JobNotFound):
        queue.cancel(engine, 12345)


def test_release_requeues_without_spending_an_attempt(engine):
    job_id = queue.submit(engine, {})
    claimed = queue.claim(engine, "w")
    assert queue.release(engine, claimed.lease, "worker shutting down")
    job = queue.get_job(engine, job_id)
    assert job.status == "queued" and job.attempts == 0
    again = queue.claim(engine, "w2")
    assert again.id == job_id and again.attempts == 1 and again.lease.lease == 2


def test_retry_and_clone_make_new_queued_jobs_with_the_same_spec(engine):
    job_id = queue.submit(engine, {"epochs": 5, "lr": "find"})
    with pytest.raises(queue.JobStateError, match="only a finished job"):
        queue.retry(engine, job_id)
    queue.cancel(engine, job_id)
    retried = queue.retry(engine, job_id)
    cloned = queue.clone(engine, job_id, {"epochs": 9})
    original = queue.get_job(engine, job_id)
    assert queue.get_job(engine, retried).spec == original.spec
    assert queue.get_job(engine, retried).cloned_from == job_id
    clone_spec = queue.get_job(engine, cloned).spec
    assert clone_spec["epochs"] == 9 and clone_spec["lr"] == "find"
    with pytest.raises(SpecError):
        queue.clone(engine, job_id, {"epochs": 0})


def test_delete_only_finished_jobs(engine):
    job_id = queue.submit(engine, {})
    with pytest.raises(queue.JobStateError):
        queue.delete_job(engine, job_id)
    queue.cancel(engine, job_id)
    queue.delete_job(engine, job_id)
    with pytest.raises(queue.JobNotFound):
        queue.get_job(engine, job_id)


@pytest.mark.parametrize(
    ("fields", "field_named"),
    [
        ({"lr": 0}, "lr"),
        ({"lr": -0.1}, "lr"),
        ({"lr": "fast"}, "lr"),
        ({"bs": 0}, "bs"),
        ({"epochs": 0}, "epochs"),
        ({"arch": "alexnet"}, "arch"),
        ({"mixed_precision": "fp16", "device": "xla"}, "mixed_precision"),
        ({"dataset": "no-such-dataset"}, "dataset"),
        ({"img_size": 4}, "img_size"),
        ({"valid_pct": 0.9}, "valid_pct"),
        ({"schedule": "cosine"}, "schedule"),
        ({"device": "tpu9"}, "device"),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
def test_bad_spec_is_refused_naming_the_field(engine, fields, field_named):
    with pytest.raises(SpecError) as refused:
        queue.submit(engine, fields)
    assert field_named in refused.value.problems
    assert queue.list_jobs(engine) == []


def test_counts_by_status(engine):
    _submit_many(engine, 3)
    queue.claim(engine, "w")
    assert queue.count_by_status(engine) == {"queued": 2, "running": 1}

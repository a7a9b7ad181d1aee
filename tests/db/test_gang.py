"""The hosts of a multi-host job's attempt (db.gang), on SQLite and on the real Postgres."""

from __future__ import annotations

import pytest

from db import gang, queue
from db.gang import Seat
from db.spec import SpecError
from db.telemetry import events_since

SLICE = "pod-a"


def _submit(engine, hosts: int = 2, **fields) -> int:
    return queue.submit(engine, {"hosts": hosts, **fields})


def _messages(engine, job_id: int) -> list[str]:
    return [event.message for event in events_since(engine, job_id)]


def test_hosts_is_validated_with_a_message_naming_the_field(engine):
    with pytest.raises(SpecError) as refused:
        queue.submit(engine, {"hosts": 0})
    assert refused.value.problems == {"hosts": "must be at least 1"}
    with pytest.raises(SpecError) as refused:
        queue.submit(engine, {"hosts": 2, "device": "cpu"})
    assert refused.value.problems == {
        "hosts": "a job on 2 hosts runs on a TPU pod slice; use device xla or auto"
    }
    with pytest.raises(SpecError) as refused:
        queue.submit(engine, {"hosts": True})
    assert "hosts" in refused.value.problems
    assert queue.get_job(engine, queue.submit(engine, {})).hosts == 1


def test_each_worker_claims_the_jobs_of_its_own_number_of_hosts(engine):
    two = _submit(engine, hosts=2)
    one = queue.submit(engine, {})
    four = _submit(engine, hosts=4)

    assert queue.claim(engine, "single").id == one
    assert queue.claim(engine, "single") is None, "a single host never takes a slice's job"
    assert queue.claim(engine, "w4", slice_name="big", hosts=4).id == four
    claimed = queue.claim(engine, "w2", slice_name=SLICE, hosts=2)
    assert claimed.id == two
    job = queue.get_job(engine, two)
    assert (job.status, job.slice_name, job.worker_id) == ("running", SLICE, "w2")
    assert "claimed by worker w2 as host 0 of the 2 hosts of slice pod-a (attempt 1)" in (
        _messages(engine, two)
    )
    [host_zero] = gang.members(engine, two, claimed.lease.lease)
    assert (host_zero.host, host_zero.worker_id, host_zero.state) == (0, "w2", "joined")
    with pytest.raises(ValueError):
        queue.claim(engine, "w", hosts=2)


def test_the_other_hosts_join_the_attempt_of_their_slice_once(engine):
    job_id = _submit(engine)
    assert gang.join(engine, "h1", SLICE, 2, 1) is None, "nothing claimed yet"
    claimed = queue.claim(engine, "h0", slice_name=SLICE, hosts=2)
    assert gang.join(engine, "h1", "another-slice", 2, 1) is None
    assert gang.join(engine, "h1", SLICE, 4, 1) is None, "a slice of another size"

    joined = gang.join(engine, "h1", SLICE, 2, 1)
    assert joined is not None
    assert (joined.id, joined.lease.lease, joined.lease.worker_id) == (
        job_id,
        claimed.lease.lease,
        "h1",
    )
    assert joined.spec == claimed.spec and joined.attempts == 1
    assert gang.join(engine, "h1-again", SLICE, 2, 1) is None, "the seat is taken"
    assert [row.host for row in gang.members(engine, job_id, claimed.lease.lease)] == [0, 1]
    assert "host 1 of slice pod-a joined attempt 1 (worker h1)" in _messages(engine, job_id)
    with pytest.raises(ValueError):
        gang.join(engine, "h0", SLICE, 2, 0)


def test_ready_progress_and_leaving_are_counted_per_attempt(engine):
    job_id = _submit(engine)
    first = queue.claim(engine, "h0", slice_name=SLICE, hosts=2).lease
    gang.join(engine, "h1", SLICE, 2, 1)
    zero, one = Seat(job_id, first.lease, 0), Seat(job_id, first.lease, 1)

    assert gang.ready_hosts(engine, job_id, first.lease) == 0
    assert gang.mark_ready(engine, zero)
    assert not gang.mark_ready(engine, zero), "once"
    assert gang.ready_hosts(engine, job_id, first.lease) == 1
    assert gang.mark_ready(engine, one)
    assert gang.ready_hosts(engine, job_id, first.lease) == 2

    before = gang.members(engine, job_id, first.lease)[1]
    assert gang.record_progress(engine, one, 5)
    assert not gang.record_progress(engine, one, 5), "the same step is no progress"
    after = gang.members(engine, job_id, first.lease)[1]
    assert after.step == 5 and after.progress_at >= before.progress_at

    assert gang.beat(engine, one).current(one)
    assert gang.leave(engine, one, "died", "its training process was killed by SIGKILL")
    assert not gang.leave(engine, one, "done"), "a host leaves once"
    assert not gang.beat(engine, one).current(one)
    assert gang.ready_hosts(engine, job_id, first.lease) == 1
    assert not gang.record_progress(engine, one, 9)
    assert "host 1 left the attempt (died): its training process was killed by SIGKILL" in (
        _messages(engine, job_id)
    )

    # Host 0 requeues the job; the new attempt has seats of its own.
    assert queue.requeue_after_crash(engine, first, "host 1 died") == "queued"
    state = gang.beat(engine, zero)
    assert state.seated and state.status == "queued" and not state.current(zero)
    second = queue.claim(engine, "h0", slice_name=SLICE, hosts=2).lease
    assert second.lease == first.lease + 1
    assert gang.join(engine, "h1", SLICE, 2, 1).lease.lease == second.lease
    assert gang.ready_hosts(engine, job_id, second.lease) == 0
    assert [row.state for row in gang.members(engine, job_id, first.lease)] == ["joined", "died"]


def test_a_cancel_reaches_every_host_through_its_beat(engine):
    job_id = _submit(engine)
    lease = queue.claim(engine, "h0", slice_name=SLICE, hosts=2).lease
    gang.join(engine, "h1", SLICE, 2, 1)
    assert queue.cancel(engine, job_id) == "cancelling"
    state = gang.beat(engine, Seat(job_id, lease.lease, 1))
    assert state.current(Seat(job_id, lease.lease, 1)) and state.cancel_requested
    with pytest.raises(ValueError):
        gang.leave(engine, Seat(job_id, lease.lease, 1), "joined")


def test_host_0_leaves_in_the_change_that_ends_the_attempt(engine):
    job_id = _submit(engine)
    lease = queue.claim(engine, "h0", slice_name=SLICE, hosts=2).lease
    why = "it ended the attempt: host 1 of slice pod-a died"
    host_zero = gang.Departure("done", why)
    assert queue.requeue_after_crash(engine, lease, "host 1 died", host_zero=host_zero) == "queued"
    [row] = gang.members(engine, job_id, lease.lease)
    assert (row.state, row.reason) == ("done", why)
    assert not any("host 0 left" in message for message in _messages(engine, job_id)), (
        "the job's own event says why the attempt ended"
    )
    single = queue.submit(engine, {})
    assert queue.finish(engine, queue.claim(engine, "w").lease, "succeeded", host_zero=host_zero)
    assert queue.get_job(engine, single).status == "succeeded", "a job without seats ends alike"
    with pytest.raises(ValueError):
        gang.Departure("joined")

"""Queued resources (issue 25, step 4) through the real `google.cloud.tpu_v2.TpuClient` (REST,
anonymous) against the local fake of the Cloud TPU API: create one, watch its states, requeue
the jobs of a suspended or failed slice as a whole, delete it with its node. Nothing here ran on
a real slice or against Google's API."""

from __future__ import annotations

import pytest

from cloud import watch
from cloud.slices import (
    QueuedResources,
    SliceRequest,
    recover_jobs_of_lost_slices,
    requeue_jobs_of_deleted_slice,
)
from cloud.tpu import (
    AcceleratorTypeRefused,
    NodeRequest,
    NodeRequestError,
    TpuError,
    TpuVms,
    is_worker_of_node,
    recover_jobs_of_lost_nodes,
    worker_id_for_host,
)
from db import queue
from db.telemetry import events_since
from tests.support.fake_tpu_api import FakeTpuApi
from tests.support.tpu import PROJECT, ZONE

SLICE_SCRIPT = "#!/bin/bash\nTRAINDECK_SLICE=pod-1\nlearn_host_index() { :; }\n"


def _request(**changes) -> SliceRequest:
    fields = {
        "name": "pod-1",
        "accelerator_type": "v4-32",
        "runtime_version": "tpu-ubuntu2204-base",
        "startup_script": SLICE_SCRIPT,
        **changes,
    }
    return SliceRequest(NodeRequest(**fields))


@pytest.fixture
def queued(vms: TpuVms) -> QueuedResources:
    return QueuedResources(vms)


def test_create_asks_for_one_node_on_the_spot_tier_and_follows_the_operation(
    fake_api: FakeTpuApi, vms: TpuVms, queued: QueuedResources
):
    fake_api.polls_until_done = 2
    started = queued.create(_request(spot=True))

    assert (started.verb, started.target_name, started.done) == ("create", "pod-1", False)
    (sent,) = fake_api.requests_of("POST", "/queuedResources")
    assert sent.path == f"/v2/projects/{PROJECT}/locations/{ZONE}/queuedResources"
    assert sent.query["queuedResourceId"] == ["pod-1"]
    assert sent.body["spot"] == {} and "guaranteed" not in sent.body
    (spec,) = sent.body["tpu"]["nodeSpec"]
    assert spec["parent"] == f"projects/{PROJECT}/locations/{ZONE}"
    assert spec["nodeId"] == "pod-1"
    assert spec["node"]["acceleratorType"] == "v4-32"
    assert spec["node"]["metadata"] == {"startup-script": SLICE_SCRIPT}
    assert spec["node"]["labels"] == {"managed-by": "traindeck"}
    assert "schedulingConfig" not in spec["node"], "the tier is the queued resource's"
    assert queued.get("pod-1").state == "CREATING"

    finished = vms.wait(started.name, poll_s=0.01, timeout_s=10)

    assert finished.succeeded
    info = queued.get("pod-1")
    assert (info.state, info.state_words) == ("WAITING_FOR_RESOURCES", "waiting for resources")
    assert info.is_waiting and not info.is_lost
    assert (info.tier, info.accelerator_type, info.node_names) == ("spot", "v4-32", ("pod-1",))
    assert info.created_at is not None
    assert vms.list_nodes() == [], "no node before the zone has the capacity"


def test_on_demand_asks_for_no_tier(fake_api: FakeTpuApi, queued: QueuedResources):
    queued.create(_request(spot=False, accelerator_type="v4-8", startup_script="#!/bin/bash\n"))

    (sent,) = fake_api.requests_of("POST", "/queuedResources")
    assert "spot" not in sent.body and "guaranteed" not in sent.body
    assert queued.get("pod-1").tier == "on-demand"


def test_the_states_are_followed_from_the_queue_to_suspension(
    fake_api: FakeTpuApi, vms: TpuVms, queued: QueuedResources
):
    vms.wait(queued.create(_request()).name, poll_s=0.01, timeout_s=10)
    seen = [queued.get("pod-1").state_words]
    fake_api.set_queued_state("pod-1", "PROVISIONING")
    seen.append(queued.get("pod-1").state_words)
    fake_api.provision("pod-1")
    seen.append(queued.get("pod-1").state_words)
    (node,) = vms.list_nodes()
    fake_api.set_queued_state("pod-1", "SUSPENDING", initiator="SERVICE")
    seen.append(queued.get("pod-1").state_words)
    fake_api.suspend("pod-1")
    (listed,) = queued.list()
    seen.append(listed.state_words)

    assert seen == [
        "waiting for resources",
        "provisioning its TPU VMs",
        "active",
        "suspending (its TPU VMs are being deleted), by Google Cloud",
        "suspended (its TPU VMs were deleted), by Google Cloud",
    ]
    assert (node.name, node.queued_resource, node.state, node.pricing) == (
        "pod-1",
        "pod-1",
        "READY",
        "spot",
    )
    assert listed.is_lost and listed.initiator == "SERVICE"
    assert vms.list_nodes() == [], "a suspended request's node is deleted"


def test_a_failed_request_says_why(fake_api: FakeTpuApi, queued: QueuedResources):
    fake_api.add_queued_resource(PROJECT, ZONE, "pod-1", "v4-32")
    fake_api.fail_queued("pod-1", 8, "There is no more capacity in the zone")

    info = queued.get("pod-1")

    assert info.state == "FAILED" and info.is_lost
    assert info.error == "There is no more capacity in the zone (RESOURCE_EXHAUSTED)"
    assert info.state_words == "failed: There is no more capacity in the zone (RESOURCE_EXHAUSTED)"


def _slice_job(engine, fake_api: FakeTpuApi, name: str = "pod-1") -> int:
    """A queued resource whose slice is ACTIVE, and a job that its host 0's worker claimed
    (the workers of the other hosts join that attempt: the gang's job is one row)."""
    fake_api.add_queued_resource(PROJECT, ZONE, name, "v4-32", startup_script=SLICE_SCRIPT)
    fake_api.provision(name)
    job_id = queue.submit(engine, {"name": f"digits on {name}"})
    claimed = queue.claim(engine, worker_id_for_host(name, 0))
    assert claimed is not None and claimed.id == job_id
    return job_id


def test_a_suspended_slice_requeues_its_job_once_with_the_reason(
    engine, fake_api: FakeTpuApi, queued: QueuedResources
):
    job_id = _slice_job(engine, fake_api)
    fake_api.add_queued_resource(PROJECT, ZONE, "steady", startup_script="#!/bin/bash\n")
    fake_api.provision("steady")
    bystander = queue.submit(engine, {"name": "on the steady slice"})
    assert queue.claim(engine, "tpu-steady").id == bystander

    assert recover_jobs_of_lost_slices(engine, queued.list()) == [], "nothing is lost yet"
    fake_api.suspend("pod-1")
    recoveries = recover_jobs_of_lost_slices(engine, queued.list())

    assert [(r.node, r.state, r.worker_id, r.outcomes) for r in recoveries] == [
        ("pod-1", "SUSPENDED", "tpu-pod-1", [(job_id, "queued")])
    ]
    assert recoveries[0].summary() == (
        f"Queued resource pod-1 was suspended by Google Cloud (its TPU VMs were deleted): "
        f"job {job_id} → queued"
    )
    job = queue.get_job(engine, job_id)
    assert (job.status, job.worker_id) == ("queued", None)
    assert events_since(engine, job_id)[-1].message == (
        "requeued: its queued resource pod-1 was suspended by Google Cloud "
        "(its TPU VMs were deleted)"
    )
    assert queue.get_job(engine, bystander).status == "running"
    assert recover_jobs_of_lost_slices(engine, queued.list()) == [], "only once"


@pytest.mark.parametrize(
    ("state", "words"),
    [
        ("SUSPENDING", "is being suspended by Google Cloud"),
        ("FAILED", "failed"),
        ("DELETING", "is being deleted"),
    ],
)
def test_every_state_without_a_slice_requeues(
    sqlite_engine, fake_api: FakeTpuApi, queued: QueuedResources, state: str, words: str
):
    job_id = _slice_job(sqlite_engine, fake_api)
    fake_api.set_queued_state("pod-1", state, initiator="SERVICE")

    (recovery,) = recover_jobs_of_lost_slices(sqlite_engine, queued.list())

    assert recovery.outcomes == [(job_id, "queued")]
    assert f"its queued resource pod-1 {words}" in events_since(sqlite_engine, job_id)[-1].message


def test_the_jobs_of_every_host_of_a_slice_go_back(sqlite_engine, fake_api, vms, queued):
    """Whichever host's worker holds a job, the slice's loss takes it back; a node of the same
    name prefix is another node."""
    fake_api.add_queued_resource(PROJECT, ZONE, "pod-1", "v4-32", startup_script=SLICE_SCRIPT)
    fake_api.provision("pod-1")
    jobs = [queue.submit(sqlite_engine, {"name": f"job {i}"}) for i in range(3)]
    for host, job_id in ((0, jobs[0]), (3, jobs[1])):
        assert queue.claim(sqlite_engine, worker_id_for_host("pod-1", host)).id == job_id
    assert queue.claim(sqlite_engine, "tpu-pod-1x-host1").id == jobs[2]
    fake_api.set_state("pod-1", "PREEMPTED")

    by_node = recover_jobs_of_lost_nodes(sqlite_engine, vms.list_nodes())

    assert sorted((r.worker_id, r.outcomes[0][0]) for r in by_node) == [
        ("tpu-pod-1", jobs[0]),
        ("tpu-pod-1-host3", jobs[1]),
    ]
    assert queue.get_job(sqlite_engine, jobs[2]).status == "running"
    assert is_worker_of_node("tpu-pod-1", "pod-1")
    assert is_worker_of_node("tpu-pod-1-host12", "pod-1")
    assert not is_worker_of_node("tpu-pod-1-hostx", "pod-1")
    assert not is_worker_of_node("tpu-pod-10", "pod-1")


def test_delete_forces_the_node_away_then_the_queued_resource(
    sqlite_engine, fake_api: FakeTpuApi, vms: TpuVms, queued: QueuedResources
):
    job_id = _slice_job(sqlite_engine, fake_api)
    info = queued.get("pod-1")

    started = queued.delete("pod-1")
    recoveries = requeue_jobs_of_deleted_slice(sqlite_engine, info)

    (sent,) = fake_api.requests_of("DELETE")
    assert sent.path.endswith("/queuedResources/pod-1") and sent.query["force"] == ["true"]
    assert queued.get("pod-1").state == "DELETING"
    assert fake_api.node("pod-1")["state"] == "DELETING"
    assert [r.summary() for r in recoveries] == [
        f"Queued resource pod-1 is being deleted: job {job_id} → queued"
    ]
    assert vms.wait(started.name, poll_s=0.01, timeout_s=10).succeeded
    assert queued.list() == [] and vms.list_nodes() == []
    with pytest.raises(TpuError, match=r"^Not found while reading queued resource pod-1"):
        queued.get("pod-1")


def test_the_fake_refuses_to_delete_an_active_request_without_force(vms: TpuVms, fake_api):
    """What the API documents, and why `QueuedResources.delete` forces."""
    fake_api.add_queued_resource(PROJECT, ZONE, "pod-1")
    fake_api.provision("pod-1")

    with pytest.raises(Exception, match="while its nodes exist"):
        vms.client.delete_queued_resource(name=f"{vms.parent}/queuedResources/pod-1")


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        (
            {"startup_script": "#!/bin/bash\necho one worker\n"},
            AcceleratorTypeRefused,
            "v4-32 is a slice of 4 hosts, and its startup script must start a worker on every "
            "host: this one is not the script written for a slice (it has no learn_host_index "
            "step).",
        ),
        (
            {"accelerator_type": "v9-8"},
            AcceleratorTypeRefused,
            f"The accelerator type v9-8 is not offered in {ZONE}; types offered there: v2-8,",
        ),
        ({"name": "Pod 1"}, NodeRequestError, "The name 'Pod 1' is not a valid TPU VM name"),
        ({"runtime_version": " "}, NodeRequestError, "The runtime version ' ' is empty"),
        ({"network": "a b"}, NodeRequestError, "The network 'a b' is neither a name"),
    ],
)
def test_a_request_that_cannot_work_is_refused_before_any_create(
    fake_api: FakeTpuApi, queued: QueuedResources, changes, error, message
):
    with pytest.raises(error) as caught:
        queued.create(_request(**changes))

    assert str(caught.value).startswith(message)
    assert fake_api.requests_of("POST") == []


def test_a_type_without_a_topology_is_refused(fake_api: FakeTpuApi, queued: QueuedResources):
    fake_api.accelerator_types = {"v4-32": ("V4", "")}

    with pytest.raises(AcceleratorTypeRefused, match="gives no topology for v4-32"):
        queued.create(_request())
    assert fake_api.requests_of("POST") == []


def test_api_failures_are_worded_for_a_person(fake_api: FakeTpuApi, queued: QueuedResources):
    fake_api.fail_next("queued_create", 429, "Quota 'TPUV4sPodPerProjectPerZone' exceeded")
    with pytest.raises(TpuError, match=r"^Quota exceeded while requesting queued resource pod-1"):
        queued.create(_request())

    fake_api.fail_next("queued_list", 403, "Permission 'tpu.queuedResources.list' denied")
    with pytest.raises(TpuError) as caught:
        queued.list()
    assert str(caught.value).startswith(
        "Permission denied while listing the queued resources of test-project in us-central2-b"
    )
    assert "roles/tpu.admin" in str(caught.value)

    with pytest.raises(TpuError, match=r"^Not found while deleting queued resource pod-1 and"):
        queued.delete("pod-1")


def test_the_watcher_requeues_a_suspended_slice(
    engine, fake_api: FakeTpuApi, capsys: pytest.CaptureFixture[str]
):
    job_id = _slice_job(engine, fake_api)
    fake_api.suspend("pod-1")

    assert watch.main(["--once"]) == 0

    assert queue.get_job(engine, job_id).status == "queued"
    assert (
        f"Queued resource pod-1 was suspended by Google Cloud (its TPU VMs were deleted): "
        f"job {job_id} → queued"
    ) in capsys.readouterr().out

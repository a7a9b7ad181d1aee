"""A spot TPU VM is preempted: the running job of its worker goes back to the queue at once,
its log says why, and another worker resumes it. On SQLite and on Postgres, through the real
TpuClient and the fake Cloud TPU API."""

from __future__ import annotations

import pytest

from cloud import watch
from cloud.tpu import TpuVms, recover_jobs_of_lost_nodes, worker_id_for_node
from db import queue
from db.telemetry import events_since
from db.workers import register_worker
from tests.support.fake_tpu_api import FakeTpuApi
from tests.support.tpu import PROJECT, ZONE


def _job_running_on_spot_node(engine, fake_api: FakeTpuApi, node_name: str = "spot-1") -> int:
    fake_api.add_node(PROJECT, ZONE, node_name, schedulingConfig={"spot": True})
    worker_id = worker_id_for_node(node_name)
    register_worker(engine, worker_id, host=f"{node_name}-host", pid=1234, device="TPU v4-8")
    job_id = queue.submit(engine, {"name": "digits on spot"})
    claimed = queue.claim(engine, worker_id)
    assert claimed is not None and claimed.id == job_id
    return job_id


def test_preempted_node_requeues_its_job_with_the_reason(engine, fake_api: FakeTpuApi, vms):
    job_id = _job_running_on_spot_node(engine, fake_api)
    fake_api.add_node(PROJECT, ZONE, "steady")
    bystander = queue.submit(engine, {"name": "on the steady node"})
    assert queue.claim(engine, worker_id_for_node("steady")).id == bystander

    assert recover_jobs_of_lost_nodes(engine, vms.list_nodes()) == [], "nothing is lost yet"
    fake_api.set_state("spot-1", "PREEMPTED")
    recoveries = recover_jobs_of_lost_nodes(engine, vms.list_nodes())

    assert [(r.node, r.state, r.worker_id, r.outcomes) for r in recoveries] == [
        ("spot-1", "PREEMPTED", "tpu-spot-1", [(job_id, "queued")])
    ]
    assert recoveries[0].summary().startswith("TPU VM spot-1 was preempted")
    job = queue.get_job(engine, job_id)
    assert (job.status, job.worker_id) == ("queued", None)
    last_event = events_since(engine, job_id)[-1]
    assert last_event.level == "warning"
    assert last_event.message == (
        "requeued: its TPU VM spot-1 was preempted (Google Cloud took the spot capacity back)"
    )
    assert queue.get_job(engine, bystander).status == "running"

    assert recover_jobs_of_lost_nodes(engine, vms.list_nodes()) == [], "only once"
    resumed = queue.claim(engine, "tpu-spot-2")
    assert resumed is not None and resumed.id == job_id and resumed.attempts == 2


@pytest.mark.parametrize(
    ("state", "words"), [("TERMINATED", "was terminated"), ("STOPPED", "was stopped")]
)
def test_other_states_without_a_vm_count_as_lost(
    sqlite_engine, fake_api: FakeTpuApi, vms: TpuVms, state: str, words: str
):
    job_id = _job_running_on_spot_node(sqlite_engine, fake_api)
    fake_api.set_state("spot-1", state)

    (recovery,) = recover_jobs_of_lost_nodes(sqlite_engine, vms.list_nodes())

    assert recovery.outcomes == [(job_id, "queued")]
    assert words in events_since(sqlite_engine, job_id)[-1].message


def test_a_job_out_of_attempts_fails_with_the_reason(sqlite_engine, fake_api, vms):
    fake_api.add_node(PROJECT, ZONE, "spot-1", schedulingConfig={"spot": True})
    job_id = queue.submit(sqlite_engine, {"name": "last try", "max_attempts": 1})
    queue.claim(sqlite_engine, "tpu-spot-1")
    fake_api.set_state("spot-1", "PREEMPTED")

    (recovery,) = recover_jobs_of_lost_nodes(sqlite_engine, vms.list_nodes())

    assert recovery.outcomes == [(job_id, "failed")]
    assert queue.get_job(sqlite_engine, job_id).error == (
        "its TPU VM spot-1 was preempted (Google Cloud took the spot capacity back), "
        "and all its attempts are used"
    )


def test_the_watcher_requeues_without_the_page(
    engine, fake_api: FakeTpuApi, capsys: pytest.CaptureFixture[str]
):
    job_id = _job_running_on_spot_node(engine, fake_api)
    fake_api.set_state("spot-1", "PREEMPTED")

    assert watch.main(["--once"]) == 0

    assert queue.get_job(engine, job_id).status == "queued"
    output = capsys.readouterr().out
    assert f"watching the TPU VMs of {PROJECT} in {ZONE}" in output
    assert (
        f"TPU VM spot-1 was preempted (Google Cloud took the spot capacity back): "
        f"job {job_id} → queued"
    ) in output


def test_the_watcher_says_what_is_wrong(
    sqlite_engine, fake_api: FakeTpuApi, monkeypatch, capsys: pytest.CaptureFixture[str]
):
    fake_api.fail_next("list", 403, "Permission 'tpu.nodes.list' denied")
    assert watch.main(["--once"]) == 1
    assert "could not check: Permission denied while listing" in capsys.readouterr().out

    monkeypatch.delenv("TRAINDECK_TPU_ZONE")
    with pytest.raises(SystemExit) as exited:
        watch.main(["--once"])
    assert exited.value.code == 2
    assert "say --project and --zone" in capsys.readouterr().err

    monkeypatch.delenv("TRAINDECK_TPU_CREDENTIALS")
    assert watch.main(["--once", "--zone", ZONE]) == 2
    assert "gcloud auth application-default login" in capsys.readouterr().err

"""The TPU VMs page's queued resources (issue 25, step 4) in Streamlit's AppTest, on the fake
Cloud TPU API and a real database: where each stands, a multi-host slice requested as one and
marked experimental, a suspended slice's job requeued, a queued resource deleted with its node."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from cloud.tpu import EXPERIMENTAL_SLICE, worker_id_for_host
from db import queue
from db.telemetry import events_since
from tests.support.fake_tpu_api import FakeTpuApi
from tests.support.markdown import links_and_images, shown
from tests.support.tpu import PROJECT, ZONE

PAGE = str(Path(__file__).resolve().parents[2] / "dashboard" / "pages" / "tpu_vms.py")


@pytest.fixture
def page(sqlite_engine, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("TRAINDECK_SOURCE_URL", "https://github.com/example/traindeck.git")
    monkeypatch.setenv(
        "TRAINDECK_WORKER_DATABASE_URL", "postgresql://trainer:secret@10.128.0.9:5432/traindeck"
    )
    return AppTest.from_file(PAGE, default_timeout=30)


def _run(app: AppTest) -> AppTest:
    app.run()
    assert not app.exception, [e.message for e in app.exception]
    return app


def _texts(app: AppTest, kind: str) -> list[str]:
    return [element.value for element in getattr(app, kind)]


def _queued_table(app: AppTest):
    (table,) = [t for t in app.dataframe if "Tier" in t.value.columns]
    return table.value.set_index("Name")


def test_each_queued_resource_shows_where_it_stands(page: AppTest, fake_api: FakeTpuApi):
    fake_api.add_queued_resource(PROJECT, ZONE, "waiting", "v4-32")
    fake_api.add_queued_resource(PROJECT, ZONE, "running", "v4-8", spot=False)
    fake_api.provision("running")
    fake_api.add_queued_resource(PROJECT, ZONE, "taken", "v5litepod-16")
    fake_api.suspend("taken")
    fake_api.add_queued_resource(PROJECT, ZONE, "refused", "v4-16")
    message = "No capacity *now*: see [help](http://tracker.example/x.png)"
    fake_api.fail_queued("refused", 8, message)

    _run(page)

    rows = _queued_table(page)
    assert list(rows.index) == ["refused", "running", "taken", "waiting"]
    assert rows.loc["waiting", "State"] == "waiting for resources"
    assert rows.loc["running", "State"] == "active"
    assert rows.loc["taken", "State"] == "suspended (its TPU VMs were deleted), by Google Cloud"
    assert rows.loc["refused", "State"] == f"failed: {message} (RESOURCE_EXHAUSTED)"
    assert (rows.loc["waiting", "Hosts"], rows.loc["running", "Hosts"]) == (4, 1)
    assert rows.loc["waiting", "Note"] == EXPERIMENTAL_SLICE
    assert rows.loc["running", "Note"] == ""
    assert (rows.loc["waiting", "Tier"], rows.loc["running", "Tier"]) == ("spot", "on-demand")
    assert rows.loc["running", "TPU VM"] == "running"
    nodes = next(t for t in page.dataframe if "Tier" not in t.value.columns).value
    assert list(nodes["Queued resource"]) == ["running"]

    notes = [shown(text) for text in _texts(page, "warning") + _texts(page, "info")]
    assert any(n.startswith("Queued resource waiting is waiting for resources:") for n in notes)
    assert any(n.startswith("Queued resource taken is suspended") for n in notes)
    (failed,) = [text for text in _texts(page, "warning") if "refused" in text]
    assert links_and_images(failed) == [], "the API's words are shown as text"
    assert message in shown(failed)


def test_a_multi_host_type_is_requested_as_a_queued_resource_marked_experimental(
    page: AppTest, fake_api: FakeTpuApi
):
    _run(page)
    type_box = page.selectbox(key="tpu_new_type")
    assert f"v4-32 (4 hosts, a queued resource: {EXPERIMENTAL_SLICE})" in type_box.options
    assert "v4-8" in type_box.options, "a single-host type has no mark"
    page.text_input(key="tpu_new_name").set_value("pod-1")
    type_box.set_value("v4-32")
    _run(page)

    assert _texts(page, "error") == []
    (notice,) = [shown(t) for t in _texts(page, "warning") if "multi-host" in shown(t)]
    assert notice.startswith("v4-32 is a multi-host slice (4 hosts, 16 chips in a 2x2x4")
    assert "Experimental: not verified on a real slice." in notice
    queued_box = page.checkbox(key="tpu_new_queued_slice")
    assert queued_box.value and queued_box.disabled
    (area,) = [a for a in page.text_area if a.key.startswith("tpu_new_script_")]
    assert "TRAINDECK_SLICE=pod-1\nSLICE_HOSTS=4\n" in area.value
    assert "agent-worker-number" in area.value
    create = page.button(key="tpu_create")
    assert create.label == "Request" and not create.disabled

    create.click()
    _run(page)

    assert fake_api.requests_of("POST", "/nodes") == [], "no plain TPU VM"
    (sent,) = fake_api.requests_of("POST", "/queuedResources")
    assert sent.query["queuedResourceId"] == ["pod-1"] and sent.body["spot"] == {}
    (spec,) = sent.body["tpu"]["nodeSpec"]
    assert (spec["nodeId"], spec["node"]["acceleratorType"]) == ("pod-1", "v4-32")
    script = spec["node"]["metadata"]["startup-script"]
    assert "DATABASE_URL=postgresql://trainer:secret@10.128.0.9:5432/traindeck\n" in script
    assert "WORKER_ID=tpu-pod-1\nTRAINDECK_SLICE=pod-1\n" in script
    _run(page)
    assert _queued_table(page).loc["pod-1", "State"] == "waiting for resources"
    assert any("create pod-1: done in" in text for text in _texts(page, "success"))


def test_a_single_host_type_may_be_queued_too(page: AppTest, fake_api: FakeTpuApi):
    _run(page)
    page.text_input(key="tpu_new_name").set_value("one-1")
    page.checkbox(key="tpu_new_spot").uncheck()
    page.checkbox(key="tpu_new_queued").check()
    _run(page)
    page.button(key="tpu_create").click()
    _run(page)

    (sent,) = fake_api.requests_of("POST", "/queuedResources")
    assert "spot" not in sent.body, "on demand"
    script = sent.body["tpu"]["nodeSpec"][0]["node"]["metadata"]["startup-script"]
    assert "WORKER_ID=tpu-one-1\n" in script and "TRAINDECK_SLICE" not in script.split("\n\n")[1]


def test_bad_input_is_named_and_nothing_is_requested(page: AppTest, fake_api: FakeTpuApi):
    _run(page)
    page.text_input(key="tpu_new_name").set_value("Pod [1](http://tracker.example)")
    page.selectbox(key="tpu_new_type").set_value("v4-32")
    _run(page)

    (info,) = [text for text in _texts(page, "info") if "startup script is written" in text]
    assert "is not a valid TPU VM name" in shown(info)
    assert links_and_images(info) == []
    assert page.button(key="tpu_create").disabled

    page.text_input(key="tpu_new_name").set_value("pod-1")
    page.text_input(key="tpu_new_network").set_value("a b")
    _run(page)
    page.button(key="tpu_create").click()
    _run(page)
    (error,) = _texts(page, "error")
    assert shown(error).startswith("The network 'a b' is neither a name")
    assert fake_api.requests_of("POST") == []


def test_a_suspended_slice_requeues_its_job_on_refresh(
    page: AppTest, fake_api: FakeTpuApi, sqlite_engine
):
    fake_api.add_queued_resource(PROJECT, ZONE, "pod-1", "v4-32")
    fake_api.provision("pod-1")
    job_id = queue.submit(sqlite_engine, {"name": "digits"})
    queue.claim(sqlite_engine, worker_id_for_host("pod-1", 0))
    _run(page)
    assert queue.get_job(sqlite_engine, job_id).status == "running"

    fake_api.suspend("pod-1")
    _run(page)

    assert queue.get_job(sqlite_engine, job_id).status == "queued"
    last_event = events_since(sqlite_engine, job_id)[-1]
    assert "its queued resource pod-1 was suspended" in last_event.message
    assert (
        f"Queued resource pod-1 was suspended by Google Cloud (its TPU VMs were deleted): "
        f"job {job_id} → queued"
    ) in _texts(page, "warning")


def test_deleting_a_queued_resource_asks_first_and_takes_its_node_and_job(
    page: AppTest, fake_api: FakeTpuApi, sqlite_engine
):
    fake_api.add_queued_resource(PROJECT, ZONE, "pod-1", "v4-32")
    fake_api.provision("pod-1")
    job_id = queue.submit(sqlite_engine, {"name": "digits"})
    queue.claim(sqlite_engine, worker_id_for_host("pod-1", 0))
    _run(page)

    page.button(key="tpu_queued_delete").click()
    _run(page)
    assert any("Delete queued resource pod-1?" in shown(t) for t in _texts(page, "warning"))
    assert fake_api.requests_of("DELETE") == [], "nothing happens before the confirmation"
    page.button(key="tpu_queued_confirm_yes").click()
    _run(page)

    (sent,) = fake_api.requests_of("DELETE")
    assert sent.path.endswith("/queuedResources/pod-1") and sent.query["force"] == ["true"]
    assert queue.get_job(sqlite_engine, job_id).status == "queued"
    _run(page)
    assert fake_api.queued_resources == {} and fake_api.nodes == {}
    assert any("delete pod-1: done in" in text for text in _texts(page, "success"))


def test_deleting_a_queued_resources_node_deletes_the_queued_resource(
    page: AppTest, fake_api: FakeTpuApi
):
    fake_api.add_queued_resource(PROJECT, ZONE, "pod-1", "v4-8")
    fake_api.provision("pod-1")
    _run(page)
    assert page.button(key="tpu_recreate").disabled

    page.button(key="tpu_delete").click()
    _run(page)
    (confirm,) = [shown(t) for t in _texts(page, "warning") if "Delete TPU VM" in shown(t)]
    assert "created by the queued resource pod-1, which is deleted with it" in confirm
    page.button(key="tpu_confirm_yes").click()
    _run(page)

    assert fake_api.requests_of("DELETE", "/nodes/pod-1") == []
    assert len(fake_api.requests_of("DELETE", "/queuedResources/pod-1")) == 1


def test_a_failing_list_is_said_and_the_rest_of_the_page_works(page: AppTest, fake_api: FakeTpuApi):
    fake_api.fail_next("queued_list", 403, "Permission 'tpu.queuedResources.list' denied")
    fake_api.add_node(PROJECT, ZONE, "node-1")

    _run(page)

    (error,) = _texts(page, "error")
    assert shown(error).startswith("Permission denied while listing the queued resources of")
    assert [t for t in page.dataframe if "Tier" not in t.value.columns], "the nodes still show"

"""The TPU VMs page in Streamlit's AppTest, on the fake Cloud TPU API and a real database."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from cloud.tpu import worker_id_for_node
from db import queue
from db.telemetry import events_since
from db.workers import register_worker, worker_heartbeat
from tests.support.fake_tpu_api import FakeTpuApi
from tests.support.markdown import links_and_images, shown
from tests.support.tpu import PROJECT, STORE_URL, ZONE

PAGE = str(Path(__file__).resolve().parents[2] / "dashboard" / "pages" / "tpu_vms.py")
WORKER_DATABASE_URL = "postgresql://trainer:secret@10.128.0.9:5432/traindeck"


@pytest.fixture
def page(sqlite_engine, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("TRAINDECK_SOURCE_URL", "https://github.com/example/traindeck.git")
    monkeypatch.setenv("TRAINDECK_WORKER_DATABASE_URL", WORKER_DATABASE_URL)
    return AppTest.from_file(PAGE, default_timeout=30)


def _texts(app: AppTest, kind: str) -> list[str]:
    return [element.value for element in getattr(app, kind)]


def _all_text(app: AppTest) -> str:
    kinds = ("title", "subheader", "markdown", "caption", "info", "warning", "error", "success")
    return "\n".join(str(text) for kind in kinds for text in _texts(app, kind))


def _no_exception(app: AppTest) -> AppTest:
    assert not app.exception, [e.message for e in app.exception]
    return app


def _script_area(app: AppTest):
    (area,) = [area for area in app.text_area if area.key.startswith("tpu_new_script_")]
    return area


def test_without_credentials_the_page_says_how_to_set_them(
    page: AppTest, fake_api: FakeTpuApi, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("TRAINDECK_TPU_CREDENTIALS")

    _no_exception(page.run())

    (warning,) = _texts(page, "warning")
    assert "No Google Cloud credentials were found" in warning
    assert "gcloud auth application-default login" in warning
    assert "Everything else in traindeck works without them" in warning
    assert page.button(key="tpu_check_credentials")
    assert fake_api.requests_of("GET", "/nodes") == [], "no API call without credentials"


def test_the_list_shows_each_node_and_its_worker(
    page: AppTest, fake_api: FakeTpuApi, sqlite_engine
):
    fake_api.add_node(
        PROJECT,
        ZONE,
        "spot-1",
        schedulingConfig={"spot": True},
        networkConfig={"network": "default", "enableExternalIps": True},
        labels={"managed-by": "traindeck"},
    )
    fake_api.add_node(PROJECT, ZONE, "other", acceleratorType="v3-8", state="STOPPED")
    register_worker(sqlite_engine, "tpu-spot-1", host="spot-1", pid=77, device="TPU v4-8")
    job_id = queue.submit(sqlite_engine, {"name": "digits"})
    queue.claim(sqlite_engine, "tpu-spot-1")
    worker_heartbeat(sqlite_engine, "tpu-spot-1", "busy", job_id)

    _no_exception(page.run())

    (table,) = page.dataframe
    rows = table.value.set_index("Name")
    assert list(rows.index) == ["other", "spot-1"]
    assert rows.loc["spot-1", "Accelerator"] == "v4-8"
    assert rows.loc["spot-1", "State"] == "READY"
    assert rows.loc["spot-1", "Pricing"] == "spot"
    assert rows.loc["spot-1", "Worker"] == "tpu-spot-1"
    assert rows.loc["spot-1", "Worker state"].startswith("busy, seen ")
    assert rows.loc["spot-1", "Job"] == job_id
    assert rows.loc["spot-1", "External IP"].startswith("34.100.0.")
    assert rows.loc["other", "Worker"] == "—"
    assert rows.loc["other", "State"] == "STOPPED"
    assert f"Nodes in {PROJECT} / {ZONE}" in _texts(page, "subheader")


def test_create_sends_the_edited_startup_script_and_shows_progress(
    page: AppTest, fake_api: FakeTpuApi
):
    fake_api.polls_until_done = 2
    _no_exception(page.run())
    assert "No TPU VMs here yet" in _all_text(page)
    page.text_input(key="tpu_new_name").set_value("trainer-1")
    page.selectbox(key="tpu_new_type").set_value("v5litepod-8")
    _no_exception(page.run())

    script = _script_area(page).value
    assert "WORKER_ID=tpu-trainer-1" in script
    # The preview masks the password (tests/tpu/test_tpu_secrets.py); the node gets it.
    assert "DATABASE_URL='postgresql://trainer:***@10.128.0.9:5432/traindeck'" in script
    assert f"TRAINDECK_STORE={STORE_URL}\n" in script
    assert page.selectbox(key="tpu_new_runtime_v5litepod-8").value == "v2-alpha-tpuv5-lite"
    edited = script.replace("RestartSec=15", "RestartSec=5")
    _script_area(page).set_value(edited)
    page.button(key="tpu_create").click()
    _no_exception(page.run())

    (sent,) = fake_api.requests_of("POST", "/nodes")
    assert sent.query["nodeId"] == ["trainer-1"]
    assert sent.body["metadata"]["startup-script"] == edited.replace(
        "'postgresql://trainer:***@10.128.0.9:5432/traindeck'", WORKER_DATABASE_URL
    )
    assert sent.body["acceleratorType"] == "v5litepod-8"
    assert sent.body["runtimeVersion"] == "v2-alpha-tpuv5-lite"
    assert sent.body["schedulingConfig"] == {"spot": True}
    assert "Operations" in _texts(page, "subheader")
    assert any("create trainer-1: running for" in bar.proto.text for bar in page.get("progress")), (
        "the operation shows its progress"
    )

    _no_exception(page.run())  # the operation's next poll finishes it

    assert any("create trainer-1: done in" in text for text in _texts(page, "success"))
    rows = page.dataframe[0].value.set_index("Name")
    assert rows.loc["trainer-1", "State"] == "READY"


def test_a_sqlite_database_keeps_create_disabled_with_the_reason(
    page: AppTest, fake_api: FakeTpuApi, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("TRAINDECK_WORKER_DATABASE_URL")
    _no_exception(page.run())
    page.text_input(key="tpu_new_name").set_value("trainer-1")
    _no_exception(page.run())

    assert "The database is a SQLite file on this machine" in _all_text(page)
    assert page.button(key="tpu_create").disabled
    assert [a for a in page.text_area if a.key.startswith("tpu_new_script_")] == []


def test_a_store_on_this_machine_keeps_create_disabled_with_the_reason(
    page: AppTest, fake_api: FakeTpuApi, monkeypatch: pytest.MonkeyPatch
):
    """Unset, TRAINDECK_STORE is a folder under the data folder, which a TPU VM cannot read.
    (A malformed one stops every page of the dashboard first, as any bad setting does.)"""
    monkeypatch.delenv("TRAINDECK_STORE")
    _no_exception(page.run())
    page.text_input(key="tpu_new_name").set_value("trainer-1")
    _no_exception(page.run())

    (settle,) = [shown(text) for text in _texts(page, "info") if "once these are" in text]
    assert (
        "workers on other machines cannot read this machine's folder: set TRAINDECK_STORE to a "
        "gs:// bucket" in settle
    )
    assert page.button(key="tpu_create").disabled
    assert [a for a in page.text_area if a.key.startswith("tpu_new_script_")] == []
    assert fake_api.requests_of("POST") == []


def test_the_page_says_what_the_vm_needs_to_use_the_bucket(page: AppTest, fake_api: FakeTpuApi):
    _no_exception(page.run())
    page.text_input(key="tpu_new_name").set_value("trainer-1")
    _no_exception(page.run())

    (source,) = [text for text in _texts(page, "caption") if "IAM role" in shown(text)]
    note = shown(source)
    assert f"The worker gets TRAINDECK_STORE={STORE_URL}:" in note
    assert "the IAM role roles/storage.objectAdmin on traindeck-shared" in note
    assert "https://www.googleapis.com/auth/devstorage.read_write" in note
    assert links_and_images(source) == [], "the scope is text, not a link"


def test_a_quota_error_is_a_readable_message(page: AppTest, fake_api: FakeTpuApi):
    fake_api.fail_next("create", 403, "Quota 'TPUV4PodPerProjectPerZoneForTPUAPI' exceeded.")
    _no_exception(page.run())
    page.text_input(key="tpu_new_name").set_value("trainer-1")
    _no_exception(page.run())
    page.button(key="tpu_create").click()
    _no_exception(page.run())

    (error,) = _texts(page, "error")
    assert shown(error).startswith(
        "Quota exceeded while creating TPU VM trainer-1: Quota 'TPUV4Pod"
    )
    assert fake_api.nodes == {}


def test_delete_asks_first_then_deletes_and_requeues_the_job(
    page: AppTest, fake_api: FakeTpuApi, sqlite_engine
):
    fake_api.add_node(PROJECT, ZONE, "old-node")
    job_id = queue.submit(sqlite_engine, {"name": "digits"})
    queue.claim(sqlite_engine, worker_id_for_node("old-node"))
    _no_exception(page.run())

    page.button(key="tpu_delete").click()
    _no_exception(page.run())
    assert any("Delete TPU VM old-node?" in shown(text) for text in _texts(page, "warning"))
    assert fake_api.requests_of("DELETE") == [], "nothing happens before the confirmation"
    page.button(key="tpu_confirm_no").click()
    _no_exception(page.run())
    assert not any("Delete TPU VM" in text for text in _texts(page, "warning"))

    page.button(key="tpu_delete").click()
    _no_exception(page.run())
    page.button(key="tpu_confirm_yes").click()
    _no_exception(page.run())

    assert len(fake_api.requests_of("DELETE", "/nodes/old-node")) == 1
    assert queue.get_job(sqlite_engine, job_id).status == "queued"
    assert "TPU VM old-node is being deleted" in events_since(sqlite_engine, job_id)[-1].message
    _no_exception(page.run())
    assert any("delete old-node: done in" in text for text in _texts(page, "success"))
    assert "No TPU VMs here yet" in _all_text(page)


def test_stop_is_confirmed_and_start_is_not(page: AppTest, fake_api: FakeTpuApi):
    fake_api.add_node(PROJECT, ZONE, "node-1")
    _no_exception(page.run())
    assert page.button(key="tpu_start").disabled

    page.button(key="tpu_stop").click()
    _no_exception(page.run())
    assert fake_api.requests_of("POST", ":stop") == []
    page.button(key="tpu_confirm_yes").click()
    _no_exception(page.run())
    assert len(fake_api.requests_of("POST", ":stop")) == 1
    _no_exception(page.run())
    assert fake_api.node("node-1")["state"] == "STOPPED"

    page.button(key="tpu_start").click()
    _no_exception(page.run())
    assert len(fake_api.requests_of("POST", ":start")) == 1


def test_preemption_requeues_the_job_and_the_node_can_be_recreated(
    page: AppTest, fake_api: FakeTpuApi, sqlite_engine
):
    fake_api.add_node(
        PROJECT,
        ZONE,
        "spot-1",
        schedulingConfig={"spot": True},
        metadata={"startup-script": "#!/bin/bash\necho worker\n"},
    )
    job_id = queue.submit(sqlite_engine, {"name": "digits"})
    queue.claim(sqlite_engine, "tpu-spot-1")
    _no_exception(page.run())
    assert queue.get_job(sqlite_engine, job_id).status == "running"

    fake_api.set_state("spot-1", "PREEMPTED")
    _no_exception(page.run())

    assert queue.get_job(sqlite_engine, job_id).status == "queued"
    assert "was preempted" in events_since(sqlite_engine, job_id)[-1].message
    warnings = _texts(page, "warning")
    assert any("spot-1 was preempted" in w and f"job {job_id} → queued" in w for w in warnings)
    assert any("spot-1 is PREEMPTED" in w for w in warnings)

    page.button(key="tpu_recreate").click()
    _no_exception(page.run())
    page.button(key="tpu_confirm_yes").click()
    _no_exception(page.run())
    assert len(fake_api.requests_of("DELETE", "/nodes/spot-1")) == 1
    _no_exception(page.run())  # the delete finishes; the create starts

    (created,) = fake_api.requests_of("POST", "/nodes")
    assert created.query["nodeId"] == ["spot-1"]
    assert created.body["metadata"] == {"startup-script": "#!/bin/bash\necho worker\n"}
    assert created.body["schedulingConfig"] == {"spot": True}
    _no_exception(page.run())
    assert fake_api.node("spot-1")["state"] == "READY"


def test_an_api_outage_keeps_the_page_usable(page: AppTest, fake_api: FakeTpuApi):
    fake_api.fail_next("list", 403, "Permission 'tpu.nodes.list' denied on 'projects/x'.")
    _no_exception(page.run())

    (error,) = _texts(page, "error")
    assert error.startswith("Permission denied while listing the TPU VMs of test-project")
    assert page.button(key="tpu_create")


def test_the_page_opens_through_the_dashboards_navigation(sqlite_engine, fake_api: FakeTpuApi):
    fake_api.add_node(PROJECT, ZONE, "node-1")
    app = AppTest.from_file(str(Path(PAGE).parents[1] / "app.py"), default_timeout=60)
    app.switch_page("pages/tpu_vms.py")

    _no_exception(app.run())

    assert "TPU VMs" in _texts(app, "title")
    assert list(app.dataframe[0].value["Name"]) == ["node-1"]


def test_an_operation_whose_progress_cannot_be_read_ends_with_a_message(
    page: AppTest, fake_api: FakeTpuApi
):
    fake_api.polls_until_done = 100
    fake_api.add_node(PROJECT, ZONE, "node-1")
    _no_exception(page.run())
    page.button(key="tpu_stop").click()
    _no_exception(page.run())
    page.button(key="tpu_confirm_yes").click()
    _no_exception(page.run())
    for _ in range(5):
        fake_api.fail_next("operation", 503, "The service is currently unavailable.")

    for _ in range(4):
        _no_exception(page.run())
        assert not _texts(page, "error")
    _no_exception(page.run())

    (error,) = _texts(page, "error")
    assert error.startswith("stop node-1: its progress could not be read 5 times in a row")
    assert "The service is currently unavailable." in error
    assert page.button(key="tpu_clear_operations")


# --- a plain TPU VM is a single host (issue 25) ----------------------------------------------


def test_a_single_host_type_is_the_default_and_is_created(page: AppTest, fake_api: FakeTpuApi):
    _no_exception(page.run())
    page.text_input(key="tpu_new_name").set_value("trainer-1")
    _no_exception(page.run())

    assert page.selectbox(key="tpu_new_type").value == "v4-8"
    assert _texts(page, "error") == []
    page.button(key="tpu_create").click()
    _no_exception(page.run())

    (sent,) = fake_api.requests_of("POST", "/nodes")
    assert sent.body["acceleratorType"] == "v4-8"


def test_a_type_the_zone_stopped_offering_is_refused_at_create(page: AppTest, fake_api: FakeTpuApi):
    _no_exception(page.run())  # the zone's offer is read (and cached) with v4-8 in it
    page.text_input(key="tpu_new_name").set_value("trainer-1")
    _no_exception(page.run())
    del fake_api.accelerator_types["v4-8"]

    page.button(key="tpu_create").click()
    _no_exception(page.run())

    (error,) = _texts(page, "error")
    assert shown(error).startswith(
        "The accelerator type v4-8 is not offered in us-central2-b; single-host types offered "
        "there: v2-8, v3-8, v5litepod-1,"
    )
    assert fake_api.requests_of("POST") == []


@pytest.mark.parametrize(
    ("accelerator_type", "reason"),
    [
        ("v4-32", "v4-32 is a multi-host slice (4 hosts, 16 chips in a 2x2x4 topology)"),
        ("v4-64", "The accelerator type v4-64 is not offered in us-central2-b;"),
    ],
)
def test_recreating_a_refused_node_deletes_nothing(
    page: AppTest, fake_api: FakeTpuApi, accelerator_type: str, reason: str
):
    fake_api.add_node(
        PROJECT,
        ZONE,
        "pod-1",
        state="PREEMPTED",
        acceleratorType=accelerator_type,
        metadata={"startup-script": "#!/bin/bash\necho worker\n"},
    )
    _no_exception(page.run())
    page.button(key="tpu_recreate").click()
    _no_exception(page.run())
    page.button(key="tpu_confirm_yes").click()
    _no_exception(page.run())

    (error,) = _texts(page, "error")
    assert shown(error).startswith(f"pod-1 cannot be created again as it is: {reason}")
    assert fake_api.requests_of("DELETE") == [] and fake_api.requests_of("POST") == []
    assert fake_api.node("pod-1")["state"] == "PREEMPTED"


def test_a_refusal_is_shown_as_text(page: AppTest, fake_api: FakeTpuApi):
    name = "v4-32*[x](http://tracker.example/a.png)"
    fake_api.accelerator_types = {name: ("V4", "")}  # an API that answers anything

    _no_exception(page.run())
    page.checkbox(key="tpu_new_queued").check()
    _no_exception(page.run())

    (error,) = _texts(page, "error")
    assert links_and_images(error) == []
    assert shown(error).startswith(f"The Cloud TPU API gives no topology for {name} in ")

"""The TPU VMs page in a real headless Chromium, served by `streamlit run dashboard/app.py`,
on the fake Cloud TPU API: what AppTest cannot show, the fragments that poll on their own.

A spot node is preempted while its worker runs a job: the page requeues the job on its own
refresh, then recreates the node after a confirmation, following the delete and the create
to their end. The screenshot is saved as test-output/tpu/tpu_vms_page.png.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from db import queue
from db.telemetry import events_since
from tests.support.browser import CHROMIUM, ROOT, chromium, new_page, running_dashboard
from tests.support.fake_tpu_api import FakeTpuApi
from tests.support.tpu import PROJECT, ZONE

SCREENSHOT = ROOT / "test-output" / "tpu" / "tpu_vms_page.png"
SCRIPT = "#!/bin/bash\necho start the worker\n"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]


@pytest.fixture
def dashboard_url(sqlite_engine, tmp_path: Path) -> Iterator[str]:
    # Without the bucket the TPU tests name (tests/tpu/conftest.py): the dashboard would look
    # for it at start-up, and it exists nowhere. This test creates no VM.
    environment = {name: value for name, value in os.environ.items() if name != "TRAINDECK_STORE"}
    with running_dashboard("127.0.0.1", environment, tmp_path / "streamlit.log") as url:
        yield url


@pytest.fixture
def browser_page():
    with chromium() as browser:
        yield new_page(browser, height=1600)


def test_preempted_node_is_requeued_and_recreated_in_the_browser(
    fake_api: FakeTpuApi, sqlite_engine, dashboard_url: str, browser_page
):
    fake_api.add_node(
        PROJECT,
        ZONE,
        "spot-1",
        schedulingConfig={"spot": True},
        metadata={"startup-script": SCRIPT},
    )
    job_id = queue.submit(sqlite_engine, {"name": "digits on spot"})
    queue.claim(sqlite_engine, "tpu-spot-1")
    page = browser_page

    page.goto(f"{dashboard_url}/tpu_vms")
    page.get_by_text(f"Nodes in {PROJECT} / {ZONE}").wait_for()
    assert queue.get_job(sqlite_engine, job_id).status == "running"

    fake_api.set_state("spot-1", "PREEMPTED")  # noticed by the list's own refresh
    page.get_by_text(f"job {job_id} → queued").wait_for(timeout=40_000)
    assert queue.get_job(sqlite_engine, job_id).status == "queued"
    assert "was preempted" in events_since(sqlite_engine, job_id)[-1].message

    page.get_by_role("button", name="Recreate…").first.click()
    page.get_by_text("Delete and create again TPU VM spot-1?").wait_for()
    assert fake_api.requests_of("DELETE") == []
    page.get_by_role("button", name="Yes, delete and create again spot-1").click()
    page.get_by_text("create spot-1: done in").wait_for(timeout=40_000)

    (created,) = fake_api.requests_of("POST", "/nodes")
    assert created.body["metadata"] == {"startup-script": SCRIPT}
    assert fake_api.node("spot-1")["state"] == "READY"
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)

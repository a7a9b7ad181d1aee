"""The dashboard in a real headless Chromium, served by `streamlit run` on a free port.

Submits a job through the form, finds it in the jobs table, opens its page while a thread
writes metrics the way a worker does, and watches the loss chart grow. The screenshot is saved
as test-output/dashboard/job_page_live.png (and in the test's tmp_path).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.files import job_dir, sha256_file
from db import queue
from db.telemetry import write_metrics
from tests.support import seed
from tests.support.artifacts import record_local_file
from tests.support.browser import CHROMIUM, ROOT, chromium, new_page, running_dashboard

SCREENSHOT = ROOT / "test-output" / "dashboard" / "job_page_live.png"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]


@pytest.fixture
def dashboard_url(sqlite_engine, data_dir: Path, tmp_path: Path) -> Iterator[str]:
    with running_dashboard("127.0.0.1", dict(os.environ), tmp_path / "streamlit.log") as url:
        yield url


@pytest.fixture
def browser_page():
    with chromium() as browser:
        yield new_page(browser, height=1000)


class MetricWriter(threading.Thread):
    """Writes batches of loss points the way a worker's writer does, until stopped."""

    def __init__(self, engine, job_id: int):
        super().__init__(daemon=True)
        self.engine = engine
        self.job_id = job_id
        self.next_step = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            write_metrics(self.engine, self.job_id, seed.batch_points(self.next_step, 5))
            self.next_step += 5
            self.stop.wait(0.4)


def _plotted_points(page) -> int:
    return page.evaluate(
        """() => {
            const plot = [...document.querySelectorAll('.js-plotly-plot')]
                .find(p => (p.layout?.title?.text || '').includes('Train loss per batch'));
            // _fullData holds the traces as drawn (the x sent as a typed array, decoded).
            return plot && plot._fullData ? plot._fullData[0].x.length : 0;
        }"""
    )


def _wait_for_growth(page, above: int, timeout_s: float = 30) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        count = _plotted_points(page)
        if count > above:
            return count
        page.wait_for_timeout(500)
    pytest.fail(f"the train-loss chart stayed at {above} points for {timeout_s} s")


def test_submit_find_open_and_watch_the_chart_grow(
    dashboard_url: str, browser_page, sqlite_engine, tmp_path: Path
):
    page = browser_page
    engine = sqlite_engine

    # Submit a job through the form: the first visit after the start goes straight to a page,
    # which must still come with the app's navigation.
    page.goto(f"{dashboard_url}/new_job")
    navigation = page.get_by_test_id("stSidebarNav")
    navigation.get_by_text("Training", exact=True).wait_for()
    assert navigation.get_by_text("New job", exact=True).count() == 1
    page.get_by_label("Job name", exact=True).fill("browser run")
    epochs = page.get_by_label("Epochs", exact=True)
    epochs.fill("2")
    epochs.press("Enter")
    page.get_by_role("button", name="Queue job").click()
    page.get_by_text("Queued job #1.").wait_for()
    job = queue.get_job(engine, 1)
    assert (job.name, job.spec["epochs"], job.status) == ("browser run", 2, "queued")

    # Find it in the jobs table.
    page.goto(dashboard_url)
    # The grid draws on a canvas; its accessible table holds the cell texts.
    table = page.get_by_test_id("stDataFrame")
    table.locator("td", has_text="browser run").wait_for(state="attached")
    assert table.locator("td", has_text="queued").count() == 1

    # A worker takes it and starts writing metrics; open its page from the jobs page.
    claimed = queue.claim(engine, "browser-test-worker")
    assert claimed is not None and claimed.id == 1
    queue.set_progress(
        engine,
        claimed.lease,
        epoch=0,
        step=0,
        total_epochs=2,
        total_steps=200,
        eta_seconds=60.0,
        device="cpu",
    )
    writer = MetricWriter(engine, claimed.id)
    writer.start()
    try:
        page.get_by_role("button", name="Open its page").click()
        page.get_by_role("heading", name="#1 · browser run").wait_for()
        first = _wait_for_growth(page, 0)
        second = _wait_for_growth(page, first)
        third = _wait_for_growth(page, second)
        assert first < second < third
    finally:
        writer.stop.set()
        writer.join()
    page.screenshot(path=str(tmp_path / "job_page_live.png"), full_page=True)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tmp_path / "job_page_live.png", SCREENSHOT)

    # The job finishes with an exported model: its download streams the file from disk.
    export = job_dir(claimed.id) / "export.pkl"
    export.parent.mkdir(parents=True, exist_ok=True)
    export.write_bytes(os.urandom(300_000))
    record_local_file(engine, claimed.id, "export", export)
    assert queue.finish(engine, claimed.lease, "succeeded")
    page.get_by_role("tab", name="Artifacts").click()
    link = page.get_by_role("link", name="Download export.pkl")
    link.wait_for()
    response = page.request.get(dashboard_url + link.get_attribute("href"))
    assert response.status == 200
    assert response.body() == export.read_bytes()
    assert "job1-export.pkl" in response.headers["content-disposition"]
    assert page.get_by_text(sha256_file(export)).count() >= 1

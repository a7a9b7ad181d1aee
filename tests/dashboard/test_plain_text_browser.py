"""Outside text in a real headless Chromium (issue 23, finding 5): no remote image is fetched.

A tracker (an HTTP server on 127.0.0.1 that counts what it is asked for) stands where the
injected Markdown points. A job's name, error, device and worker, a stale worker's id, CSV
labels in the dataset preview and the address's `?job=` all carry `![x](tracker)` and
`[y](tracker)`. Every page shows them as the literal text, draws no image or link to the
tracker, and the tracker gets no request; one fetch of its own at the end shows it counts.
"""

from __future__ import annotations

import csv
import http.server
import os
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import update

from dashboard.format import WORD_JOINER
from datasets.register import register_csv
from db import queue
from db.engine import write_tx
from db.models import Worker, utcnow
from db.results import save_results
from db.workers import register_worker
from tests.support import seed
from tests.support.browser import CHROMIUM, chromium, new_page, running_dashboard
from tests.support.images import colour_for, write_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]


class Tracker(http.server.ThreadingHTTPServer):
    """Counts every request; answers each with a 1×1 GIF."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _TrackerHandler)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _TrackerHandler(http.server.BaseHTTPRequestHandler):
    GIF = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "image/gif")
        self.send_header("Content-Length", str(len(self.GIF)))
        self.end_headers()
        self.wfile.write(self.GIF)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def tracker() -> Iterator[Tracker]:
    server = Tracker()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def injected(tracker: Tracker, where: str) -> str:
    return f"![x]({tracker.base}/{where}.png) [y]({tracker.base}/{where})"


def injected_html(tracker: Tracker, where: str) -> str:
    """What a plotly label would draw as a link (plotly knows a few HTML tags)."""
    return f'<a href="{tracker.base}/{where}">{where}</a>'


@pytest.fixture
def seeded(sqlite_engine, data_dir: Path, tracker: Tracker) -> dict[str, str | int]:
    """Jobs, a worker and a dataset whose outside strings carry Markdown aimed at the tracker."""
    name, error = injected(tracker, "name"), injected(tracker, "error")
    device, worker = injected(tracker, "device"), injected(tracker, "worker")
    queue.submit(sqlite_engine, {"name": name, "epochs": 2})
    claimed = queue.claim(sqlite_engine, worker)
    assert claimed is not None
    queue.set_progress(
        sqlite_engine,
        claimed.lease,
        epoch=1,
        step=10,
        total_epochs=2,
        total_steps=20,
        eta_seconds=5.0,
        device=device,
    )
    assert queue.finish(sqlite_engine, claimed.lease, "failed", f"RuntimeError: {error}")

    register_worker(sqlite_engine, worker, "tpu-vm", 100, device)
    with write_tx(sqlite_engine) as connection:
        connection.execute(
            update(Worker)
            .where(Worker.id == worker)
            .values(heartbeat_at=utcnow() - timedelta(minutes=10))
        )

    label = injected(tracker, "label") + injected_html(tracker, "chart-label")
    folder = data_dir / "injected"
    rows = []
    for index, row_label in enumerate([label, label, "cat", "cat"]):
        write_image(folder / "pics" / f"{index}.png", colour_for(index // 2), size=16)
        rows.append([f"pics/{index}.png", row_label])
    with open(folder / "labels.csv", "w", newline="") as handle:
        csv.writer(handle).writerows([["file", "label"], *rows])
    register_csv(sqlite_engine, "injected", folder / "labels.csv")

    class_name = injected(tracker, "class") + injected_html(tracker, "chart-class")
    finished, _ = seed.finished_job(sqlite_engine, name="classes run")
    save_results(
        sqlite_engine,
        finished,
        classes=[class_name, "cat"],
        confusion=[[3, 2], [1, 4]],
        per_class=[
            {"class": c, "precision": 0.5, "recall": 0.5, "support": 5} for c in (class_name, "cat")
        ],
        top_losses=[
            {
                "path": "valid/a.png",
                "actual": class_name,
                "predicted": "cat",
                "probability": 0.9,
                "loss": 2.5,
                "thumbnail": None,
            }
        ],
        predictions=[["valid/a.png", class_name, "cat"]],
        accuracy=0.7,
        valid_loss=0.8,
    )
    return {"job": claimed.id, "name": name, "error": error, "device": device,
            "worker": worker, "label": label, "query": injected(tracker, "query"),
            "finished": finished, "class": class_name}  # fmt: skip


@pytest.fixture
def dashboard_url(seeded, tmp_path: Path) -> Iterator[str]:
    with running_dashboard("127.0.0.1", dict(os.environ), tmp_path / "streamlit.log") as url:
        yield url


def _wait_for_text(page, literal: str) -> None:
    """Until the page reads `literal` (less the invisible word joiners in bare addresses)."""
    page.wait_for_function(
        """([literal, joiner]) =>
            document.body.innerText.replaceAll(joiner, "").includes(literal)""",
        arg=[literal, WORD_JOINER],
    )


def _nothing_aimed_at(page, tracker: Tracker) -> None:
    """No image or link on the page points at the tracker (whatever has loaded yet)."""
    drawn = page.evaluate(
        """(base) => [...document.querySelectorAll('img, a, image')]
            .map(e => e.getAttribute('src') || e.getAttribute('href')
                      || e.getAttribute('xlink:href') || '')
            .filter(address => address.startsWith(base))""",
        tracker.base,
    )
    assert drawn == []


def test_no_page_fetches_or_links_what_outside_text_points_at(
    dashboard_url: str, seeded: dict, tracker: Tracker
):
    job_id = seeded["job"]
    # (address, a sentence the page writes itself, then the outside strings it must show)
    visits = [
        (
            f"/job?job={job_id}",
            "The job failed",
            [
                f"#{job_id} · {seeded['name']}",
                seeded["error"],
                f"device {seeded['device']}, worker {seeded['worker']}",
            ],
        ),
        (
            f"/job?job={quote(seeded['query'])}",
            "is not a job number.",
            [f"{seeded['query']!r} is not a job number."],
        ),
        ("/workers", "Their running jobs go back", [f"from: {seeded['worker']}."]),
        # The preview's images come before this expander, so they are drawn once it is.
        ("/datasets", "Remove this dataset", [seeded["label"]]),
        # The Results tab (opened below): the class names, and the confusion matrix's axes.
        (f"/job?job={seeded['finished']}", "Most confused", [f"{seeded['class']} → cat: 2"]),
    ]
    with chromium() as browser:
        page = new_page(browser)
        for path, anchor, literals in visits:
            page.goto(dashboard_url + path)
            if anchor == "Most confused":
                page.get_by_role("tab", name="Results").click()
                # The confusion matrix drawn with its axis labels.
                page.wait_for_function(
                    """() => [...document.querySelectorAll('.js-plotly-plot')].some(plot =>
                        plot._fullData?.[0]?.type === 'heatmap'
                        && plot.querySelectorAll('.xtick text').length === 2)"""
                )
            _wait_for_text(page, anchor)
            # Whatever the page asked for is fetched before this returns (the websocket stays
            # open and does not count).
            page.wait_for_load_state("networkidle")
            assert tracker.paths == [], path
            _nothing_aimed_at(page, tracker)
            for literal in literals:
                _wait_for_text(page, literal)
        assert tracker.paths == []

        # The tracker does count: a fetch of its own is seen.
        assert page.request.get(f"{tracker.base}/control.png").status == 200
    assert tracker.paths == ["/control.png"]

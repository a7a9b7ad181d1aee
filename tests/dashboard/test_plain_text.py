"""Outside text is shown as text, never as Markdown (issue 23, finding 5).

A job's name and error, its device and worker, a worker id, a CSV label, a class name, a flash
message and the address's `?job=` are written by whoever submits a job, runs a worker or brings
a dataset. Streamlit renders most strings as Markdown, so `![x](http://…)` in any of them became
a remote image fetched by every viewer's browser (a tracker) and `[x](http://…)` a link. Every
page now passes such strings through `dashboard.format.plain`.

AppTest gives the Markdown source of each element; `tests.support.markdown` renders it. Each
test asserts the literal string is what a person reads, and that nothing on the page renders
to a link or an image. tests/dashboard/test_plain_text_browser.py checks the same in Chromium.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from streamlit.testing.v1 import AppTest

from dashboard.format import chart_text, plain
from dashboard.results_view import predictions_csv
from datasets.register import register_csv
from db import queue
from db.engine import dispose_engines, write_tx
from db.models import Worker, utcnow
from db.results import save_results
from db.workers import register_worker
from tests.support import seed
from tests.support.images import colour_for, write_image
from tests.support.markdown import links_and_images, shown

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
# Port 9 (discard): nothing would answer, and AppTest renders nothing anyway.
IMAGE = "![x](http://127.0.0.1:9/tracker.png)"
LINK = "[y](http://127.0.0.1:9/phish)"
INJECTED = f"{IMAGE} {LINK}"
# Fields of an element's message that Streamlit renders as Markdown.
MARKDOWN_FIELDS = frozenset({"body", "label", "caption"})


@pytest.fixture(autouse=True)
def _fresh_engine_cache():
    dispose_engines()
    yield
    dispose_engines()


def open_page(page: str, **query: object) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    if page != "pages/jobs.py":
        at.switch_page(page)
    for key, value in query.items():
        at.query_params[key] = str(value)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _strings(message, names: frozenset[str]) -> list[str]:
    found = []
    for descriptor, value in message.ListFields():
        if descriptor.type == descriptor.TYPE_MESSAGE:
            items = value if descriptor.is_repeated else [value]
            for item in items:
                found += _strings(item, names)
        elif descriptor.type == descriptor.TYPE_STRING and descriptor.name in names:
            items = value if descriptor.is_repeated else [value]
            found += [str(item) for item in items]
    return found


def markdown_sources(at: AppTest) -> list[str]:
    """The Markdown of every element and block on the page (main area and sidebar): bodies,
    titles, alerts, captions (of images too), metrics, widget, tab and expander labels."""
    sources = []
    for root in (at.main, at.sidebar):
        for node in root:
            proto = getattr(node, "proto", None)
            if proto is None or getattr(node, "type", "") in ("json", "code"):
                continue
            sources += _strings(proto, MARKDOWN_FIELDS)
    return sources


def assert_shown_as_text(at: AppTest, *expected: str) -> list[str]:
    """Nothing on the page renders to a link or an image, and each `expected` string is read
    literally in some element. Returns what the page shows."""
    sources = markdown_sources(at)
    drawn = {source: links_and_images(source) for source in sources}
    assert not any(drawn.values()), {source: found for source, found in drawn.items() if found}
    texts = [shown(source) for source in sources]
    for literal in expected:
        assert any(literal in text for text in texts), (literal, texts)
    return texts


@pytest.fixture
def failed_job(sqlite_engine) -> int:
    """A failed job whose name, worker, device and error all carry Markdown."""
    queue.submit(sqlite_engine, {"name": f"run {INJECTED}", "epochs": 2})
    claimed = queue.claim(sqlite_engine, f"worker {INJECTED}")
    assert claimed is not None
    queue.set_progress(
        sqlite_engine,
        claimed.lease,
        epoch=1,
        step=10,
        total_epochs=2,
        total_steps=20,
        eta_seconds=5.0,
        device=f"xla:0 {INJECTED}",
    )
    error = f"Traceback (most recent call last):\nRuntimeError: {INJECTED}"
    assert queue.finish(sqlite_engine, claimed.lease, "failed", error)
    return claimed.id


def test_the_job_page_shows_name_error_device_and_worker_as_text(failed_job: int):
    at = open_page("pages/job.py", job=failed_job)
    texts = assert_shown_as_text(
        at,
        f"#{failed_job} · run {INJECTED}",
        f"The job failed: RuntimeError: {INJECTED}",
        f"device xla:0 {INJECTED}, worker worker {INJECTED}",
    )
    assert shown(at.title[0].value) == f"#{failed_job} · run {INJECTED}"
    assert f"device xla:0 {INJECTED}, worker worker {INJECTED}" in texts

    at.session_state["job.tab"] = "Diagnostics"
    at.run()
    assert not at.exception
    assert_shown_as_text(at, f"Device: xla:0 {INJECTED}")


def test_the_jobs_page_lists_the_job_as_text(failed_job: int):
    at = open_page("pages/jobs.py")
    assert_shown_as_text(at)
    # Selectbox options and table cells are text already: no escaping shows in them.
    assert at.selectbox(key="jobs.selected").format_func(failed_job) == (
        f"#{failed_job} · run {INJECTED} · failed"
    )
    assert at.dataframe[0].value["name"].tolist() == [f"run {INJECTED}"]


def test_the_job_number_in_the_address_is_echoed_as_text(sqlite_engine):
    at = open_page("pages/job.py", job=INJECTED)
    assert_shown_as_text(at, f"{INJECTED!r} is not a job number.")


def test_a_stale_worker_id_is_named_as_text(sqlite_engine):
    worker_id = f"tpu {INJECTED}"
    register_worker(sqlite_engine, worker_id, "tpu-vm", 100, f"TPU {INJECTED}")
    with write_tx(sqlite_engine) as connection:
        connection.execute(
            update(Worker)
            .where(Worker.id == worker_id)
            .values(heartbeat_at=utcnow() - timedelta(minutes=10))
        )
    at = open_page("pages/workers.py")
    assert_shown_as_text(at, f"from: {worker_id}.")


def test_csv_labels_are_previewed_as_text(sqlite_engine, data_dir: Path):
    folder = data_dir / "injected"
    rows = []
    for index, label in enumerate([INJECTED, INJECTED, "cat", "cat"]):
        write_image(folder / "pics" / f"{index}.png", colour_for(index // 2))
        rows.append([f"pics/{index}.png", label])
    labels = folder / "labels.csv"
    with open(labels, "w", newline="") as handle:
        csv.writer(handle).writerows([["file", "label"], *rows])
    register_csv(sqlite_engine, "injected", labels)

    at = open_page("pages/datasets.py")
    assert_shown_as_text(at)
    captions = [shown(caption) for image in at.get("image") for caption in image.captions]
    assert sorted(captions) == sorted([INJECTED, INJECTED, "cat", "cat"])


def _flash_script(message: str) -> None:
    from dashboard import actions

    actions.flash("error", message)
    actions.show_flashes()


def test_a_flash_message_is_shown_as_text():
    message = f"Cannot delete job #3: {INJECTED}\nsecond line **not bold**"
    at = AppTest.from_function(_flash_script, args=(message,), default_timeout=30)
    at.run()
    assert not at.exception
    assert_shown_as_text(at, message)
    assert shown(at.error[0].value) == message


@pytest.mark.parametrize(
    "text",
    [
        INJECTED,
        "<img src=x onerror=alert(1)> &amp; `code` **bold** _it_ ~~gone~~ $x^2$",
        ":red[coloured] :material/home: :smile: http://127.0.0.1:9/bare www.example.com a@b.org",
        "# heading\n- item\n1. item\n> quote\n---\n| a | b |\n|---|---|\n<b>x</b>",
        "a\\b \\[escaped\\] trailing backslash \\",
    ],
)
def test_plain_renders_as_exactly_the_text(text: str):
    assert shown(plain(text)) == text.strip()
    assert links_and_images(plain(text)) == []
    assert "\\" not in plain("plain words 42")  # letters, digits and spaces stay as they are


@pytest.fixture
def job_with_results(sqlite_engine) -> int:
    """A succeeded job whose results carry Markdown and HTML in a class name and a file name."""
    job_id, _ = seed.finished_job(sqlite_engine, name="classes run")
    classes = [INJECTED, "cat"]
    save_results(
        sqlite_engine,
        job_id,
        classes=classes,
        confusion=[[3, 2], [1, 4]],
        per_class=[
            {"class": name, "precision": 0.5, "recall": 0.5, "support": 5} for name in classes
        ],
        top_losses=[
            {
                "path": f"valid/{INJECTED}.png",
                "actual": INJECTED,
                "predicted": "cat",
                "probability": 0.9,
                "loss": 2.5,
                "thumbnail": None,
            }
        ],
        predictions=[["valid/a.png", INJECTED, "cat"], ['=HYPERLINK("x")', "cat", "cat"]],
        accuracy=0.7,
        valid_loss=0.8,
    )
    return job_id


def test_the_results_tab_shows_class_names_as_text(job_with_results: int):
    at = open_page("pages/job.py", job=job_with_results)
    at.session_state["job.tab"] = "Results"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    texts = assert_shown_as_text(at, f"{INJECTED} → cat: 2", f"{INJECTED} → cat · p 0.90")
    # The top loss without a thumbnail: its caption, the file name last (after its last /).
    assert any(
        text.startswith(f"{INJECTED} → cat") and text.endswith("phish).png (image not readable)")
        for text in texts
    )
    # The confusion matrix's axes: plotly renders <a href> in labels; the names are escaped.
    (chart,) = [c for c in at.get("plotly_chart") if "heatmap" in c.proto.spec]
    trace = json.loads(chart.proto.spec)["data"][0]
    assert trace["x"] == [chart_text(INJECTED), "cat"]
    assert (
        chart_text('<a href="http://t/">x</a> & y')
        == '&lt;a href="http://t/"&gt;x&lt;/a&gt; &amp; y'
    )


def test_the_predictions_csv_neutralises_formulas():
    rows = [
        ['=HYPERLINK("http://t/","x")', "+cmd", "-2+3"],
        ["@SUM(A1)", "\tTAB", "\rCR"],
        ["plain/a.png", "cat", "dog"],
    ]
    parsed = list(csv.reader(io.StringIO(predictions_csv(rows).decode("utf-8"))))
    assert parsed == [
        ["path", "actual", "predicted"],
        ['\'=HYPERLINK("http://t/","x")', "'+cmd", "'-2+3"],
        ["'@SUM(A1)", "'\tTAB", "'\rCR"],
        ["plain/a.png", "cat", "dog"],
    ]

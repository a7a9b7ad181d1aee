"""The Results tab through Streamlit's AppTest, on the real trained digits job."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from db import queue
from db.artifacts import get_artifact
from db.engine import dispose_engines
from db.results import get_results
from tests.results.test_predict import known_digits
from tests.support.markdown import shown
from tests.support.trained import REPO, job_with_copied_export

pytestmark = pytest.mark.slow

APP = str(REPO / "dashboard" / "app.py")


def results_script(url: str, job_id: int) -> None:
    from dashboard.results_view import render_results
    from db.engine import get_engine

    render_results(get_engine(url), job_id)


def open_results(trained, job_id: int) -> AppTest:
    at = AppTest.from_function(results_script, args=(trained.url, job_id), default_timeout=120)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def heatmap(at: AppTest) -> dict:
    (chart,) = at.get("plotly_chart")
    return json.loads(chart.proto.spec)["data"][0]


def z_values(trace: dict) -> np.ndarray:
    """A heatmap's z: plotly sends numpy arrays as base64 typed arrays with their shape."""
    z = trace["z"]
    if isinstance(z, dict):
        flat = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"])
        return flat.reshape([int(n) for n in str(z["shape"]).split(",")])
    return np.array(z, dtype=float)


def test_results_tab_shows_the_stored_results(trained):
    stored = get_results(trained.engine, trained.job_id)
    at = open_results(trained, trained.job_id)

    metrics = {metric.label: metric.value for metric in at.metric}
    assert metrics["Validation accuracy"] == f"{stored.accuracy:.2%}"
    assert metrics["Validation images"] == f"{len(stored.predictions):,}"

    trace = heatmap(at)
    assert trace["type"] == "heatmap"
    assert list(trace["x"]) == list(trace["y"]) == stored.classes
    assert np.array_equal(z_values(trace), np.array(stored.confusion, dtype=float))

    table = at.dataframe[0].value
    assert table["class"].tolist() == stored.classes
    assert table["recall"].tolist() == pytest.approx([row["recall"] for row in stored.per_class])
    assert table["support"].sum() == len(stored.predictions)

    captions = [caption for image in at.image for caption in image.captions]
    assert len(captions) == len(stored.top_losses)
    for caption, loss in zip(captions, stored.top_losses, strict=True):
        assert caption.startswith(f"{loss['actual']} → {loss['predicted']} · p ")
    buttons = [button.proto.label for button in at.get("download_button")]
    assert buttons == ["Validation predictions (CSV)", "Download the model card (JSON)"]
    assert at.file_uploader[0].accept_multiple_files

    at.toggle[0].set_value(True).run()
    shares = z_values(heatmap(at))
    assert shares.sum(axis=1) == pytest.approx(np.ones(len(stored.classes)))


def test_validation_predictions_are_shown_a_page_at_a_time(trained):
    stored = get_results(trained.engine, trained.job_id).predictions
    at = open_results(trained, trained.job_id)

    def table() -> list[list[str]]:
        return at.dataframe[1].value.values.tolist()

    assert table() == stored[:100]
    assert f"images 1–100 of {len(stored):,}" in [caption.value for caption in at.caption]
    last = -(-len(stored) // 100)
    at.number_input(key=f"results.{trained.job_id}.predictions_page").set_value(last).run()
    assert table() == stored[(last - 1) * 100 :]


def test_predict_box_classifies_uploads_and_names_files_that_are_no_images(trained):
    seven = known_digits(trained)["7"]
    at = open_results(trained, trained.job_id)

    at.file_uploader[0].set_value(
        [
            ("seven.png", seven.read_bytes(), "image/png"),
            ("notes.txt", b"hello, no picture here", "text/plain"),
        ]
    ).run()

    assert not at.exception, [e.value for e in at.exception]
    texts = [shown(markdown.value) for markdown in at.markdown]
    assert any(text.startswith("7 · ") and " · seven.png · " in text for text in texts), texts
    errors = [shown(error.value) for error in at.error]
    assert errors == ["notes.txt: not an image (no image format recognises it)"]
    probabilities = at.dataframe[-1].value
    assert probabilities["class"].tolist()[0] == "7" and len(probabilities) == 3


def test_a_tampered_export_is_refused_with_a_message(trained):
    export = get_artifact(trained.engine, trained.job_id, "export")
    job_id = job_with_copied_export(trained, flip_byte_at=export.bytes // 2)
    at = open_results(trained, job_id)
    # A copied export has no results or model card of its own: the tab says so.
    assert any("No results were stored" in info.value for info in at.info)
    assert any("No model card" in caption.value for caption in at.caption)

    at.file_uploader[0].set_value(
        ("seven.png", known_digits(trained)["7"].read_bytes(), "image/png")
    )
    at.run()

    assert not at.exception, [e.value for e in at.exception]
    (error,) = [shown(error.value) for error in at.error]
    assert error.startswith(f"Cannot predict: the exported model of job #{job_id}")
    assert "is not the file the worker recorded" in error and "refusing to load it" in error


def test_results_tab_of_a_job_that_has_not_finished(trained):
    job_id = queue.submit(trained.engine, {"name": "still queued"})
    at = open_results(trained, job_id)
    assert at.info[0].value.startswith("Results appear when the job has succeeded")
    assert not at.get("plotly_chart") and not at.file_uploader
    queue.cancel(trained.engine, job_id)


def test_job_page_has_the_results_tab(trained, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", trained.url)
    monkeypatch.setenv("TRAINDECK_DATA", str(trained.data_dir))
    dispose_engines()
    at = AppTest.from_file(APP, default_timeout=120)
    at.switch_page("pages/job.py")
    at.query_params["job"] = str(trained.job_id)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [tab.label for tab in at.tabs][:2] == ["Curves", "Results"]
    at.session_state["job.tab"] = "Results"  # tabs are lazy: only the open one runs
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(metric.label == "Validation accuracy" for metric in at.metric)
    dispose_engines()


def test_predicting_with_a_job_that_left_no_export_says_so(trained):
    job_id = queue.submit(trained.engine, {"name": "succeeded, but its export was not recorded"})
    claimed = queue.claim(trained.engine, "results-test")
    assert claimed is not None and claimed.id == job_id
    queue.finish(trained.engine, claimed.lease, "succeeded")
    at = open_results(trained, job_id)

    at.file_uploader[0].set_value(
        ("seven.png", known_digits(trained)["7"].read_bytes(), "image/png")
    )
    at.run()

    assert not at.exception, [e.value for e in at.exception]
    assert [shown(error.value) for error in at.error] == [
        f"Cannot predict: job #{job_id} has no exported model recorded."
    ]

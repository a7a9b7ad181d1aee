"""The job page's TensorBoard download: a zip made when the link is fetched, holding the run
that `traindeck export tensorboard` writes."""

from __future__ import annotations

import io
import tempfile
import zipfile
from pathlib import Path

from starlette.applications import Starlette
from starlette.testclient import TestClient
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

from dashboard import downloads
from tests.dashboard.test_pages import _fresh_engine_cache, open_page, show_tab  # noqa: F401
from tests.support import seed
from tests.support.markdown import shown


def _client() -> TestClient:
    return TestClient(Starlette(routes=downloads.routes()))


def test_the_artifacts_tab_offers_the_job_as_a_tensorboard_zip(sqlite_engine, tmp_path):
    done_id, _ = seed.finished_job(sqlite_engine)
    at = show_tab(open_page("pages/job.py", job=done_id), "Artifacts")
    links = {shown(button.proto.label): button.proto.url for button in at.get("link_button")}
    url = links["Download as TensorBoard run (zip)"]
    assert "Download export.pkl" in links  # the model's download is still there

    before = set(Path(tempfile.gettempdir()).glob("traindeck-download-*"))
    response = _client().get(url)
    assert response.status_code == 200
    assert f'filename="job{done_id}-tensorboard.zip"' in response.headers["content-disposition"]
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        archive.extractall(tmp_path)
    accumulator = EventAccumulator(str(tmp_path / f"job-{done_id}"), size_guidance={SCALARS: 0})
    accumulator.Reload()
    assert len(accumulator.Scalars("batch/train_loss")) == 60
    assert [e.step for e in accumulator.Scalars("epoch/accuracy")] == [0, 1, 2]
    assert set(Path(tempfile.gettempdir()).glob("traindeck-download-*")) == before  # deleted


def test_a_made_download_that_fails_is_one_line():
    def broken(out):
        out.write(b"half")
        raise OSError(28, "No space left on device")

    before = set(Path(tempfile.gettempdir()).glob("traindeck-download-*"))
    url = downloads.link_for_made("broken", "broken.zip", broken)
    response = _client().get(url)
    assert response.status_code == 503
    assert response.text == "Cannot make broken.zip: [Errno 28] No space left on device"
    assert set(Path(tempfile.gettempdir()).glob("traindeck-download-*")) == before

"""The job page's TensorBoard download: a zip made when the link is fetched, holding the run
that `traindeck export tensorboard` writes."""

from __future__ import annotations

import io
import tempfile
import zipfile
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

from dashboard import downloads
from tests.dashboard.test_pages import _fresh_engine_cache, open_page, show_tab  # noqa: F401
from tests.support import seed
from tests.support.markdown import shown


def _client() -> TestClient:
    return TestClient(Starlette(routes=downloads.routes()))


@pytest.fixture(autouse=True)
def _own_temp_dir(tmp_path, monkeypatch) -> Path:
    """The made files go to a temporary folder of this test's own: tests running beside it
    (pytest-xdist) make theirs elsewhere, so the folder's listing is this test's alone."""
    folder = tmp_path / "temp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_the_artifacts_tab_offers_the_job_as_a_tensorboard_zip(
    sqlite_engine, tmp_path, _own_temp_dir
):
    done_id, _ = seed.finished_job(sqlite_engine)
    at = show_tab(open_page("pages/job.py", job=done_id), "Artifacts")
    links = {shown(button.proto.label): button.proto.url for button in at.get("link_button")}
    url = links["Download as TensorBoard run (zip)"]
    assert "Download export.pkl" in links  # the model's download is still there

    response = _client().get(url)
    assert response.status_code == 200
    assert f'filename="job{done_id}-tensorboard.zip"' in response.headers["content-disposition"]
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        archive.extractall(tmp_path / "runs")
    run = tmp_path / "runs" / f"job-{done_id}"
    accumulator = EventAccumulator(str(run), size_guidance={SCALARS: 0})
    accumulator.Reload()
    assert len(accumulator.Scalars("batch/train_loss")) == 60
    assert [e.step for e in accumulator.Scalars("epoch/accuracy")] == [0, 1, 2]
    assert list(_own_temp_dir.iterdir()) == []  # the made file is deleted once sent


def test_a_made_download_that_fails_is_one_line(_own_temp_dir):
    def broken(out):
        out.write(b"half")
        raise OSError(28, "No space left on device")

    url = downloads.link_for_made("broken", "broken.zip", broken)
    response = _client().get(url)
    assert response.status_code == 503
    assert response.text == "Cannot make broken.zip: [Errno 28] No space left on device"
    assert list(_own_temp_dir.iterdir()) == []  # the half-made file is deleted

"""`traindeck.client` against a real dashboard (`python -m dashboard`) on loopback (issue 18):
the client submits, lists, shows, labels, reads metrics, waits, cancels, retries and downloads
over the HTTP API; and in headless Chromium a person makes a token on the Settings page that
the client then uses to submit a job, which the Jobs page shows."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from db import queue
from db.engine import create_db_engine, dispose_engines
from db.migrate import upgrade
from db.telemetry import metric_series, write_metrics
from db.tokens import create_token, revoke_token
from tests.support import seed
from tests.support.browser import CHROMIUM, chromium, free_port, new_page, running_dashboard
from traindeck.client import ApiError, Client

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object]]:
    """(the dashboard's URL, an engine on its database), both sides on one data folder."""
    data = tmp_path_factory.mktemp("client") / "data"
    data.mkdir()
    url = f"sqlite:///{data / 'traindeck.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRAINDECK_DATA", str(data))
        patch.setenv("DATABASE_URL", url)
        for name in ("TRAINDECK_PASSWORD_HASH", "TRAINDECK_AUTH", "TRAINDECK_STORE"):
            patch.delenv(name, raising=False)
        engine = create_db_engine(url)
        upgrade(engine)
        log = data.parent / "streamlit.log"
        with running_dashboard("127.0.0.1", dict(os.environ), log) as base_url:
            yield base_url, engine
        engine.dispose()
        dispose_engines()


@pytest.fixture(scope="module")
def deck(served) -> Client:
    base_url, engine = served
    return Client(base_url, token=create_token(engine, "tests", 1, "test")[1])


def test_submit_list_show_label_cancel_and_retry(served, deck: Client):
    _, engine = served
    job_id = deck.submit({"arch": "resnet34", "epochs": 2}, tags=["client"], note="from *tests*")
    other = deck.submit(name="second", tags="client, b")
    job = deck.job(job_id)
    assert (job["spec"]["arch"], job["tags"], job["note"]) == ("resnet34", ["client"],
                                                               "from *tests*")  # fmt: skip
    assert [j["id"] for j in deck.jobs(tag="client")][:2] == [other, job_id]
    assert [j["id"] for j in deck.jobs(tag=["client", "b"])] == [other]
    assert [j["id"] for j in deck.jobs(tag="client", limit=1)] == [other]
    assert [j["id"] for j in deck.jobs(tag="client", limit=None)][:2] == [other, job_id]
    assert deck.label(job_id, tags=["x"])["tags"] == ["x"]

    with pytest.raises(ApiError) as refused:
        deck.submit(epochs=0, tags=["a,b"])
    assert refused.value.status == 400
    assert refused.value.fields == {
        "epochs": "must be at least 1",
        "tags": "a tag must not contain a comma ('a,b')",
    }
    assert deck.cancel(job_id) == "cancelled"
    with pytest.raises(ApiError) as refused:
        deck.cancel(job_id)
    assert (refused.value.status, refused.value.message) == (
        409,
        f"job {job_id} is already cancelled",
    )
    retried = deck.retry(job_id)
    assert queue.get_job(engine, retried).cloned_from == job_id
    with pytest.raises(TimeoutError):
        deck.wait(retried, timeout=0)  # still queued
    assert deck.wait(job_id, timeout=0)["status"] == "cancelled"


def test_metrics_arrive_as_a_dataframe_of_the_stored_points_and_then_only_new_ones(
    served, deck: Client
):
    _, engine = served
    claimed = seed.running_job(engine, name="metrics for the client")
    raw = deck.metrics(claimed.id, raw=True)
    for name, points in raw.groupby("name"):
        assert list(zip(points["step"], points["value"], strict=True)) == metric_series(
            engine, claimed.id, name
        )
    buckets = deck.metrics(claimed.id, names="batch/train_loss", buckets=3)
    assert list(buckets.columns) == ["name", "first_step", "last_step", "min", "max", "mean",
                                     "count"]  # fmt: skip
    assert buckets["count"].sum() == 30

    write_metrics(engine, claimed.id, seed.batch_points(30, 2))
    newer = deck.metrics(claimed.id, since=raw.attrs["cursor"])
    assert sorted(zip(newer["name"], newer["step"], strict=True)) == [
        ("batch/lr", 30), ("batch/lr", 31), ("batch/train_loss", 30), ("batch/train_loss", 31)
    ]  # fmt: skip
    assert deck.metrics(claimed.id, since=newer.attrs["cursor"]).empty


def test_download_checks_the_sha256_and_a_wrong_token_gets_401(served, deck, tmp_path: Path):
    base_url, engine = served
    job_id, export = seed.finished_job(engine, name="downloaded by the client")
    assert deck.wait(job_id, timeout=5)["status"] == "succeeded"
    [listed] = deck.artifacts(job_id)
    path = deck.download(job_id, "export", tmp_path)
    assert path == tmp_path / listed["file_name"]
    assert path.read_bytes() == export.read_bytes()

    info, token = create_token(engine, "short-lived", 1, "test")
    revoke_token(engine, info.id)
    with pytest.raises(ApiError) as refused:
        Client(base_url, token=token).jobs()
    assert (refused.value.status, refused.value.message) == (401, "the API token was revoked")
    assert "td_" not in repr(deck)
    with pytest.raises(ApiError) as unreachable:
        Client(f"http://127.0.0.1:{free_port()}", token=token).jobs()
    assert unreachable.value.status == 0 and "cannot reach" in unreachable.value.message


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")
def test_a_token_made_on_the_settings_page_submits_a_job_the_jobs_page_shows(served):
    base_url, _ = served
    with chromium() as browser:
        page = new_page(browser)
        page.goto(f"{base_url}/settings")
        page.get_by_label("Token name", exact=True).fill("browser notebook")
        page.get_by_role("button", name="Create token").click()
        page.get_by_text("Copy it now").wait_for()
        token = page.get_by_test_id("stCode").inner_text().strip()
        assert token.startswith("td_")

        job_id = Client(base_url, token=token).submit(name="submitted with a new token")
        page.goto(f"{base_url}/?tag=&q=new%20token")
        table = page.get_by_test_id("stDataFrame")
        table.locator("td", has_text="submitted with a new token").wait_for(state="attached")
        assert Client(base_url, token=token).job(job_id)["status"] == "queued"


def test_a_sweep_submitted_from_the_client_is_listed_and_shown(deck: Client):
    from tests.dashboard.test_api import SWEEP

    sweep_id = deck.submit_sweep(SWEEP)
    trials = deck.jobs(tag=f"sweep-{sweep_id}")
    assert len(trials) == 2 and all("api" in job["tags"] for job in trials)
    with pytest.raises(ApiError) as refused:
        deck.submit_sweep({**SWEEP, "trials": 0})
    assert refused.value.status == 400 and "trials" in refused.value.fields
    shown = deck.sweep(sweep_id)
    assert shown["id"] == sweep_id and sorted(t["job"] for t in shown["trials"]) == sorted(
        job["id"] for job in trials
    )
    assert deck.sweeps()[0] == shown
    with pytest.raises(ApiError) as missing:
        deck.sweep(sweep_id + 100)
    assert (
        missing.value.status == 404
        and missing.value.message == f"no sweep with id {sweep_id + 100}"
    )

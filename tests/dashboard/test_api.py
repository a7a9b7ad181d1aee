"""The HTTP API (issue 18): the real routes and the real sign-in gate in a Starlette app,
through Starlette's TestClient, on SQLite and Postgres. A token can do what it should and
nothing after revocation or expiry; every refusal is JSON with the CLI's words; the metric read
returns the points the database holds. The same API over a real server, through the Python
client, is tests/traindeck/test_client.py."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import update
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from dashboard import api, auth
from dashboard.api import guard
from db import queue
from db.engine import write_tx
from db.models import ApiToken, utcnow
from db.telemetry import metric_series, write_metrics
from db.tokens import check_token, create_token, revoke_token
from tests.support import seed
from tests.support.markdown import shown
from traindeck.cli import main

PASSWORD = "correct horse battery staple"


def _app(current: auth.Policy) -> Starlette:
    """The API's routes behind the dashboard's gate, beside a stand-in page."""
    page = Route("/jobs", lambda request: PlainTextResponse("the jobs page"))
    return Starlette(
        routes=[*api.routes(), page],
        middleware=[Middleware(auth.SignInGate, policy_=lambda: current)],
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A fresh throttle of wrong tokens, on a clock the test moves."""
    clock = Clock()
    limiter = auth.AttemptLimiter(per_client=auth.PER_CLIENT, per_account=guard.NEVER, clock=clock)
    monkeypatch.setattr(guard, "limiter", limiter)
    return clock


@pytest.fixture(params=["open on loopback", "signed in"])
def client(request, engine, clock, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    if request.param == "signed in":
        monkeypatch.setenv(auth.PASSWORD_HASH_ENV, auth.hash_password(PASSWORD))
        current = auth.policy("0.0.0.0", use_config=False)
    else:
        monkeypatch.delenv(auth.PASSWORD_HASH_ENV, raising=False)
        current = auth.policy("127.0.0.1", use_config=False)
    with TestClient(_app(current), base_url="http://127.0.0.1:8501") as test_client:
        test_client.signed_in = current.required
        yield test_client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def every_endpoint(job_id: int) -> list[tuple[str, str]]:
    """(method, path) of each route, with a job id, but the OpenAPI document."""
    found = []
    for route in api.routes()[1:-1]:
        path = route.path.replace("{job_id:int}", str(job_id)).replace("{kind}", "export")
        path = path.replace("{sweep_id:int}", "1")
        found += [(method, path) for method in sorted(route.methods - {"HEAD"})]
    return found


def test_every_endpoint_refuses_a_missing_wrong_revoked_or_expired_token(engine, client):
    job_id = queue.submit(engine, {"name": "mine"})
    info, token = create_token(engine, "laptop", 30, "test")
    for method, path in every_endpoint(job_id):
        for headers in ({}, bearer("td_wrong"), {"Authorization": token}):
            answer = client.request(method, path, headers=headers)
            assert answer.status_code == 401, (method, path, answer.text)
            assert answer.headers["www-authenticate"].startswith("Bearer")
            assert "token" in answer.json()["error"]
        guard.limiter.succeeded("testclient")  # the wrong tokens above are not the point here
    assert client.get("/api/v1/jobs", headers=bearer(token)).json()["jobs"][0]["id"] == job_id
    assert check_token(engine, token)[0].last_used_at is not None

    assert revoke_token(engine, info.id)
    answer = client.get(f"/api/v1/jobs/{job_id}", headers=bearer(token))
    assert (answer.status_code, answer.json()) == (401, {"error": "the API token was revoked"})

    expiring, other = create_token(engine, "short", 1, "test")
    assert client.get(f"/api/v1/jobs/{job_id}", headers=bearer(other)).status_code == 200
    with write_tx(engine) as connection:
        connection.execute(
            update(ApiToken)
            .where(ApiToken.id == expiring.id)
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    answer = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=bearer(other))
    assert (answer.status_code, answer.json()) == (401, {"error": "the API token has expired"})
    assert queue.get_job(engine, job_id).status == "queued"


def test_the_api_needs_no_sign_in_cookie_and_nothing_else_passes_the_gate(engine, client):
    _, token = create_token(engine, "laptop", 7, "test")
    assert client.get("/api/v1/jobs", headers=bearer(token)).status_code == 200
    unknown = client.get("/api/v2/anything")
    assert (unknown.status_code, unknown.json()["error"]) == (
        404,
        "no such API endpoint: GET /api/v2/anything",
    )
    assert client.get("/jobs").status_code == (401 if client.signed_in else 200)


def test_a_dashboard_nobody_can_sign_in_to_refuses_the_api_too(engine, monkeypatch):
    monkeypatch.delenv(auth.PASSWORD_HASH_ENV, raising=False)
    current = auth.policy("0.0.0.0", use_config=False)  # on a network, no sign-in configured
    assert current.problem
    _, token = create_token(engine, "laptop", 7, "test")
    with TestClient(_app(current), base_url="http://127.0.0.1:8501") as client:
        answer = client.get("/api/v1/jobs", headers=bearer(token))
    assert answer.status_code == 503
    assert answer.json()["error"].startswith("this dashboard cannot be used yet: sign-in is")


def test_wrong_tokens_are_throttled_per_address_and_the_right_one_clears_it(engine, client, clock):
    _, token = create_token(engine, "laptop", 7, "test")
    for _ in range(auth.PER_CLIENT.free):
        assert client.get("/api/v1/jobs", headers=bearer("td_guess")).status_code == 401
    held = client.get("/api/v1/jobs", headers=bearer(token))
    assert held.status_code == 429 and held.headers["retry-after"] == "30"
    assert held.json()["error"] == (
        "too many wrong API tokens from your address; try again in 30 s"
    )
    clock.now += 30
    assert client.get("/api/v1/jobs", headers=bearer(token)).status_code == 200
    assert client.get("/api/v1/jobs", headers=bearer("td_guess")).status_code == 401  # cleared


def test_submit_list_show_label_cancel_and_retry(engine, client, capsys):
    _, token = create_token(engine, "laptop", 7, "test")
    headers = bearer(token)
    answer = client.post(
        "/api/v1/jobs", headers=headers,
        json={"name": "api run", "epochs": 2, "tags": ["api", "x"], "note": "from *a* script"},
    )  # fmt: skip
    assert answer.status_code == 201
    job_id = answer.json()["id"]
    assert answer.headers["location"] == f"/api/v1/jobs/{job_id}"
    other = client.post("/api/v1/jobs", headers=headers, json={"arch": "resnet34"}).json()["id"]

    job = client.get(f"/api/v1/jobs/{job_id}", headers=headers).json()
    assert (job["name"], job["tags"], job["note"]) == ("api run", ["api", "x"], "from *a* script")
    assert main(["show", str(job_id), "--json"]) == 0
    assert capsys.readouterr().out.strip() and job["spec"]["epochs"] == 2

    def listed(query: str) -> list[int]:
        answer = client.get(f"/api/v1/jobs{query}", headers=headers)
        assert answer.status_code == 200, answer.text
        return [job["id"] for job in answer.json()["jobs"]]

    assert listed("") == [other, job_id]
    assert listed("?tag=api&tag=x&status=queued") == [job_id]
    assert listed("?arch=resnet34") == [other]
    assert listed("?q=SCRIPT") == [job_id]
    page = client.get("/api/v1/jobs?limit=1", headers=headers).json()
    assert page["next_after"] == other
    assert listed(f"?limit=1&after={other}") == [job_id]
    assert listed("?order=oldest") == [job_id, other]

    labelled = client.patch(f"/api/v1/jobs/{job_id}", headers=headers, json={"tags": "y"})
    assert (labelled.json()["tags"], labelled.json()["note"]) == (["y"], "from *a* script")

    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=headers).json() == {
        "id": job_id,
        "status": "cancelled",
    }
    again = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=headers)
    assert (again.status_code, again.json()) == (
        409,
        {"error": f"job {job_id} is already cancelled"},
    )
    retried = client.post(f"/api/v1/jobs/{job_id}/retry", headers=headers)
    assert retried.status_code == 201 and retried.json()["retry_of"] == job_id
    new = client.get(f"/api/v1/jobs/{retried.json()['id']}", headers=headers).json()
    assert (new["tags"], new["cloned_from"]) == (["y"], job_id)
    huge = client.get(f"/api/v1/jobs/{10**30}/metrics", headers=headers)
    assert (huge.status_code, huge.json()) == (404, {"error": f"no job with id {10**30}"})
    missing = client.get(f"/api/v1/jobs/{job_id + 100}", headers=headers)
    assert (missing.status_code, missing.json()) == (
        404,
        {"error": f"no job with id {job_id + 100}"},
    )


SWEEP = {
    "name": "lr on digits",
    "base": {"dataset": "digits", "epochs": 2, "img_size": 16, "device": "cpu", "tags": ["api"]},
    "space": {"lr": {"type": "log_uniform", "low": 1e-5, "high": 1e-1}, "bs": [16, 32]},
    "objective": "accuracy",
    "trials": 4,
    "max_concurrent": 2,
    "sampler": "random",
}


def test_a_sweep_is_submitted_and_its_trials_are_jobs_tagged_with_it(
    engine, client, capsys, tmp_path
):
    headers = bearer(create_token(engine, "laptop", 7, "test")[1])
    answer = client.post("/api/v1/sweeps", headers=headers, json=SWEEP)
    assert answer.status_code == 201, answer.text
    sweep_id, queued = answer.json()["id"], answer.json()["queued_trials"]
    listed = client.get(f"/api/v1/jobs?tag=sweep-{sweep_id}&tag=api", headers=headers).json()
    assert sorted(job["id"] for job in listed["jobs"]) == sorted(queued) and len(queued) == 2

    bad = {**SWEEP, "trials": 0, "space": {"colour": [1, 2]}}
    refused = client.post("/api/v1/sweeps", headers=headers, json=bad)
    assert refused.status_code == 400 and refused.json()["fields"]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(bad))
    capsys.readouterr()
    assert main(["sweep", "submit", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {refused.json()['error']}\n"


def test_sweeps_are_listed_and_shown_as_the_cli_prints_them(engine, client, capsys):
    headers = bearer(create_token(engine, "laptop", 7, "test")[1])
    labelled = {**SWEEP, "tags": ["lr", "digits"], "note": "**first** <b>try</b>"}
    sweep_id = client.post("/api/v1/sweeps", headers=headers, json=labelled).json()["id"]
    other = client.post("/api/v1/sweeps", headers=headers, json=SWEEP).json()["id"]

    def cli(*words):
        capsys.readouterr()
        assert main(["sweep", *words, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    listed = client.get("/api/v1/sweeps", headers=headers)
    assert listed.status_code == 200 and listed.json() == cli("list")
    assert [sweep["id"] for sweep in listed.json()] == [other, sweep_id]
    shown_sweep = client.get(f"/api/v1/sweeps/{sweep_id}", headers=headers).json()
    assert shown_sweep == cli("show", str(sweep_id))
    assert shown_sweep["tags"] == ["lr", "digits"] and shown_sweep["note"] == labelled["note"]
    assert [trial["status"] for trial in shown_sweep["trials"]] == ["queued", "queued"]
    assert shown_sweep["objective"] == {"metric": "accuracy", "direction": "maximize"}

    edited = client.patch(f"/api/v1/sweeps/{sweep_id}", headers=headers, json={"tags": "a, b"})
    assert edited.status_code == 200 and edited.json()["tags"] == ["a", "b"]
    assert edited.json()["note"] == labelled["note"], "only the tags were changed"
    refused = client.patch(f"/api/v1/sweeps/{sweep_id}", headers=headers, json={"colour": 1})
    assert refused.status_code == 400 and "colour" in refused.json()["fields"]
    missing = client.get(f"/api/v1/sweeps/{other + 100}", headers=headers)
    assert (missing.status_code, missing.json()) == (
        404,
        {"error": f"no sweep with id {other + 100}"},
    )
    huge = client.get(f"/api/v1/sweeps/{2**70}", headers=headers)
    assert huge.status_code == 404


@pytest.mark.parametrize(
    ("cli_args", "body"),
    [
        (["--epochs", "0"], {"epochs": 0}),
        (["--tag", "a,b"], {"tags": ["a,b"]}),
        (["--dataset", "nope", "--lr", "-1"], {"dataset": "nope", "lr": -1}),
        (["--colour", "red"], {"colour": "red"}),
    ],
)
def test_a_refused_spec_names_its_fields_with_the_clis_words(
    engine, client, capsys, cli_args, body
):
    _, token = create_token(engine, "laptop", 7, "test")
    answer = client.post("/api/v1/jobs", headers=bearer(token), json=body)
    assert answer.status_code == 400
    assert set(answer.json()["fields"]) == set(body)
    if cli_args[0] != "--colour":  # argparse refuses an unknown flag before any spec exists
        capsys.readouterr()  # the gate's line about the policy
        assert main(["submit", *cli_args]) == 2
        assert capsys.readouterr().err == f"error: {answer.json()['error']}\n"
    assert queue.list_jobs(engine) == []


def test_bad_bodies_and_parameters_are_refused_naming_them(engine, client):
    headers = bearer(create_token(engine, "laptop", 7, "test")[1])
    cases = [
        (client.post("/api/v1/jobs", headers=headers, content=b"{nope"), "spec"),
        (client.post("/api/v1/jobs", headers=headers, content=b""), "spec"),
        (client.post("/api/v1/jobs", headers=headers, json=[1]), "spec"),
        (client.post("/api/v1/jobs", headers=headers, content=b"x" * 1_000_001), "spec"),
        (client.get("/api/v1/jobs?limit=0", headers=headers), "limit"),
        (client.get("/api/v1/jobs?status=lost", headers=headers), "status"),
        (client.get("/api/v1/jobs?order=random", headers=headers), "order"),
        (client.get("/api/v1/jobs?after=99", headers=headers), "after"),
    ]
    for answer, field in cases:
        assert answer.status_code == 400, answer.text
        assert list(answer.json()["fields"]) == [field]
        assert answer.json()["error"].startswith(f"{field}: ")
    job_id = queue.submit(engine, {})
    bad = client.get(f"/api/v1/jobs/{job_id}/metrics?raw=maybe", headers=headers)
    assert bad.json()["fields"] == {"raw": "must be true or false"}
    assert client.patch(f"/api/v1/jobs/{job_id}", headers=headers, json={"note": 1}).json() == {
        "error": "note: must be text",
        "fields": {"note": "must be text"},
    }


def test_the_metric_read_returns_the_points_the_database_holds(engine, client):
    headers = bearer(create_token(engine, "laptop", 7, "test")[1])
    claimed = seed.running_job(engine)
    url = f"/api/v1/jobs/{claimed.id}/metrics"
    raw = client.get(f"{url}?raw=true", headers=headers).json()
    assert raw["raw"] is True and set(raw["series"]) >= {"batch/train_loss", "epoch/accuracy"}
    for name, points in raw["series"].items():
        assert list(zip(points["step"], points["value"], strict=True)) == metric_series(
            engine, claimed.id, name
        )
    buckets = client.get(f"{url}?name=batch/train_loss&buckets=5", headers=headers).json()
    loss = buckets["series"]["batch/train_loss"]
    assert list(buckets["series"]) == ["batch/train_loss"] and len(loss["count"]) == 5
    assert sum(loss["count"]) == 30 and loss["first_step"][0] == 0 and loss["last_step"][-1] == 29
    stored = metric_series(engine, claimed.id, "batch/train_loss")
    assert max(loss["max"]) == max(value for _, value in stored)

    write_metrics(engine, claimed.id, seed.batch_points(30, 4))
    newer = client.get(f"{url}?since={raw['cursor']}&name=batch/lr", headers=headers).json()
    assert newer["complete"] and newer["cursor"] > raw["cursor"]
    assert newer["series"] == {
        "batch/lr": {
            "step": [30, 31, 32, 33],
            "value": [value for step, value in metric_series(engine, claimed.id, "batch/lr")][30:],
        }
    }
    nothing = client.get(f"{url}?since={newer['cursor']}", headers=headers).json()
    assert nothing["series"] == {} and nothing["cursor"] == newer["cursor"]


def test_artifacts_are_listed_and_downloaded_with_their_sha256(engine, client, data_dir):
    headers = bearer(create_token(engine, "laptop", 7, "test")[1])
    job_id, export = seed.finished_job(engine)
    listed = client.get(f"/api/v1/jobs/{job_id}/artifacts", headers=headers).json()["artifacts"]
    sha256 = hashlib.sha256(export.read_bytes()).hexdigest()
    assert [(a["kind"], a["bytes"], a["sha256"]) for a in listed] == [
        ("export", export.stat().st_size, sha256)
    ]
    download = client.get(listed[0]["url"], headers=headers)
    assert download.status_code == 200 and download.content == export.read_bytes()
    digest = re.fullmatch(r"sha-256=:(.+):", download.headers["repr-digest"]).group(1)
    assert base64.b64decode(digest).hex() == sha256
    missing = client.get(f"/api/v1/jobs/{job_id}/artifacts/checkpoint", headers=headers)
    assert (missing.status_code, missing.json()) == (
        404,
        {"error": f"job {job_id} has no checkpoint file"},
    )
    export.unlink()
    gone = client.get(listed[0]["url"], headers=headers)
    assert gone.status_code == 410 and "no longer on this machine" in gone.json()["error"]


def test_the_openapi_document_needs_no_token_and_names_every_endpoint(client):
    document = client.get("/api/v1/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    assert document["components"]["securitySchemes"]["token"]["scheme"] == "bearer"
    assert set(document["components"]["schemas"]["JobSpec"]["properties"]) >= {"tags", "note"}
    served = set()
    for route in api.routes()[1:-1]:
        path = route.path.replace("{job_id:int}", "{job_id}")
        path = path.replace("{sweep_id:int}", "{sweep_id}")
        served |= {(method.lower(), path) for method in route.methods - {"HEAD"}}
    documented = {(method, path) for path, item in document["paths"].items() for method in item}
    assert documented == served


# --- the Settings page ----------------------------------------------------------------------


def test_the_settings_page_makes_a_token_shown_once_and_revokes_it(sqlite_engine):
    from streamlit.testing.v1 import AppTest

    from tests.dashboard.test_job_lists import APP, run

    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/settings.py")
    run(at)
    at.text_input(key="settings.token_name").input("")
    next(b for b in at.button if b.label == "Create token").click()
    run(at)
    assert "name: must be 1 to 100 characters, on one line" in [shown(e.value) for e in at.error]

    at.text_input(key="settings.token_name").input("notebook")
    at.selectbox(key="settings.token_days").set_value(7)
    next(b for b in at.button if b.label == "Create token").click()
    run(at)
    token = at.code[0].value
    info, why = check_token(sqlite_engine, token)
    assert why == "" and info.name == "notebook"
    assert (info.expires_at - info.created_at) == timedelta(days=7)
    table = at.dataframe[0].value
    assert list(table["token"]) == [f"{token[:8]}…"] and list(table["state"]) == ["active"]

    run(at)  # any later run: the token is not shown again, and nowhere on the page
    assert not at.code
    assert token not in repr([element.value for element in at.main if hasattr(element, "value")])

    next(b for b in at.button if b.label == "Revoke").click()
    run(at)
    assert check_token(sqlite_engine, token) == (None, "revoked")
    assert list(at.dataframe[0].value["state"]) == ["revoked"]

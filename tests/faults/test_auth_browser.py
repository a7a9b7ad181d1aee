"""The sign-in gate in a real headless Chromium against `streamlit run` on 0.0.0.0.

0.0.0.0 binds every interface of the machine, so the dashboard requires a sign-in. The browser
connects through 127.0.0.1 on purpose: the decision follows the address the server is bound
to, not the address a request comes from (a reverse proxy or an SSH tunnel on the same machine
would also arrive through loopback), and this workplace keeps test traffic on loopback.

Without credentials no page, no Streamlit session (websocket) and no download answers; with
the password they do, and a download link works only in the browser that signed in for it.
A screenshot of the sign-in page is saved as test-output/faults/signin.png.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.files import job_dir
from dashboard import auth
from db import queue
from tests.support.artifacts import record_local_file
from tests.support.browser import CHROMIUM, ROOT, chromium, new_page, running_dashboard

PASSWORD = "a long enough browser password"
SCREENSHOT = ROOT / "test-output" / "faults" / "signin.png"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]


@pytest.fixture
def finished_job(sqlite_engine) -> tuple[int, bytes]:
    """A succeeded job with an exported model on disk."""
    job_id = queue.submit(sqlite_engine, {"name": "guarded run", "epochs": 1})
    claimed = queue.claim(sqlite_engine, "auth-test-worker")
    assert claimed is not None and claimed.id == job_id
    export = job_dir(job_id) / "export.pkl"
    export.parent.mkdir(parents=True, exist_ok=True)
    content = os.urandom(200_000)
    export.write_bytes(content)
    record_local_file(sqlite_engine, job_id, "export", export)
    assert queue.finish(sqlite_engine, claimed.lease, "succeeded")
    return job_id, content


@pytest.fixture
def exposed_dashboard(finished_job, tmp_path: Path) -> Iterator[str]:
    env = dict(os.environ)
    env[auth.PASSWORD_HASH_ENV] = auth.hash_password(PASSWORD)
    env.pop(auth.AUTH_MODE_ENV, None)
    with running_dashboard("0.0.0.0", env, tmp_path / "streamlit.log") as base_url:
        yield base_url
    assert "sign-in required: password" in (tmp_path / "streamlit.log").read_text()


@pytest.fixture
def browser():
    with chromium() as chromium_browser:
        yield chromium_browser


def _new_page(browser):
    return new_page(browser, width=1300, height=900)


def _websocket_opens(page, base_url: str) -> str:
    """Try Streamlit's session websocket from the page: 'open' or 'refused'."""
    url = base_url.replace("http://", "ws://") + "/_stcore/stream"
    return page.evaluate(
        """(url) => new Promise((resolve) => {
            const socket = new WebSocket(url, ["streamlit"]);
            socket.onopen = () => { socket.close(); resolve("open"); };
            socket.onerror = () => resolve("refused");
            setTimeout(() => resolve("no answer"), 10000);
        })""",
        url,
    )


def _wait_for_signin(page, base_url: str) -> None:
    page.wait_for_url(lambda url: url.startswith(f"{base_url}/signin"))


def _sign_in(page, password: str) -> None:
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def test_nothing_is_reachable_without_the_password_and_everything_with_it(
    exposed_dashboard: str, browser, finished_job, tmp_path: Path
):
    base_url = exposed_dashboard
    job_id, content = finished_job

    # No credentials: every page ends on the sign-in form, and no Streamlit session starts.
    stranger = _new_page(browser)
    for path in ("/", "/jobs", "/new_job", f"/job?job={job_id}", "/datasets", "/workers"):
        stranger.goto(base_url + path)
        _wait_for_signin(stranger, base_url)
        stranger.get_by_label("Password").wait_for()
        assert stranger.get_by_test_id("stApp").count() == 0
        assert stranger.get_by_test_id("stSidebarNav").count() == 0
    assert _websocket_opens(stranger, base_url) == "refused"
    stranger.screenshot(path=str(tmp_path / "signin.png"))
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    SCREENSHOT.write_bytes((tmp_path / "signin.png").read_bytes())

    # A wrong password is refused with a message, and still nothing is shown.
    alice = _new_page(browser)
    alice.goto(f"{base_url}/job?job={job_id}")
    _sign_in(alice, "not the password")
    alice.get_by_role("alert").filter(has_text="Wrong password.").wait_for()
    assert alice.get_by_test_id("stApp").count() == 0

    # The right one leads back to the page that was asked for, with the app around it.
    _sign_in(alice, PASSWORD)
    alice.get_by_role("heading", name=f"#{job_id} · guarded run").wait_for()
    assert alice.get_by_test_id("stSidebarNav").count() == 1
    alice.get_by_text("Signed in with the password").wait_for()
    assert _websocket_opens(alice, base_url) == "open"

    alice.get_by_role("tab", name="Artifacts").click()
    link = alice.get_by_role("link", name="Download export.pkl")
    link.wait_for()
    download_url = base_url + link.get_attribute("href")
    response = alice.request.get(download_url)
    assert response.status == 200
    assert response.body() == content

    # The download link is no key: without a sign-in it answers 401 (a browser gets the form),
    # and another signed-in browser is refused the link that was made for alice.
    assert stranger.request.get(download_url).status == 401
    stranger.goto(download_url)
    _wait_for_signin(stranger, base_url)
    bob = _new_page(browser)
    bob.goto(base_url)
    _sign_in(bob, PASSWORD)
    bob.get_by_test_id("stSidebarNav").wait_for()
    refused = bob.request.get(download_url)
    assert refused.status == 403
    assert "belongs to another sign-in" in refused.text()

    # Signing out ends it: back to the form, alice's link stops working, and her other tab
    # (whose Streamlit session the sign-out shuts down) gets the form when it reloads.
    other_tab = alice.context.new_page()
    other_tab.goto(f"{base_url}/job?job={job_id}")
    other_tab.get_by_role("heading", name=f"#{job_id} · guarded run").wait_for()
    alice.get_by_role("link", name="Sign out").click()
    _wait_for_signin(alice, base_url)
    assert alice.request.get(download_url).status == 401
    other_tab.reload()
    _wait_for_signin(other_tab, base_url)
    alice.goto(f"{base_url}/jobs")
    _wait_for_signin(alice, base_url)

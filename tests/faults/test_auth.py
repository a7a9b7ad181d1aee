"""The dashboard's sign-in (dashboard.auth): the policy, the password hash, the rate limit, the
gate in front of every route, download links bound to a sign-in, and the gate in the page script.

The HTTP side runs the real middleware and routes in a Starlette app through Starlette's
TestClient; the page side runs dashboard/app.py through AppTest. The real browser against
`streamlit run` is tests/faults/test_auth_browser.py.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect
from streamlit import config as streamlit_config
from streamlit.runtime.secrets import secrets_singleton
from streamlit.testing.v1 import AppTest
from streamlit.web.server.server_util import get_cookie_secret
from streamlit.web.server.starlette.starlette_app_utils import create_signed_value
from streamlit.web.server.starlette.starlette_server_config import USER_COOKIE_NAME

from dashboard import auth, downloads
from tests.support.markdown import shown

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "dashboard" / "app.py")
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def password_hash() -> str:
    return auth.hash_password(PASSWORD)


@pytest.fixture(autouse=True)
def _no_auth_settings_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        auth.PASSWORD_HASH_ENV,
        auth.AUTH_MODE_ENV,
        auth.SESSION_HOURS_ENV,
        auth.ALLOWED_USERS_ENV,
    ):
        monkeypatch.delenv(name, raising=False)


# --- the password hash --------------------------------------------------------------------------


def test_a_hash_matches_its_password_only(password_hash: str):
    parsed = auth.parse_password_hash(password_hash)
    assert parsed.matches(PASSWORD)
    assert not parsed.matches(PASSWORD + " ")
    assert not parsed.matches("")
    assert parsed.encode() == password_hash
    # Salted: the same password never hashes the same way twice.
    assert auth.hash_password(PASSWORD) != password_hash


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("hunter2", "expected scrypt:N:r:p:salt:digest"),
        ("pbkdf2:1:2:3:4:5", "expected scrypt"),
        ("scrypt:x:8:1:AAAAAAAAAAA=:AAAAAAAAAAAAAAAAAAAAAA==", "must be numbers"),
        ("scrypt:1000:8:1:AAAAAAAAAAA=:AAAAAAAAAAAAAAAAAAAAAA==", "power of two"),
        ("scrypt:16384:99:1:AAAAAAAAAAA=:AAAAAAAAAAAAAAAAAAAAAA==", "r must be"),
        ("scrypt:16384:8:1:AA==:AAAAAAAAAAAAAAAAAAAAAA==", "too short"),
        ("scrypt:16384:8:1:AAAAAAAAAAA=:not base64!", "base64"),
    ],
)
def test_a_malformed_hash_is_named(text: str, words: str):
    with pytest.raises(auth.PasswordHashError, match=words):
        auth.parse_password_hash(text)


def _auth_cli(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dashboard.auth", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


@pytest.mark.slow  # starts several real processes, one after another
def test_the_hash_command_prints_a_hash_for_the_environment():
    made = _auth_cli("hash", stdin=PASSWORD + "\n")
    assert made.returncode == 0, made.stderr
    assert auth.parse_password_hash(made.stdout.strip()).matches(PASSWORD)

    short = _auth_cli("hash", stdin="short\n")
    assert short.returncode == 2
    assert short.stdout == ""
    assert "at least 8 characters" in short.stderr
    assert "Traceback" not in short.stderr


@pytest.mark.slow  # starts several real processes, one after another
def test_the_check_command_says_what_an_address_needs(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(auth.PASSWORD_HASH_ENV, raising=False)
    local = _auth_cli("check", "--address", "127.0.0.1", stdin="")
    assert (local.returncode, "no sign-in") == (0, local.stdout.strip().rsplit("; ", 1)[1])
    everywhere = _auth_cli("check", "--address", "0.0.0.0", stdin="")
    assert everywhere.returncode == 1
    assert "nobody can sign in" in everywhere.stdout
    assert auth.PASSWORD_HASH_ENV in everywhere.stdout


# --- the policy ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        (None, False),  # unset: every interface
        ("", False),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.2", False),
        ("10.1.2.3", False),
        ("no-such-host.invalid", False),
    ],
)
def test_only_a_loopback_address_counts_as_loopback(address: str | None, loopback: bool):
    assert auth.listens_on_loopback(address) is loopback


def test_sign_in_is_optional_on_loopback_and_required_elsewhere(
    monkeypatch: pytest.MonkeyPatch, password_hash: str
):
    local = auth.policy("127.0.0.1", use_config=False)
    assert (local.required, local.problem) == (False, None)

    for address in ("0.0.0.0", "::", "192.0.2.2", None):
        exposed = auth.policy(address, use_config=False)
        assert exposed.required and exposed.by_address_only
        assert "none is configured" in exposed.problem
        assert auth.PASSWORD_HASH_ENV in exposed.problem

    monkeypatch.setenv(auth.PASSWORD_HASH_ENV, password_hash)
    for address in ("127.0.0.1", "0.0.0.0"):
        with_password = auth.policy(address, use_config=False)
        assert with_password.required and with_password.problem is None
        assert with_password.password is not None and not with_password.by_address_only


def test_forced_and_broken_settings_refuse_everyone_with_a_reason(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv(auth.AUTH_MODE_ENV, "required")
    forced = auth.policy("127.0.0.1", use_config=False)
    assert forced.required and "none is configured" in forced.problem

    monkeypatch.setenv(auth.AUTH_MODE_ENV, "sometimes")
    broken = auth.policy("127.0.0.1", use_config=False)
    assert broken.required
    assert broken.problem == "TRAINDECK_AUTH='sometimes' is not valid: 'auto' or 'required'"

    # Any setting that cannot be used shuts the door the same way (common.settings).
    monkeypatch.delenv(auth.AUTH_MODE_ENV)
    monkeypatch.setenv(auth.SESSION_HOURS_ENV, "abc")
    broken = auth.policy("127.0.0.1", use_config=False)
    assert broken.required and broken.problem.startswith("TRAINDECK_SESSION_HOURS='abc' is not")
    monkeypatch.setenv(auth.SESSION_HOURS_ENV, "12")
    monkeypatch.setenv(auth.ALLOWED_USERS_ENV, "example.org")  # no @: would match nobody
    assert "TRAINDECK_ALLOWED_USERS='example.org' is not valid" in auth.policy("::1").problem
    monkeypatch.delenv(auth.ALLOWED_USERS_ENV)

    monkeypatch.setenv(auth.PASSWORD_HASH_ENV, "hunter2")
    broken = auth.policy("127.0.0.1", use_config=False)
    assert broken.required
    assert f"{auth.PASSWORD_HASH_ENV} is not a hash made by" in broken.problem


# --- the rate limit -----------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failures_back_off_exponentially_per_client():
    clock = FakeClock()
    limiter = auth.AttemptLimiter(clock=clock)
    for _ in range(auth.PER_CLIENT.free):
        assert limiter.wait_s("10.0.0.1") == (0.0, "")
        limiter.failed("10.0.0.1")
    # Five typing mistakes are free; then 30 s, 1 min, 2 min, ... at most 15 min.
    waits = []
    for _ in range(8):
        wait, whose = limiter.wait_s("10.0.0.1")
        assert whose == "client"
        waits.append(round(wait))
        clock.now += wait
        assert limiter.wait_s("10.0.0.1") == (0.0, "")
        limiter.failed("10.0.0.1")
    assert waits == [30, 60, 120, 240, 480, 900, 900, 900]
    assert limiter.wait_s("10.0.0.2") == (0.0, "")  # another client is not held up

    limiter.succeeded("10.0.0.1")  # the right password clears its address
    assert limiter.wait_s("10.0.0.1") == (0.0, "")
    for _ in range(auth.PER_CLIENT.free + 1):
        limiter.failed("10.0.0.3")
    clock.now += 3600  # an hour after its last failure an address starts afresh
    assert limiter.wait_s("10.0.0.3") == (0.0, "")


def test_no_amount_of_failures_elsewhere_pauses_a_browser_that_signed_in_before():
    clock = FakeClock()
    limiter = auth.AttemptLimiter(clock=clock)
    # The tester's pause: 30 failures from as many addresses. The account is far from its limit.
    for n in range(30):
        limiter.failed(f"127.0.0.{n + 2}")
    assert limiter.wait_s("127.0.0.200") == (0.0, "")

    # Guessing spread over hundreds of addresses slows down the guessing of the password ...
    for n in range(200):
        limiter.failed(f"10.1.{n // 250}.{n % 250}")
    wait, whose = limiter.wait_s("192.0.2.7")
    assert whose == "account" and wait > 0
    assert "a browser that has signed in here before can sign in now" in (
        auth.too_many_attempts_message(wait, whose)
    )
    # ... but never a browser that shows its device cookie, from any address.
    assert limiter.wait_s("192.0.2.7", device="alice-laptop") == (0.0, "")
    assert limiter.wait_s("10.1.0.1", device="alice-laptop") == (0.0, "")
    # Its own mistakes count against it alone.
    for _ in range(auth.PER_CLIENT.free):
        limiter.failed("192.0.2.7", device="alice-laptop")
    wait, whose = limiter.wait_s("192.0.2.7", device="alice-laptop")
    assert (round(wait), whose) == (30, "device")
    assert "from this browser" in auth.too_many_attempts_message(wait, whose)
    assert limiter.wait_s("192.0.2.7", device="bob-desktop") == (0.0, "")


# --- the HTTP side: the gate, the sign-in page, downloads --------------------------------------


async def _page(request):
    return PlainTextResponse("the jobs page")


async def _stream(websocket: WebSocket):
    await websocket.accept()
    await websocket.send_text("session started")
    await websocket.close()


def _app(current: auth.Policy, limiter: auth.AttemptLimiter | None = None) -> Starlette:
    """The dashboard's own gate, sign-in routes and download route, with stand-in pages."""
    signin = auth.SignInRoutes(limiter or auth.AttemptLimiter(), policy_=lambda: current)
    return Starlette(
        routes=[
            Route("/", _page),
            Route("/jobs", _page),
            WebSocketRoute("/_stcore/stream", _stream),
            Route("/_stcore/health", lambda request: PlainTextResponse("ok")),
            *downloads.routes(),
            *signin.routes(),
        ],
        middleware=[Middleware(auth.SignInGate, policy_=lambda: current)],
    )


@pytest.fixture
def password_policy(password_hash: str, monkeypatch: pytest.MonkeyPatch) -> auth.Policy:
    # The download route reads the process's policy, as it does in the dashboard.
    monkeypatch.setenv(auth.PASSWORD_HASH_ENV, password_hash)
    current = auth.policy("0.0.0.0", use_config=False)
    assert current.required and current.problem is None
    return current


@pytest.fixture
def client(password_policy: auth.Policy) -> Iterator[TestClient]:
    with TestClient(_app(password_policy), follow_redirects=False) as test_client:
        yield test_client


HTML = {"Accept": "text/html,application/xhtml+xml"}


def _sign_in(client: TestClient, password: str = PASSWORD, next_path: str = "/jobs"):
    return client.post("/signin", data={"password": password, "next": next_path})


def test_without_a_sign_in_nothing_answers_but_the_sign_in_page(client: TestClient):
    page = client.get("/jobs?job=3", headers=HTML)
    assert page.status_code == 303
    assert page.headers["location"] == "/signin?next=/jobs%3Fjob%3D3"
    assert client.get("/jobs").status_code == 401
    assert client.get("/downloads/anything").status_code == 401
    with pytest.raises(WebSocketDisconnect), client.websocket_connect("/_stcore/stream") as ws:
        ws.receive_text()
    assert client.get("/_stcore/health").text == "ok"

    signin = client.get("/signin?next=/jobs")
    assert signin.status_code == 200
    assert 'type="password"' in signin.text and 'value="/jobs"' in signin.text


def test_the_password_opens_every_route_until_sign_out(client: TestClient):
    wrong = _sign_in(client, "not the password")
    assert wrong.status_code == 401
    assert "Wrong password." in wrong.text
    assert auth.SESSION_COOKIE not in client.cookies

    signed_in = _sign_in(client)
    assert (signed_in.status_code, signed_in.headers["location"]) == (303, "/jobs")
    set_cookie = signed_in.headers["set-cookie"]
    assert "HttpOnly" in set_cookie and "SameSite=lax" in set_cookie
    assert client.get("/jobs", headers=HTML).text == "the jobs page"
    with client.websocket_connect("/_stcore/stream") as ws:
        assert ws.receive_text() == "session started"
    # Signed in already: the sign-in page sends the person on.
    assert client.get("/signin?next=/jobs").headers["location"] == "/jobs"

    cookie = client.cookies[auth.SESSION_COOKIE]
    signed_out = client.get("/signout")
    assert (signed_out.status_code, signed_out.headers["location"]) == (303, "/signin")
    assert client.get("/jobs").status_code == 401
    # The old cookie, kept by someone, no longer works either.
    client.cookies.clear()
    client.cookies.set(auth.SESSION_COOKIE, cookie)
    assert client.get("/jobs").status_code == 401


def test_forged_and_foreign_cookies_are_refused(client: TestClient):
    _sign_in(client)
    genuine = client.cookies[auth.SESSION_COOKIE]
    for forged in (genuine[:-2] + "xx", "garbage", ""):
        client.cookies.clear()
        client.cookies.set(auth.SESSION_COOKIE, forged)
        assert client.get("/jobs").status_code == 401
    # A cookie made under another password stops working when the password changes.
    other = auth.parse_password_hash(auth.hash_password("another password"))
    client.cookies.clear()
    client.cookies.set(auth.SESSION_COOKIE, auth.new_session_cookie(other))
    assert client.get("/jobs").status_code == 401


def test_sign_in_attempts_are_rate_limited_with_a_message(password_policy: auth.Policy):
    limiter = auth.AttemptLimiter(per_client=auth.Backoff(free=3, first_wait_s=30, max_wait_s=60))
    with TestClient(_app(password_policy, limiter), follow_redirects=False) as client:
        for _ in range(3):
            assert _sign_in(client, "guess").status_code == 401
        refused = _sign_in(client)  # even the right password waits out the back-off
        assert refused.status_code == 429
        assert "Too many failed sign-ins from your address" in refused.text
        assert 1 <= int(refused.headers["retry-after"]) <= 30
        assert auth.SESSION_COOKIE not in client.cookies


def test_sign_in_refuses_oversized_forms_and_foreign_redirects(client: TestClient):
    huge = client.post("/signin", content=b"password=" + b"x" * 10_000)
    assert huge.status_code == 413
    assert "too large" in huge.text
    too_long = _sign_in(client, "x" * (auth.MAX_PASSWORD_LENGTH + 1))
    assert too_long.status_code == 401
    for target in ("//evil.example/", "https://evil.example/", "/\\evil.example", "jobs"):
        assert _sign_in(client, next_path=target).headers["location"] == "/"
        client.cookies.clear()


def test_a_misconfigured_dashboard_refuses_everyone_and_says_why():
    current = auth.policy("0.0.0.0", use_config=False)
    with TestClient(_app(current), follow_redirects=False) as client:
        for path in ("/jobs", "/downloads/x"):
            response = client.get(path, headers=HTML)
            assert response.status_code == 503
            assert auth.PASSWORD_HASH_ENV in response.text
        page = client.get("/signin")
        assert page.status_code == 503 and "cannot be used yet" in page.text
        assert client.post("/signin", data={"password": "x"}).status_code == 503


def test_on_loopback_with_nothing_configured_everything_is_open():
    current = auth.policy("127.0.0.1", use_config=False)
    with TestClient(
        _app(current), base_url="http://localhost:8501", follow_redirects=False
    ) as client:
        assert client.get("/jobs", headers=HTML).text == "the jobs page"
        with client.websocket_connect("ws://localhost:8501/_stcore/stream") as ws:
            assert ws.receive_text() == "session started"
        assert client.get("/signin?next=/jobs").headers["location"] == "/jobs"


# --- issue 23: DNS rebinding, who may pause a sign-in, proxies, Secure cookies ----------------


@pytest.mark.parametrize(
    "host",
    ["rebind.evil.example:8501", "rebind.evil.example", "192.0.2.9:8501", "localhost.evil.example"],
)
def test_open_on_loopback_a_rebinding_host_is_refused_on_http_and_websocket(host: str):
    current = auth.policy("127.0.0.1", use_config=False)
    assert not current.required
    with TestClient(_app(current), base_url=f"http://{host}", follow_redirects=False) as client:
        for path in ("/", "/jobs", "/signin", "/_stcore/health", "/downloads/x"):
            refused = client.get(path, headers=HTML)
            assert refused.status_code == 403, path
            assert "answers only at localhost" in refused.text
        origin = {"origin": f"http://{host}"}
        with (
            pytest.raises(WebSocketDisconnect),
            client.websocket_connect(f"ws://{host}/_stcore/stream", headers=origin) as ws,
        ):
            ws.receive_text()


@pytest.mark.parametrize(
    "host", ["localhost:8501", "LOCALHOST", "127.0.0.1:8501", "127.0.0.2", "[::1]:8501"]
)
def test_open_on_loopback_loopback_names_are_answered(host: str):
    current = auth.policy("127.0.0.1", use_config=False)
    with TestClient(_app(current), base_url=f"http://{host}", follow_redirects=False) as client:
        assert client.get("/jobs", headers=HTML).text == "the jobs page"
        with client.websocket_connect(f"ws://{host}/_stcore/stream") as ws:
            assert ws.receive_text() == "session started"


def test_open_on_loopback_the_public_name_is_answered_too(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRAINDECK_PUBLIC_URL", "https://Traindeck.Example.com/")
    current = auth.policy("127.0.0.1", use_config=False)
    assert not current.required and current.public_host == "traindeck.example.com"
    app = _app(current)
    with TestClient(app, base_url="https://traindeck.example.com") as client:
        assert client.get("/jobs").text == "the jobs page"
    with TestClient(app, base_url="http://other.example.com") as client:
        assert client.get("/jobs").status_code == 403
    for refused in (None, "", "a b", "user@localhost", "localhost:port"):
        assert not auth.host_answered(refused, "127.0.0.1", None)


def test_python_m_dashboard_tells_streamlit_and_uvicorn_whom_to_believe(
    monkeypatch: pytest.MonkeyPatch, password_hash: str
):
    from common.settings import settings
    from dashboard.__main__ import forwarded_allow_ips, streamlit_argv

    # Open on loopback: Streamlit's websocket, too, answers only the loopback names.
    flags = [flag for flag in streamlit_argv([]) if flag.startswith("--server.allowedHosts=")]
    assert flags == [f"--server.allowedHosts={name}" for name in ("localhost", "127.0.0.1", "::1")]
    monkeypatch.setenv("TRAINDECK_PUBLIC_URL", "https://traindeck.example.com")
    assert "--server.allowedHosts=traindeck.example.com" in streamlit_argv([])
    # With a sign-in, people may use any name for the machine.
    assert not any("allowedHosts" in flag for flag in streamlit_argv(["--address", "0.0.0.0"]))
    monkeypatch.setenv(auth.PASSWORD_HASH_ENV, password_hash)
    assert not any("allowedHosts" in flag for flag in streamlit_argv([]))

    # uvicorn believes forwarded headers from the trusted proxies only: none by default (its
    # own default is 127.0.0.1 and ::1, any process on the machine).
    assert forwarded_allow_ips(settings()) == ""
    monkeypatch.setenv("TRAINDECK_TRUSTED_PROXIES", "127.0.0.1 10.8.0.0/16")
    assert forwarded_allow_ips(settings()) == "127.0.0.1/32,10.8.0.0/16"


def _client_at(app: Starlette, address: str, **kwargs) -> TestClient:
    return TestClient(app, client=(address, 50000), follow_redirects=False, **kwargs)


def test_head_and_passwordless_posts_are_not_attempts(password_policy: auth.Policy):
    app = _app(password_policy, auth.AttemptLimiter())
    # The tester's pause: 30 bodiless requests from each of many other loopback addresses.
    for n in range(30):
        with _client_at(app, f"127.0.0.{n + 2}") as other:
            assert other.head("/signin").status_code == 200
            assert other.post("/signin").status_code == 400
            assert other.post("/signin", data={"password": ""}).status_code == 400
    with _client_at(app, "127.0.0.200") as user:
        assert _sign_in(user).status_code == 303
    # And from one address: as many as it likes, then its own right password.
    with _client_at(app, "127.0.0.9") as same:
        for _ in range(50):
            assert same.head("/signin").status_code == 200
            assert same.post("/signin", data={"next": "/jobs"}).status_code == 400
        assert _sign_in(same).status_code == 303


def test_failures_from_other_clients_cannot_pause_a_users_sign_in(password_policy: auth.Policy):
    # A small account limit, so that the test reaches it with few (slow, scrypt) checks.
    limiter = auth.AttemptLimiter(per_account=auth.Backoff(free=8, first_wait_s=30, max_wait_s=60))
    app = _app(password_policy, limiter)
    with _client_at(app, "192.0.2.10") as alice:  # alice's browser signed in once before
        assert _sign_in(alice).status_code == 303
        assert auth.DEVICE_COOKIE in alice.cookies
        alice.get("/signout")
        assert auth.DEVICE_COOKIE in alice.cookies  # kept after signing out

        for n in range(8):  # wrong guesses from eight other addresses
            with _client_at(app, f"198.51.100.{n + 1}") as other:
                assert _sign_in(other, "guess").status_code == 401
        # The account's back-off now holds browsers that have never signed in here ...
        with _client_at(app, "192.0.2.11") as newcomer:
            refused = _sign_in(newcomer)
            assert refused.status_code == 429
            assert "a browser that has signed in here before can sign in now" in refused.text
        # ... but not alice, from her usual address or any other.
        assert _sign_in(alice).status_code == 303
        device = alice.cookies[auth.DEVICE_COOKIE]
    with _client_at(app, "198.51.100.1", cookies={auth.DEVICE_COOKIE: device}) as moved:
        assert _sign_in(moved).status_code == 303
    # A device cookie from another password (or forged) is no pass.
    other = auth.parse_password_hash(auth.hash_password("another password"))
    forged, _ = auth.new_device_cookie(other)
    assert auth.device_from_cookies({auth.DEVICE_COOKIE: forged}, password_policy.password) is None
    assert auth.device_from_cookies({auth.DEVICE_COOKIE: "x"}, password_policy.password) is None
    with _client_at(app, "192.0.2.13", cookies={auth.DEVICE_COOKIE: forged}) as pretender:
        assert _sign_in(pretender).status_code == 429


def test_x_forwarded_for_is_believed_only_from_a_trusted_proxy(
    password_hash: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(auth.PASSWORD_HASH_ENV, password_hash)
    monkeypatch.setenv("TRAINDECK_TRUSTED_PROXIES", "10.9.9.9, 10.8.0.0/16")
    current = auth.policy("0.0.0.0", use_config=False)
    assert [str(net) for net in current.trusted_proxies] == ["10.9.9.9/32", "10.8.0.0/16"]
    limiter = auth.AttemptLimiter(per_client=auth.Backoff(free=3, first_wait_s=30, max_wait_s=60))
    app = _app(current, limiter)

    # From a client that is no trusted proxy, X-Forwarded-For changes nothing: one address.
    with _client_at(app, "203.0.113.5") as direct:
        for n in range(3):
            forged = {"x-forwarded-for": f"198.51.100.{n}"}
            assert direct.post("/signin", data={"password": "x"}, headers=forged).status_code == 401
        forged = {"x-forwarded-for": "198.51.100.77"}
        assert direct.post("/signin", data={"password": "y"}, headers=forged).status_code == 429

    # Through the trusted proxy, each forwarded client is its own (the proxy appends the
    # address it saw; what the client itself put in front of it is not believed).
    with _client_at(app, "10.9.9.9") as proxy:
        for n in range(6):
            forwarded = {"x-forwarded-for": f"6.6.6.6, 198.51.100.{n}"}
            response = proxy.post("/signin", data={"password": "x"}, headers=forwarded)
            assert response.status_code == 401
        same = {"x-forwarded-for": "198.51.100.1"}  # its second, third, then fourth try
        for expected in (401, 401, 429):
            response = proxy.post("/signin", data={"password": "x"}, headers=same)
            assert response.status_code == expected
        other = {"x-forwarded-for": "198.51.100.50"}
        assert proxy.post("/signin", data={"password": PASSWORD}, headers=other).status_code == 303

    # Two proxies in a row: the right-most address that is not a trusted proxy is the client.
    scope = {"type": "http", "client": ("10.9.9.9", 1), "path": "/", "query_string": b"",
             "headers": [(b"x-forwarded-for", b"6.6.6.6, 198.51.100.3, 10.8.1.2")]}  # fmt: skip
    assert auth.client_address(HTTPConnection(scope), current.trusted_proxies) == "198.51.100.3"
    scope["client"] = ("203.0.113.5", 1)
    assert auth.client_address(HTTPConnection(scope), current.trusted_proxies) == "203.0.113.5"


def test_the_session_cookie_is_secure_behind_a_trusted_https_proxy(
    password_hash: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(auth.PASSWORD_HASH_ENV, password_hash)
    monkeypatch.setenv("TRAINDECK_TRUSTED_PROXIES", "10.9.9.9")

    def cookies_after_sign_in(address: str, headers: dict[str, str]) -> list[str]:
        current = auth.policy("0.0.0.0", use_config=False)
        with _client_at(_app(current), address) as client:
            response = client.post(
                "/signin", data={"password": PASSWORD, "next": "/"}, headers=headers
            )
            assert response.status_code == 303
            return response.headers.get_list("set-cookie")

    https = {"x-forwarded-proto": "https"}
    behind_proxy = cookies_after_sign_in("10.9.9.9", https)
    assert len(behind_proxy) == 2  # the session, and the device cookie
    assert all("Secure" in cookie and "HttpOnly" in cookie for cookie in behind_proxy)
    # The same header from anyone else is not believed.
    assert not any("Secure" in cookie for cookie in cookies_after_sign_in("203.0.113.5", https))
    assert not any("Secure" in cookie for cookie in cookies_after_sign_in("10.9.9.9", {}))
    # A public https address makes them Secure whatever the request says.
    monkeypatch.setenv("TRAINDECK_PUBLIC_URL", "https://traindeck.example.com")
    assert all("Secure" in cookie for cookie in cookies_after_sign_in("203.0.113.5", {}))


def test_a_download_link_works_only_for_the_sign_in_that_got_it(
    password_policy: auth.Policy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    model = tmp_path / "export.pkl"
    model.write_bytes(b"weights" * 1000)
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    app = _app(password_policy)
    with (
        TestClient(app, follow_redirects=False) as alice,
        TestClient(app, follow_redirects=False) as bob,
    ):
        _sign_in(alice)
        _sign_in(bob)
        alice_identity = auth.identity_from_cookies(alice.cookies, password_policy)
        assert alice_identity and alice_identity.startswith("password:")
        # The job page asks for the link inside alice's script run: her identity is its owner.
        # (downloads calls `auth.session_identity`, the package's name: that is the one patched.)
        monkeypatch.setattr(auth, "session_identity", lambda: alice_identity)
        url = downloads.link_for(model, "job1-export.pkl", digest)

        assert alice.get(url).content == model.read_bytes()
        refused = bob.get(url)
        assert refused.status_code == 403
        assert "belongs to another sign-in" in refused.text
        alice.get("/signout")
        assert alice.get(url).status_code == 401


# --- OIDC: Streamlit's identity cookie ------------------------------------------------------------


@pytest.fixture
def oidc_secrets(tmp_path: Path) -> Iterator[None]:
    """A real .streamlit/secrets.toml with an [auth] section, read by Streamlit's secrets."""
    secrets_file = tmp_path / "secrets.toml"
    secrets_file.write_text(
        "[auth]\n"
        'redirect_uri = "http://localhost:8501/oauth2callback"\n'
        'cookie_secret = "a-test-cookie-secret-of-some-length"\n'
        'client_id = "traindeck"\n'
        'client_secret = "s3cret"\n'
        'server_metadata_url = "http://127.0.0.1:9/.well-known/openid-configuration"\n'
    )
    before = streamlit_config.get_option("secrets.files")
    streamlit_config.set_option("secrets.files", [str(secrets_file)])
    secrets_singleton._reset()
    yield
    streamlit_config.set_option("secrets.files", before)
    secrets_singleton._reset()


def _streamlit_user_cookie(payload: dict) -> str:
    signed = create_signed_value(get_cookie_secret(), USER_COOKIE_NAME, json.dumps(payload))
    return signed.decode()


def test_oidc_sign_in_is_read_from_streamlits_signed_identity_cookie(oidc_secrets: None):
    current = auth.policy("0.0.0.0", use_config=False)
    assert current.problem is None and current.oidc_providers == ("default",)
    user = {
        "sub": "1234",
        "email": "ada@example.com",
        "origin": "http://localhost:8501",
        "is_logged_in": True,
        "provider": "default",
    }
    cookies = {USER_COOKIE_NAME: _streamlit_user_cookie(user)}
    assert auth.identity_from_cookies(cookies, current) == "oidc:default:1234"

    for changed in ({"origin": "http://elsewhere:8501"}, {"is_logged_in": False}):
        cookies = {USER_COOKIE_NAME: _streamlit_user_cookie(user | changed)}
        assert auth.identity_from_cookies(cookies, current) is None
    assert auth.identity_from_cookies({USER_COOKIE_NAME: "forged"}, current) is None

    with TestClient(_app(current), follow_redirects=False) as client:
        page = client.get("/signin")
        assert '<a class="button" href="/auth/login?provider=' in page.text
        assert 'type="password"' not in page.text
        assert client.get("/jobs").status_code == 401
        client.cookies.set(USER_COOKIE_NAME, _streamlit_user_cookie(user))
        assert client.get("/jobs").text == "the jobs page"


def test_oidc_users_can_be_limited_to_addresses_and_domains(
    oidc_secrets: None, monkeypatch: pytest.MonkeyPatch
):
    current = auth.policy("0.0.0.0", use_config=False)
    monkeypatch.setenv(auth.ALLOWED_USERS_ENV, "@example.com, grace@navy.mil")
    base = {"origin": "http://localhost:8501", "is_logged_in": True, "provider": "default"}

    def identity(**user: object) -> str | None:
        cookie = _streamlit_user_cookie(base | user)
        return auth.identity_from_cookies({USER_COOKIE_NAME: cookie}, current)

    assert identity(sub="1", email="Ada@Example.com") == "oidc:default:1"
    assert identity(sub="2", email="grace@navy.mil", email_verified=True) == "oidc:default:2"
    assert identity(sub="3", email="mallory@example.org") is None
    assert identity(sub="4", email="eve@example.com", email_verified=False) is None
    assert identity(sub="5") is None  # no e-mail address to check

    with TestClient(_app(current), follow_redirects=False) as client:
        client.cookies.set(
            USER_COOKIE_NAME, _streamlit_user_cookie(base | {"sub": "3", "email": "m@evil.org"})
        )
        assert client.get("/jobs").status_code == 401
        page = client.get("/signin")
        assert page.status_code == 403
        assert "m@evil.org may not use this dashboard" in page.text
        assert 'href="/signout"' in page.text


# --- the gate inside the page script (AppTest) ------------------------------------------------


def _run_app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_page_script_shows_nothing_without_a_sign_in(
    sqlite_engine, password_hash: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(auth.PASSWORD_HASH_ENV, password_hash)
    at = _run_app()
    assert [w.value for w in at.warning] == ["Sign in to use this dashboard."]
    assert not at.dataframe and not at.title and not at.button

    monkeypatch.setenv(auth.PASSWORD_HASH_ENV, "scrypt:broken")
    at = _run_app()
    assert len(at.error) == 1
    assert f"{auth.PASSWORD_HASH_ENV} is not a hash made by" in shown(at.error[0].value)
    assert not at.dataframe and not at.button


def test_the_page_script_runs_where_no_sign_in_is_needed(sqlite_engine):
    # AppTest binds no address: with nothing configured nobody but the test reaches the script.
    at = _run_app()
    assert not at.warning
    assert any("Jobs" in str(title.value) for title in at.title)

"""The sign-in gate of the real server (`python -m dashboard`, uvicorn in front of Streamlit),
probed over HTTP from 127.0.0.1 (issue 23, findings 1, 4 and 8).

- Open on loopback, a request naming another Host (a DNS-rebinding page's own name) gets 403,
  on HTTP and on the websocket handshake; `localhost` and `127.0.0.1` are answered.
- With a password, X-Forwarded-For and X-Forwarded-Proto from 127.0.0.1 are not believed
  unless TRAINDECK_TRUSTED_PROXIES says 127.0.0.1 is a proxy (uvicorn believed them from any
  local process before); HEAD /signin is no failed attempt; behind the trusted proxy the
  session cookie is Secure when the proxy says https.

The first wait of the back-off is 30 s: a request refused here follows the last failure at once.
"""

from __future__ import annotations

import base64
import http.client
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest

from dashboard import auth
from tests.support.browser import running_dashboard

pytestmark = pytest.mark.slow

PASSWORD = "a long enough server password"
REBIND = "rebind.evil.example"


def _request(
    base_url: str, method: str, path: str, headers: dict[str, str], body: str | None = None
) -> http.client.HTTPResponse:
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    response.read() if response.status != 101 else None
    connection.close()
    return response


def _websocket_status(base_url: str, host: str) -> int:
    """The status of Streamlit's websocket handshake naming `host` (101: a session may start)."""
    headers = {
        "Host": host,
        "Origin": f"http://{host}",
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Protocol": "streamlit",
    }
    return _request(base_url, "GET", "/_stcore/stream", headers).status


def _environment(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TRAINDECK_")}
    env.update({key: value for key, value in os.environ.items() if key == "TRAINDECK_DATA"})
    env.pop("FORWARDED_ALLOW_IPS", None)
    return {**env, **extra}


@pytest.fixture
def open_dashboard(sqlite_engine, tmp_path: Path) -> Iterator[str]:
    with running_dashboard("127.0.0.1", _environment(), tmp_path / "streamlit.log") as url:
        yield url


def test_open_on_loopback_a_rebinding_host_gets_403_on_http_and_websocket(open_dashboard: str):
    port = urlsplit(open_dashboard).port
    for host in (f"{REBIND}:{port}", REBIND, f"192.0.2.1:{port}"):
        assert _request(open_dashboard, "GET", "/", {"Host": host}).status == 403
        assert _websocket_status(open_dashboard, host) == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
        assert _request(open_dashboard, "GET", "/", {"Host": host}).status == 200
        assert _websocket_status(open_dashboard, host) == 101


def _sign_in(base_url: str, password: str, **headers: str) -> http.client.HTTPResponse:
    form = urlencode({"password": password, "next": "/"})
    headers = {"Content-Type": "application/x-www-form-urlencoded", **headers}
    return _request(base_url, "POST", "/signin", headers, form)


def _forwarded(address: str, proto: str | None = None) -> dict[str, str]:
    headers = {"X-Forwarded-For": address}
    if proto:
        headers["X-Forwarded-Proto"] = proto
    return headers


def _password_dashboard(tmp_path: Path, **extra: str):
    env = _environment(**{auth.PASSWORD_HASH_ENV: auth.hash_password(PASSWORD)}, **extra)
    return running_dashboard("0.0.0.0", env, tmp_path / "streamlit.log")


def test_forwarded_headers_from_an_untrusted_local_client_are_not_believed(
    sqlite_engine, tmp_path: Path
):
    with _password_dashboard(tmp_path) as base_url:
        # HEAD /signin, however often, is no failed attempt.
        for _ in range(30):
            assert _request(base_url, "HEAD", "/signin", {}).status == 200
        signed_in = _sign_in(base_url, PASSWORD, **_forwarded("198.51.100.1", "https"))
        assert signed_in.status == 303
        # X-Forwarded-Proto from 127.0.0.1 is not believed: the cookies are not Secure.
        cookies = signed_in.headers.get_all("Set-Cookie")
        assert cookies and not any("Secure" in cookie for cookie in cookies)

        # Five failures, each claiming another address: all count against 127.0.0.1.
        for n in range(auth.PER_CLIENT.free):
            assert _sign_in(base_url, "guess", **_forwarded(f"198.51.100.{n + 10}")).status == 401
        refused = _sign_in(base_url, PASSWORD, **_forwarded("198.51.100.99"))
        assert refused.status == 429
        assert 1 <= int(refused.headers["Retry-After"]) <= auth.PER_CLIENT.first_wait_s


def test_behind_a_trusted_proxy_each_forwarded_client_counts_and_https_makes_cookies_secure(
    sqlite_engine, tmp_path: Path
):
    with _password_dashboard(tmp_path, TRAINDECK_TRUSTED_PROXIES="127.0.0.1, ::1") as base_url:
        signed_in = _sign_in(base_url, PASSWORD, **_forwarded("198.51.100.1", "https"))
        assert signed_in.status == 303
        cookies = signed_in.headers.get_all("Set-Cookie")
        assert cookies and all("Secure" in cookie for cookie in cookies)

        # Failures from many forwarded clients hold none of the others up ...
        for n in range(auth.PER_CLIENT.free + 2):
            assert _sign_in(base_url, "guess", **_forwarded(f"198.51.100.{n + 10}")).status == 401
        assert _sign_in(base_url, PASSWORD, **_forwarded("198.51.100.99")).status == 303
        # ... while one forwarded client's own failures do hold it.
        for _ in range(auth.PER_CLIENT.free):
            assert _sign_in(base_url, "guess", **_forwarded("203.0.113.7")).status == 401
        assert _sign_in(base_url, PASSWORD, **_forwarded("203.0.113.7")).status == 429

"""Who may use the dashboard: optional on a loopback address, required anywhere else.

The rule (`policy()`):
- The dashboard listens where Streamlit's `server.address` says (the Procfile passes
  `--server.address ${TRAINDECK_ADDRESS:-127.0.0.1}`). Unset, empty, `0.0.0.0`, `::`, another
  machine's address or a host name that resolves to one means other machines can connect:
  sign-in is required. Only an address that is loopback through and through (127.0.0.0/8,
  ::1, `localhost`) lets the dashboard run open.
- Configuring a way to sign in (or `TRAINDECK_AUTH=required`, for a reverse proxy on the same
  machine) turns sign-in on whatever the address.
- Two ways to sign in, either or both: a password whose scrypt hash is in
  `TRAINDECK_PASSWORD_HASH` (make it with `python -m dashboard.auth hash`), or Streamlit's OIDC
  login (`st.login`), configured in the `[auth]` section of `.streamlit/secrets.toml`.
- Sign-in required but no way configured (or a malformed one): nobody gets in, and every page
  says what to set.

`SignInGate` is an ASGI middleware in front of everything the `st.App` serves: without valid
credentials a browser gets the sign-in page, the app's websocket is refused (so no page script
runs) and downloads, uploads and media answer 401. `require_sign_in()` repeats the check inside
the page script. The password sign-in (`/signin`) sets a signed, HttpOnly cookie; attempts are
limited per client address and overall. Download links are bound to the sign-in that made them
(`session_identity`, `identity_from_cookies`).
"""

from __future__ import annotations

import argparse
import base64
import collections
import getpass
import hashlib
import hmac
import html
import importlib.util
import ipaddress
import json
import math
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs, quote

import streamlit as st
from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection, Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from streamlit import config, runtime
from streamlit.auth_util import (
    encode_provider_token,
    get_cookie_with_chunks,
    get_origin_from_redirect_uri,
    get_secrets_auth_section,
)
from streamlit.runtime import Runtime
from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx
from streamlit.web.server.server_util import get_cookie_secret
from streamlit.web.server.starlette.starlette_app_utils import decode_signed_value
from streamlit.web.server.starlette.starlette_server_config import USER_COOKIE_NAME

PASSWORD_HASH_ENV = "TRAINDECK_PASSWORD_HASH"
AUTH_MODE_ENV = "TRAINDECK_AUTH"
SESSION_HOURS_ENV = "TRAINDECK_SESSION_HOURS"
ALLOWED_USERS_ENV = "TRAINDECK_ALLOWED_USERS"
SESSION_COOKIE = "traindeck_session"
SIGNIN_PATH = "/signin"
SIGNOUT_PATH = "/signout"
DEFAULT_SESSION_HOURS = 12.0
MIN_PASSWORD_LENGTH = 8
# Longer form bodies are refused before anything is hashed.
MAX_FORM_BYTES = 4096
MAX_PASSWORD_LENGTH = 1024

# Failed sign-ins allowed per window, from one client address and from all of them together.
ATTEMPTS_PER_CLIENT = 5
ATTEMPTS_OVERALL = 30
ATTEMPT_WINDOW_S = 60.0

# Reachable without signing in: the sign-in pages, Streamlit's OIDC routes, the health check.
PUBLIC_PATHS = frozenset(
    {SIGNIN_PATH, SIGNOUT_PATH, "/auth/login", "/auth/logout", "/oauth2callback", "/_stcore/health"}
)

_SCRYPT_N, _SCRYPT_R, _SCRYPT_P, _SCRYPT_LENGTH = 2**14, 8, 1, 32
_SESSION_SALT = "traindeck-session"


# --- the password hash ------------------------------------------------------------------------


class PasswordHashError(ValueError):
    """TRAINDECK_PASSWORD_HASH is not a hash this module made."""


@dataclass(frozen=True)
class PasswordHash:
    """An scrypt hash: `scrypt:N:r:p:salt:digest`, salt and digest in URL-safe base64."""

    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    def encode(self) -> str:
        salt = base64.urlsafe_b64encode(self.salt).decode("ascii")
        digest = base64.urlsafe_b64encode(self.digest).decode("ascii")
        return f"scrypt:{self.n}:{self.r}:{self.p}:{salt}:{digest}"

    def matches(self, password: str) -> bool:
        """Whether `password` hashes to this digest (compared in constant time)."""
        candidate = _scrypt(password, self.salt, self.n, self.r, self.p, len(self.digest))
        return hmac.compare_digest(candidate, self.digest)

    @property
    def fingerprint(self) -> str:
        """Short and one-way: a session cookie made under another password is not valid."""
        return hashlib.sha256(self.encode().encode("ascii")).hexdigest()[:16]


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=length, maxmem=256 * 2**20
    )


def hash_password(password: str) -> str:
    """The value for TRAINDECK_PASSWORD_HASH."""
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, _SCRYPT_N, _SCRYPT_R, _SCRYPT_P, _SCRYPT_LENGTH)
    return PasswordHash(_SCRYPT_N, _SCRYPT_R, _SCRYPT_P, salt, digest).encode()


def parse_password_hash(text: str) -> PasswordHash:
    parts = text.strip().split(":")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise PasswordHashError("expected scrypt:N:r:p:salt:digest")
    try:
        n, r, p = (int(part) for part in parts[1:4])
        salt = base64.urlsafe_b64decode(parts[4].encode("ascii"))
        digest = base64.urlsafe_b64decode(parts[5].encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raise PasswordHashError("N, r and p must be numbers; salt and digest base64") from None
    if not (2 <= n <= 2**20 and n & (n - 1) == 0):
        raise PasswordHashError("N must be a power of two up to 2^20")
    if not (1 <= r <= 32 and 1 <= p <= 16):
        raise PasswordHashError("r must be 1-32 and p 1-16")
    if len(salt) < 8 or len(digest) < 16:
        raise PasswordHashError("the salt or the digest is too short")
    return PasswordHash(n, r, p, salt, digest)


# --- the policy -------------------------------------------------------------------------------


def listens_on_loopback(address: str | None) -> bool:
    """Whether a server bound to `address` can be reached from this machine only.

    Unset or empty binds every interface. A host name counts only when every address it
    resolves to is loopback; one that does not resolve counts as reachable.
    """
    if address is None or not address.strip():
        return False
    host = address.strip().strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    return bool(resolved) and all(
        ipaddress.ip_address(item.split("%", 1)[0]).is_loopback for item in resolved
    )


@dataclass(frozen=True)
class Policy:
    """Whether sign-in is required, and how a person signs in."""

    address: str | None
    required: bool
    password: PasswordHash | None
    oidc_providers: tuple[str, ...]
    # Required for no reason but the address (nothing configured, nothing forced).
    by_address_only: bool = False
    # Why nobody can sign in, when sign-in is required but cannot work.
    problem: str | None = None

    @property
    def configured(self) -> bool:
        return self.password is not None or bool(self.oidc_providers)

    def describe(self) -> str:
        where = f"listens on {self.address}" if self.address else "listens on every interface"
        if self.problem:
            return f"the dashboard {where}; nobody can sign in: {self.problem}"
        if not self.required:
            return f"the dashboard {where} (loopback only); no sign-in"
        ways = (["password"] if self.password else []) + [
            f"OIDC ({name})" for name in self.oidc_providers
        ]
        return f"the dashboard {where}; sign-in required: {', '.join(ways)}"


def _configured_address() -> str | None:

    value = config.get_option("server.address")
    return str(value) if value else None


def _oidc_providers() -> tuple[tuple[str, ...], str | None]:
    """The providers in secrets.toml's [auth] section, and a problem that stops them working."""

    try:
        section = get_secrets_auth_section()
    except Exception as exc:  # a malformed secrets.toml
        return (), f".streamlit/secrets.toml cannot be read ({exc})"
    if not section:
        return (), None
    providers = ["default"] if section.get("client_id") else []
    providers += [
        name
        for name, value in section.items()
        if isinstance(value, Mapping) and "client_id" in value
    ]
    if not providers:
        return (), "the [auth] section of .streamlit/secrets.toml names no provider (client_id)"
    for key in ("redirect_uri", "cookie_secret"):
        if not section.get(key):
            return (), f"the [auth] section of .streamlit/secrets.toml has no {key}"
    if importlib.util.find_spec("authlib") is None:
        return (), "OIDC sign-in needs Authlib: pip install -r requirements.txt"
    return tuple(providers), None


def policy(address: str | None = None, *, use_config: bool = True) -> Policy:
    """The policy for a server bound to `address` (by default Streamlit's server.address)."""
    if address is None and use_config:
        address = _configured_address()
    problems: list[str] = []

    mode = os.environ.get(AUTH_MODE_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "required"):
        problems.append(f"{AUTH_MODE_ENV} must be 'auto' or 'required', not {mode!r}")
    forced = mode != "auto"

    password = None
    hash_text = os.environ.get(PASSWORD_HASH_ENV, "").strip()
    if hash_text:
        try:
            password = parse_password_hash(hash_text)
        except PasswordHashError as exc:
            problems.append(
                f"{PASSWORD_HASH_ENV} is not a hash made by `python -m dashboard.auth hash` ({exc})"
            )
            forced = True

    providers, oidc_problem = _oidc_providers()
    if oidc_problem:
        problems.append(oidc_problem)
        forced = True

    asked_for = forced or password is not None or bool(providers)
    required = asked_for or not listens_on_loopback(address)
    if required and not problems and password is None and not providers:
        problems.append(
            "sign-in is required here but none is configured. Set "
            f"{PASSWORD_HASH_ENV} (make one with `python -m dashboard.auth hash`) or an "
            "[auth] section in .streamlit/secrets.toml, then restart the dashboard; or serve "
            "it on 127.0.0.1 only"
        )
    return Policy(
        address=address,
        required=required,
        password=password,
        oidc_providers=providers,
        by_address_only=required and not asked_for,
        problem="; ".join(problems) or None,
    )


# --- sessions ---------------------------------------------------------------------------------


def _session_lifetime_s() -> float:
    try:
        hours = float(os.environ.get(SESSION_HOURS_ENV, DEFAULT_SESSION_HOURS))
    except ValueError:
        hours = DEFAULT_SESSION_HOURS
    return max(60.0, hours * 3600.0) if math.isfinite(hours) else DEFAULT_SESSION_HOURS * 3600


def _cookie_secret() -> str:

    return get_cookie_secret()


def _serializer() -> URLSafeTimedSerializer:

    return URLSafeTimedSerializer(_cookie_secret(), salt=_SESSION_SALT)


class _SignedOut:
    """Session ids signed out before their cookie expired, until it would have."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, sid: str) -> None:
        now = time.time()
        with self._lock:
            for key, until in list(self._until.items()):
                if until <= now:
                    del self._until[key]
            self._until[sid] = now + _session_lifetime_s()

    def __contains__(self, sid: str) -> bool:
        with self._lock:
            return sid in self._until


_signed_out = _SignedOut()

# The Streamlit sessions (browser tabs) each password sign-in has open, closed at sign-out.
_sessions_of: dict[str, set[str]] = collections.defaultdict(set)
_sessions_lock = threading.Lock()


def _remember_session(identity: str) -> None:
    context = get_script_run_ctx()
    if context is not None and identity.startswith("password:"):
        with _sessions_lock:
            _sessions_of[identity].add(context.session_id)


def _close_sessions(identity: str) -> None:
    """End the open tabs of a sign-in: their live parts stop refreshing at once."""
    with _sessions_lock:
        session_ids = _sessions_of.pop(identity, set())
    if session_ids and _served_over_http():
        for session_id in session_ids:
            Runtime.instance().close_session(session_id)


def new_session_cookie(password: PasswordHash) -> str:
    """The value of the session cookie for one password sign-in."""
    return _serializer().dumps({"sid": secrets.token_urlsafe(16), "key": password.fingerprint})


def _password_session(value: str | None, password: PasswordHash | None) -> str | None:
    """The session id in a valid session cookie, else None."""
    if not value or password is None:
        return None

    try:
        payload = _serializer().loads(value, max_age=_session_lifetime_s())
    except (BadSignature, ValueError, TypeError):
        return None
    if not isinstance(payload, dict) or payload.get("key") != password.fingerprint:
        return None
    sid = payload.get("sid")
    if not isinstance(sid, str) or sid in _signed_out:
        return None
    return sid


def _oidc_user(cookies: Mapping[str, str]) -> dict | None:
    """The user in Streamlit's signed identity cookie (set by its OIDC callback), else None."""
    secret = _cookie_secret()

    def single(name: str) -> bytes | None:
        raw = cookies.get(name)
        if raw is None:
            return None
        return decode_signed_value(secret, name, raw.encode("latin-1", errors="replace"))

    try:
        decoded = get_cookie_with_chunks(single, USER_COOKIE_NAME)
        payload = json.loads(decoded) if decoded else None
    except (ValueError, TypeError):
        return None
    if not isinstance(payload, dict) or payload.get("is_logged_in") is not True:
        return None
    if payload.get("origin") != get_origin_from_redirect_uri():
        return None
    if not (payload.get("sub") or payload.get("email")):
        return None
    return payload


def allowed_users() -> set[str]:
    """TRAINDECK_ALLOWED_USERS: e-mail addresses and `@domain`s; empty lets anyone in."""
    text = os.environ.get(ALLOWED_USERS_ENV, "")
    return {entry.strip().lower() for entry in text.replace(",", " ").split() if entry.strip()}


def user_allowed(user: Mapping[str, object]) -> bool:
    """Whether an OIDC user is on TRAINDECK_ALLOWED_USERS (by a verified e-mail address)."""
    allowed = allowed_users()
    if not allowed:
        return True
    email = str(user.get("email") or "").strip().lower()
    if not email or user.get("email_verified") is False or "@" not in email:
        return False
    return email in allowed or "@" + email.rsplit("@", 1)[1] in allowed


def _oidc_identity(cookies: Mapping[str, str]) -> str | None:
    """`oidc:<provider>:<subject>` for an allowed user signed in through OIDC, else None."""
    user = _oidc_user(cookies)
    if user is None or not user_allowed(user):
        return None
    return f"oidc:{user.get('provider', 'default')}:{user.get('sub') or user.get('email')}"


def identity_from_cookies(cookies: Mapping[str, str], current: Policy) -> str | None:
    """Who these cookies sign in (`password:<session>` or `oidc:<provider>:<subject>`)."""
    if current.problem:
        return None
    sid = _password_session(cookies.get(SESSION_COOKIE), current.password)
    if sid is not None:
        return f"password:{sid}"
    if current.oidc_providers:
        return _oidc_identity(cookies)
    return None


def session_identity() -> str | None:
    """The signed-in identity of the page script's browser session; None when open or outside."""

    if get_script_run_ctx() is None:
        return None
    current = policy()
    if not current.required:
        return None
    try:
        cookies = dict(st.context.cookies)
    except Exception:  # no browser connection (AppTest)
        return None
    return identity_from_cookies(cookies, current)


# --- rate limit -------------------------------------------------------------------------------


class AttemptLimiter:
    """Failed sign-ins per client address and overall, in a sliding window."""

    MAX_CLIENTS = 10_000

    def __init__(
        self,
        per_client: int = ATTEMPTS_PER_CLIENT,
        overall: int = ATTEMPTS_OVERALL,
        window_s: float = ATTEMPT_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.per_client = per_client
        self.overall = overall
        self.window_s = window_s
        self.clock = clock
        self._by_client: collections.OrderedDict[str, collections.deque[float]] = (
            collections.OrderedDict()
        )
        self._all: collections.deque[float] = collections.deque()
        self._lock = threading.Lock()

    def _prune(self, times: collections.deque[float], now: float) -> None:
        while times and times[0] <= now - self.window_s:
            times.popleft()

    def wait_s(self, client: str) -> tuple[float, str]:
        """(seconds until `client` may try again, whose limit it is: 'client' or 'overall')."""
        now = self.clock()
        with self._lock:
            self._prune(self._all, now)
            if len(self._all) >= self.overall:
                return self._all[0] + self.window_s - now, "overall"
            times = self._by_client.get(client)
            if times is not None:
                self._prune(times, now)
                if len(times) >= self.per_client:
                    return times[0] + self.window_s - now, "client"
        return 0.0, ""

    def failed(self, client: str) -> None:
        now = self.clock()
        with self._lock:
            self._all.append(now)
            times = self._by_client.setdefault(client, collections.deque())
            times.append(now)
            self._by_client.move_to_end(client)
            while len(self._by_client) > self.MAX_CLIENTS:
                self._by_client.popitem(last=False)

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._by_client.pop(client, None)


limiter = AttemptLimiter()


def too_many_attempts_message(wait_s: float, whose: str) -> str:
    seconds = max(1, math.ceil(wait_s))
    if whose == "overall":
        return (
            "Too many failed sign-ins on this dashboard in the last minute. "
            f"Sign-in is paused for everyone; try again in {seconds} s."
        )
    return f"Too many failed sign-ins from your address. Try again in {seconds} s."


# --- the HTTP side: sign-in page, sign-out, and the gate in front of everything ----------------


def _safe_next(target: str | None) -> str:
    """A path on this server to return to after signing in; never another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    if any(ord(char) < 32 for char in target):
        return "/"
    return target


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in · traindeck</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font-family: system-ui, sans-serif; background: #f6f7f9; margin: 0; }}
main {{ max-width: 22rem; margin: 12vh auto; background: #fff; padding: 2rem;
        border-radius: 8px; box-shadow: 0 1px 4px rgba(0,0,0,.12); }}
h1 {{ font-size: 1.4rem; margin-top: 0; }}
label, input, button, a.button {{ display: block; width: 100%; box-sizing: border-box; }}
input {{ padding: .5rem; margin: .3rem 0 1rem; font-size: 1rem; }}
button, a.button {{ padding: .6rem; font-size: 1rem; background: #ff4b4b; color: #fff;
        border: 0; border-radius: 4px; text-align: center; text-decoration: none;
        margin-bottom: .6rem; cursor: pointer; }}
p.alert {{ color: #a61b1b; background: #fdecec; padding: .6rem; border-radius: 4px; }}
</style></head>
<body><main>
<h1>traindeck</h1>
{body}
</main></body></html>
"""


def _page(body: str) -> str:
    return _PAGE.format(body=body)


def signin_page(current: Policy, next_path: str, message: str | None = None) -> str:
    parts: list[str] = []
    if message:
        parts.append(f'<p class="alert" role="alert">{html.escape(message)}</p>')
    if current.problem:
        parts.append(
            '<p class="alert" role="alert">This dashboard cannot be used yet: '
            f"{html.escape(current.problem)}.</p>"
        )
        return _page("".join(parts))
    if current.password is not None:
        parts.append(
            f'<form method="post" action="{SIGNIN_PATH}">'
            '<label for="password">Password</label>'
            '<input id="password" name="password" type="password" autocomplete="current-password"'
            f' required autofocus maxlength="{MAX_PASSWORD_LENGTH}">'
            f'<input type="hidden" name="next" value="{html.escape(next_path)}">'
            "<button type=submit>Sign in</button></form>"
        )
    if current.oidc_providers:
        if message and ALLOWED_USERS_ENV in message:
            parts.append(f'<p><a href="{SIGNOUT_PATH}">Sign out of that account</a></p>')
        for provider in current.oidc_providers:
            label = "Sign in" if provider == "default" else f"Sign in with {provider.title()}"
            href = "/auth/login?provider=" + quote(encode_provider_token(provider))
            parts.append(f'<a class="button" href="{html.escape(href)}">{html.escape(label)}</a>')
    return _page("".join(parts))


def _client_address(connection: HTTPConnection) -> str:
    return connection.client.host if connection.client else "unknown"


def _cookie_secure(request: Request) -> bool:
    return request.url.scheme == "https"


async def _read_form(request: Request) -> dict[str, str] | None:
    """The url-encoded form fields, or None for a body too large to be a sign-in."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    fields = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {key: values[0] for key, values in fields.items() if values}


class SignInRoutes:
    """`/signin` (the page, and the password form's POST) and `/signout`."""

    def __init__(
        self, limiter_: AttemptLimiter | None = None, policy_: Callable[[], Policy] = policy
    ):
        self.limiter = limiter_ or limiter
        self.policy = policy_

    async def signin(self, request: Request) -> Response:

        current = self.policy()
        next_path = _safe_next(request.query_params.get("next"))
        if not current.required:
            return RedirectResponse(next_path, status_code=303)
        if current.problem:
            return HTMLResponse(signin_page(current, next_path), status_code=503)
        if request.method == "GET":
            if identity_from_cookies(request.cookies, current):
                return RedirectResponse(next_path, status_code=303)
            refused = _oidc_user(request.cookies) if current.oidc_providers else None
            if refused is not None:
                who = refused.get("email") or refused.get("sub")
                message = (
                    f"{who} may not use this dashboard ({ALLOWED_USERS_ENV}). "
                    "Sign out of that account below, then sign in with another."
                )
                return HTMLResponse(signin_page(current, next_path, message), status_code=403)
            return HTMLResponse(signin_page(current, next_path))

        form = await _read_form(request)
        if form is None:
            return HTMLResponse(
                signin_page(current, "/", "That sign-in form was too large."), status_code=413
            )
        next_path = _safe_next(form.get("next"))
        if current.password is None:
            return HTMLResponse(
                signin_page(current, next_path, "This dashboard has no password sign-in."),
                status_code=400,
            )
        client = _client_address(request)
        wait_s, whose = self.limiter.wait_s(client)
        if wait_s > 0:
            return HTMLResponse(
                signin_page(current, next_path, too_many_attempts_message(wait_s, whose)),
                status_code=429,
                headers={"Retry-After": str(max(1, math.ceil(wait_s)))},
            )
        password = form.get("password", "")
        ok = 0 < len(password) <= MAX_PASSWORD_LENGTH and await run_in_threadpool(
            current.password.matches, password
        )
        if not ok:
            self.limiter.failed(client)
            return HTMLResponse(signin_page(current, next_path, "Wrong password."), status_code=401)
        self.limiter.succeeded(client)
        response = RedirectResponse(next_path, status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            new_session_cookie(current.password),
            max_age=int(_session_lifetime_s()),
            path="/",
            httponly=True,
            samesite="lax",
            secure=_cookie_secure(request),
        )
        return response

    async def signout(self, request: Request) -> Response:

        current = self.policy()
        sid = _password_session(request.cookies.get(SESSION_COOKIE), current.password)
        if sid is not None:
            _signed_out.add(sid)
            _close_sessions(f"password:{sid}")
        # Streamlit's own logout clears its identity cookie (and the provider's session).
        target = "/auth/logout" if USER_COOKIE_NAME in request.cookies else SIGNIN_PATH
        response = RedirectResponse(target, status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    def routes(self) -> list[Route]:

        return [
            Route(SIGNIN_PATH, self.signin, methods=["GET", "POST"]),
            Route(SIGNOUT_PATH, self.signout, methods=["GET", "POST"]),
        ]


def routes() -> list[Route]:
    return SignInRoutes().routes()


class SignInGate:
    """ASGI middleware: without a valid sign-in, nothing but the public paths answers."""

    def __init__(self, app: ASGIApp, policy_: Callable[[], Policy] = policy):
        self.app = app
        self._policy_source = policy_
        self._policy: Policy | None = None

    @property
    def policy(self) -> Policy:
        if self._policy is None:
            self._policy = self._policy_source()
            print(f"traindeck: {self._policy.describe()}", file=sys.stderr, flush=True)
        return self._policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        current = self.policy
        if not current.required or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return

        connection = HTTPConnection(scope)
        if identity_from_cookies(connection.cookies, current) is not None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            # Closing before the handshake is accepted answers it with 403: no session starts.
            await send({"type": "websocket.close", "code": 1008})
            return
        await self._refuse(connection, current)(scope, receive, send)

    @staticmethod
    def _refuse(connection: HTTPConnection, current: Policy) -> Response:

        if current.problem:
            return PlainTextResponse(
                f"This dashboard cannot be used yet: {current.problem}.", status_code=503
            )
        wants_page = connection.scope.get("method") == "GET" and "text/html" in (
            connection.headers.get("accept", "")
        )
        if wants_page:
            target = connection.url.path + (
                f"?{connection.url.query}" if connection.url.query else ""
            )
            return RedirectResponse(f"{SIGNIN_PATH}?next={quote(target)}", status_code=303)
        return PlainTextResponse(
            f"Sign in first: {SIGNIN_PATH}", status_code=401, headers={"Cache-Control": "no-store"}
        )


# --- inside the page script -------------------------------------------------------------------


def _served_over_http() -> bool:
    """Whether this script runs in a real Streamlit server (AppTest's stand-in serves nobody)."""

    return runtime.exists() and type(Runtime.instance()) is Runtime


def require_sign_in() -> None:
    """Stop the page unless the person may see it; when signed in, offer a way out."""

    current = policy()
    if not current.required:
        return
    if current.by_address_only and not _served_over_http():
        return
    if current.problem:
        st.error(f"This dashboard cannot be used yet: {current.problem}.")
        st.stop()
    identity = identity_from_cookies(dict(st.context.cookies), current)
    if identity is None:
        st.warning("Sign in to use this dashboard.")
        st.markdown(f'<a href="{SIGNIN_PATH}" target="_self">Sign in</a>', unsafe_allow_html=True)
        st.stop()
    _remember_session(identity)
    if identity.startswith("password:"):
        st.sidebar.caption("Signed in with the password")
    else:
        st.sidebar.caption(f"Signed in as {identity.split(':', 2)[2]}")
    st.sidebar.markdown(
        f'<a href="{SIGNOUT_PATH}" target="_self">Sign out</a>', unsafe_allow_html=True
    )


# --- python -m dashboard.auth -----------------------------------------------------------------


def _read_new_password() -> str:
    if sys.stdin.isatty():
        first = getpass.getpass("New dashboard password: ")
        if getpass.getpass("Repeat it: ") != first:
            raise SystemExit("error: the two passwords differ; nothing was made")
        return first
    return sys.stdin.readline().rstrip("\r\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dashboard.auth", description="The dashboard's sign-in."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "hash",
        help=f"read a password (prompt, or one line on stdin) and print {PASSWORD_HASH_ENV}",
    )
    check = commands.add_parser("check", help="say whether sign-in is required, and how")
    check.add_argument(
        "--address",
        default=os.environ.get("TRAINDECK_ADDRESS", "127.0.0.1"),
        help="the address the dashboard listens on (default $TRAINDECK_ADDRESS or 127.0.0.1)",
    )
    args = parser.parse_args(argv)
    if args.command == "hash":
        password = _read_new_password()
        if len(password) < MIN_PASSWORD_LENGTH:
            print(
                f"error: the password must have at least {MIN_PASSWORD_LENGTH} characters; "
                "nothing was made",
                file=sys.stderr,
            )
            return 2
        if len(password) > MAX_PASSWORD_LENGTH:
            print(f"error: at most {MAX_PASSWORD_LENGTH} characters", file=sys.stderr)
            return 2
        print(hash_password(password))
        return 0
    current = policy(args.address, use_config=False)
    print(current.describe())
    return 1 if current.problem else 0


if __name__ == "__main__":
    from db.entry import run_main

    run_main(main)

"""Who a request or a page script is signed in as.

A password sign-in is a signed session cookie (`new_session_cookie`); signing out records its
session id until the cookie would have expired and closes the Streamlit sessions (browser tabs)
it had open. An OIDC sign-in is Streamlit's own signed identity cookie, limited to the allowed
users. `identity_from_cookies` and `session_identity` name the sign-in.
"""

from __future__ import annotations

import collections
import json
import secrets
import threading
import time
from collections.abc import Mapping

import streamlit as st
from itsdangerous import BadSignature, URLSafeTimedSerializer
from streamlit import runtime
from streamlit.auth_util import get_cookie_with_chunks, get_origin_from_redirect_uri
from streamlit.runtime import Runtime
from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx
from streamlit.web.server.server_util import get_cookie_secret
from streamlit.web.server.starlette.starlette_app_utils import decode_signed_value
from streamlit.web.server.starlette.starlette_server_config import USER_COOKIE_NAME

from common.settings import Settings, settings
from dashboard.auth.access import Policy, policy, user_allowed
from dashboard.auth.passwords import PasswordHash

SESSION_HOURS_ENV = "TRAINDECK_SESSION_HOURS"
SESSION_COOKIE = "traindeck_session"
# A browser that has signed in with the password keeps this one (signed, a year) after it
# signs out: other people's failed guesses never slow its sign-in (`ratelimit`).
DEVICE_COOKIE = "traindeck_device"
DEVICE_COOKIE_S = 365 * 24 * 3600
_DEVICE_SALT = "traindeck-device"
DEFAULT_SESSION_HOURS: float = Settings.model_fields["session_hours"].default
_SESSION_SALT = "traindeck-session"


def _served_over_http() -> bool:
    """Whether this script runs in a real Streamlit server (AppTest's stand-in serves nobody)."""

    return runtime.exists() and type(Runtime.instance()) is Runtime


def _session_lifetime_s() -> float:
    """TRAINDECK_SESSION_HOURS in seconds, at least a minute (a bad value: SettingsError)."""
    return max(60.0, settings().session_hours * 3600.0)


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


def new_device_cookie(password: PasswordHash, device: str | None = None) -> tuple[str, str]:
    """(the device cookie's value, its device id) for a browser that just signed in: a new id,
    or the one it had."""
    device = device or secrets.token_urlsafe(16)
    serializer = URLSafeTimedSerializer(_cookie_secret(), salt=_DEVICE_SALT)
    return serializer.dumps({"device": device, "key": password.fingerprint}), device


def device_from_cookies(cookies: Mapping[str, str], password: PasswordHash | None) -> str | None:
    """The device id of a valid device cookie made under this password, else None."""
    value = cookies.get(DEVICE_COOKIE)
    if not value or password is None:
        return None
    serializer = URLSafeTimedSerializer(_cookie_secret(), salt=_DEVICE_SALT)
    try:
        payload = serializer.loads(value, max_age=DEVICE_COOKIE_S)
    except (BadSignature, ValueError, TypeError):
        return None
    if not isinstance(payload, dict) or payload.get("key") != password.fingerprint:
        return None
    device = payload.get("device")
    return device if isinstance(device, str) and device else None


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

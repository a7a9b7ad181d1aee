"""The HTTP side: the sign-in page, `/signin` and `/signout`, and the gate in front of everything.

`routes()` and `SignInGate` are what dashboard/app.py adds to the `st.App`.
"""

from __future__ import annotations

import html
import math
import sys
from collections.abc import Callable
from urllib.parse import parse_qs, quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection, Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from streamlit.auth_util import encode_provider_token
from streamlit.web.server.starlette.starlette_server_config import USER_COOKIE_NAME

from dashboard.auth.access import ALLOWED_USERS_ENV, Policy, policy
from dashboard.auth.clients import client_address, host_answered, over_https
from dashboard.auth.passwords import MAX_PASSWORD_LENGTH
from dashboard.auth.ratelimit import AttemptLimiter, limiter, too_many_attempts_message
from dashboard.auth.sessions import (
    DEVICE_COOKIE,
    DEVICE_COOKIE_S,
    SESSION_COOKIE,
    _close_sessions,
    _oidc_user,
    _password_session,
    _session_lifetime_s,
    _signed_out,
    device_from_cookies,
    identity_from_cookies,
    new_device_cookie,
    new_session_cookie,
)

SIGNIN_PATH = "/signin"
SIGNOUT_PATH = "/signout"
# Longer form bodies are refused before anything is hashed.
MAX_FORM_BYTES = 4096

# Reachable without signing in: the sign-in pages, Streamlit's OIDC routes, the health check.
PUBLIC_PATHS = frozenset(
    {SIGNIN_PATH, SIGNOUT_PATH, "/auth/login", "/auth/logout", "/oauth2callback", "/_stcore/health"}
)
# The HTTP API (`dashboard.api`) checks an API token on every request itself, in every mode,
# and never looks at cookies: the gate lets it through without a sign-in (a browser's cookies
# would give a cross-site page a way in). Open on loopback the Host check still applies.
TOKEN_PATH_PREFIX = "/api/"


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
        if request.method != "POST":  # GET, or HEAD (which Starlette answers for a GET route)
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
        password = form.get("password", "")
        if not password:  # no guess at all: nothing to check, nothing counted
            return HTMLResponse(
                signin_page(current, next_path, "Enter the password."), status_code=400
            )
        client = client_address(request, current.trusted_proxies)
        device = device_from_cookies(request.cookies, current.password)
        wait_s, whose = self.limiter.wait_s(client, device)
        if wait_s > 0:
            return HTMLResponse(
                signin_page(current, next_path, too_many_attempts_message(wait_s, whose)),
                status_code=429,
                headers={"Retry-After": str(max(1, math.ceil(wait_s)))},
            )
        ok = len(password) <= MAX_PASSWORD_LENGTH and await run_in_threadpool(
            current.password.matches, password
        )
        if not ok:
            self.limiter.failed(client, device)
            return HTMLResponse(signin_page(current, next_path, "Wrong password."), status_code=401)
        self.limiter.succeeded(client, [device])
        secure = over_https(request, current.trusted_proxies, current.public_https)
        response = RedirectResponse(next_path, status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            new_session_cookie(current.password),
            max_age=int(_session_lifetime_s()),
            path="/",
            httponly=True,
            samesite="lax",
            secure=secure,
        )
        device_cookie, _ = new_device_cookie(current.password, device)
        response.set_cookie(
            DEVICE_COOKIE,
            device_cookie,
            max_age=DEVICE_COOKIE_S,
            path=SIGNIN_PATH,
            httponly=True,
            samesite="strict",
            secure=secure,
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
        if not current.required:
            # Open to anyone who can reach it: that must be this machine, by a loopback name.
            connection = HTTPConnection(scope)
            if not host_answered(
                connection.headers.get("host"), current.address, current.public_host
            ):
                await self._refuse_host(connection, scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        if scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"].startswith(TOKEN_PATH_PREFIX):
            if current.problem:  # nobody gets in until the setting is fixed; in the API's JSON
                problem = f"this dashboard cannot be used yet: {current.problem}"
                await JSONResponse({"error": problem}, status_code=503)(scope, receive, send)
            else:
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
    async def _refuse_host(
        connection: HTTPConnection, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """403 for a Host the open mode does not answer (a DNS-rebinding page's own name)."""
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        response = PlainTextResponse(
            "This dashboard runs without a sign-in and answers only at localhost: open it at "
            "http://localhost:PORT (or set TRAINDECK_PUBLIC_URL to the address you use).",
            status_code=403,
            headers={"Cache-Control": "no-store"},
        )
        await response(scope, receive, send)

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

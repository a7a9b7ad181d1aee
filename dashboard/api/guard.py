"""Who may use the HTTP API: a valid API token (`db.tokens`) in `Authorization: Bearer …`.

Every endpoint but the OpenAPI document is wrapped in `token_required`, in every mode: open on
loopback as much as signed in (the sign-in gate lets /api/ through to this check, and never
cookies: a page on another site cannot make a browser send an Authorization header, so it
cannot use the API through a visitor's browser). A missing, unknown, revoked or expired token
gets 401. Wrong tokens are throttled per client address as wrong passwords are
(`dashboard.auth.ratelimit`): five are free, then each doubles the wait (429); the right token
clears the address. Nothing pauses the API for everyone.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dashboard import auth
from dashboard.auth.ratelimit import PER_CLIENT, AttemptLimiter, Backoff
from db.engine import DatabaseError, Engine, database_problem, get_engine
from db.queue import JobNotFound, JobStateError
from db.spec import SpecError
from db.sweeps import SweepNotFound
from db.tokens import check_token

Endpoint = Callable[[Request, Engine], Awaitable[Response]]
# Per client address only: `AttemptLimiter` also counts an account key, which never waits here.
NEVER = Backoff(free=sys.maxsize, first_wait_s=0.0, max_wait_s=0.0)
limiter = AttemptLimiter(per_client=PER_CLIENT, per_account=NEVER)
NO_STORE = {"Cache-Control": "no-store"}
MAX_ID = 2**63 - 1  # the largest integer SQLite and Postgres (bigint) hold


def problem(message: str, status: int, fields: dict[str, str] | None = None, **headers: str):
    """An error as JSON: `error` is the one line the CLI prints (after `error: `), `fields`
    names each wrong input with its message."""
    body: dict[str, Any] = {"error": message}
    if fields:
        body["fields"] = fields
    return JSONResponse(body, status_code=status, headers={**NO_STORE, **headers})


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


REFUSED = {
    "unknown": "the API token is wrong",
    "revoked": "the API token was revoked",
    "expired": "the API token has expired",
}


async def _refusal(request: Request, engine: Engine) -> Response | None:
    client = auth.client_address(request, auth.policy().trusted_proxies)
    wait_s, _ = limiter.wait_s(client)
    if wait_s > 0:
        seconds = max(1, math.ceil(wait_s))
        return problem(
            f"too many wrong API tokens from your address; try again in {seconds} s",
            429,
            **{"Retry-After": str(seconds)},
        )
    token = _bearer(request)
    if token is None:
        return problem(
            "this API needs a token: send `Authorization: Bearer TOKEN` (make one on the "
            "dashboard's Settings page)",
            401,
            **{"WWW-Authenticate": "Bearer"},
        )
    holder, why = await run_in_threadpool(check_token, engine, token)
    if holder is None:
        limiter.failed(client)
        return problem(REFUSED[why], 401, **{"WWW-Authenticate": 'Bearer error="invalid_token"'})
    limiter.succeeded(client)
    return None


def token_required(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint behind the token check, with the database's engine. The mistakes the CLI
    reports in one line are answered with that line: a refused spec or input 400 (naming the
    fields), an unknown job or sweep 404, a change the job's state forbids 409, a database
    that cannot be used 503."""

    async def guarded(request: Request) -> Response:
        try:
            engine = get_engine()
            refused = await _refusal(request, engine)
            if refused:
                return refused
            job_id = request.path_params.get("job_id")
            if job_id is not None and job_id > MAX_ID:  # no database can hold that id
                raise JobNotFound(job_id)
            sweep_id = request.path_params.get("sweep_id")
            if sweep_id is not None and sweep_id > MAX_ID:
                raise SweepNotFound(sweep_id)
            return await endpoint(request, engine)
        except SpecError as exc:
            return problem(str(exc), 400, exc.problems)
        except (JobNotFound, SweepNotFound) as exc:
            return problem(str(exc), 404)
        except JobStateError as exc:
            return problem(str(exc), 409)
        except DatabaseError as exc:
            return problem(database_problem(exc), 503)

    guarded.__name__ = endpoint.__name__
    guarded.__doc__ = endpoint.__doc__
    return guarded

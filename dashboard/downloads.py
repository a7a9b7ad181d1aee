"""Artifact downloads streamed from the store by an HTTP route beside the Streamlit app.

`st.download_button` keeps the whole file in the server's memory; an exported model can be
hundreds of megabytes. Instead the job page asks `link_for` for a link: an unguessable token
that names one recorded file for a limited time. The route (`routes()`, served by the `st.App`
in `dashboard/app.py`) streams that object from the store (`common.store`: a bucket or a local
folder) in chunks of a megabyte, with its SHA-256 in a `Repr-Digest` header.
A link may instead name a file made when it is fetched (`link_for_made`: the job's TensorBoard
runs as a zip): it is written to a temporary file off the event loop, streamed, and deleted.
Where sign-in is required, the sign-in gate (`dashboard.auth.server.SignInGate`) stands in front
of this route too, and each link is bound to the sign-in that got it: another browser, or the
same one after signing out, is refused even with the token.
"""

from __future__ import annotations

import base64
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from common import store
from common.errors import first_line
from dashboard import auth

ROUTE_PREFIX = "/downloads/"
LINK_LIFETIME_S = 3600.0
# A page keeps showing a link while it is valid for at least this long, else it issues anew.
MIN_REMAINING_S = 600.0


@dataclass(frozen=True)
class _Link:
    url: str  # a store URL, or a local path in rows from before the store
    file_name: str
    sha256: str
    expires_at: float
    # The sign-in that may use the link (a `dashboard.auth.sessions` identity); None where none
    # is needed.
    owner: str | None
    # Writes the file's bytes when the link is fetched; None for a stored object at `url`.
    make: Callable[[BinaryIO], None] | None = None


_links: dict[str, _Link] = {}
_token_by_file: dict[tuple[str, str, str | None], str] = {}
_lock = threading.Lock()


def link_for(url: str | os.PathLike, file_name: str, sha256: str) -> str:
    """The URL path that downloads the object at `url` as `file_name`, valid for about an hour.

    Called from a page script: the link works only for the browser signed in as this session.
    """
    url = str(url)  # a local path, in rows from before the store
    owner = auth.session_identity()
    now = time.monotonic()
    key = (url, sha256, owner)
    with _lock:
        _forget_expired(now)
        token = _token_by_file.get(key)
        if token is None or _links[token].expires_at - now < MIN_REMAINING_S:
            token = secrets.token_urlsafe(24)
            _links[token] = _Link(url, file_name, sha256, now + LINK_LIFETIME_S, owner)
            _token_by_file[key] = token
    return ROUTE_PREFIX + token


def link_for_made(key: str, file_name: str, make: Callable[[BinaryIO], None]) -> str:
    """The URL path that downloads, as `file_name`, what `make(file)` writes when the link is
    fetched; `key` names what it makes (the same key, the same link while it is valid)."""
    owner = auth.session_identity()
    now = time.monotonic()
    made_key = ("made:" + key, "", owner)
    with _lock:
        _forget_expired(now)
        token = _token_by_file.get(made_key)
        if token is None or _links[token].expires_at - now < MIN_REMAINING_S:
            token = secrets.token_urlsafe(24)
            _links[token] = _Link(made_key[0], file_name, "", now + LINK_LIFETIME_S, owner, make)
            _token_by_file[made_key] = token
    return ROUTE_PREFIX + token


def _forget_expired(now: float) -> None:
    for token, link in list(_links.items()):
        if link.expires_at <= now:
            del _links[token]
            _token_by_file.pop((link.url, link.sha256, link.owner), None)


def _lookup(token: str) -> _Link | None:
    with _lock:
        link = _links.get(token)
    if link is None or link.expires_at <= time.monotonic():
        return None
    return link


async def serve_download(request: Request) -> Response:
    link = _lookup(request.path_params["token"])
    if link is None:
        return PlainTextResponse(
            "This download link has expired or is unknown; reload the job page for a new one.",
            status_code=404,
        )
    if link.owner is not None:
        current = auth.policy()
        if auth.identity_from_cookies(request.cookies, current) != link.owner:
            return PlainTextResponse(
                "This download link belongs to another sign-in. Sign in and open the job page "
                "for a link of your own.",
                status_code=403,
                headers={"Cache-Control": "no-store"},
            )
    if link.make is not None:
        return await _serve_made(link.make, link.file_name)
    return await stream_file(request, link.url, link.file_name, link.sha256)


def _make_file(make: Callable[[BinaryIO], None]) -> str:
    handle, path = tempfile.mkstemp(prefix="traindeck-download-")
    try:
        with os.fdopen(handle, "wb") as out:
            make(out)
    except BaseException:
        os.unlink(path)
        raise
    return path


async def _serve_made(make: Callable[[BinaryIO], None], file_name: str) -> Response:
    try:
        path = await run_in_threadpool(_make_file, make)
    except Exception as exc:  # the database went away, the disk is full, ...
        return PlainTextResponse(f"Cannot make {file_name}: {first_line(exc)}", status_code=503)
    return FileResponse(
        path,
        filename=file_name,
        media_type="application/octet-stream",
        headers={"Cache-Control": "no-store"},
        background=BackgroundTask(os.unlink, path),
    )


def _text_problem(message: str, status: int) -> Response:
    return PlainTextResponse(message, status_code=status)


async def stream_file(
    request: Request,
    url: str,
    file_name: str,
    sha256: str,
    problem: Callable[[str, int], Response] = _text_problem,
) -> Response:
    """The object at `url` (a store URL, or a local path in rows from before the store),
    streamed in chunks as `file_name` with its SHA-256; the API's downloads use it too, with
    their own `problem(message, status)` answer for a file that cannot be read."""
    try:
        size = await run_in_threadpool(store.size, url)
    except FileNotFoundError:
        return problem(_gone(url, file_name), 410)
    except store.StoreError as exc:
        if not await run_in_threadpool(store.exists, url):
            return problem(_gone(url, file_name), 410)
        return problem(f"Cannot read {file_name}: {exc}", 502)
    digest = base64.b64encode(bytes.fromhex(sha256)).decode("ascii")
    headers = {
        "Repr-Digest": f"sha-256=:{digest}:",
        "Cache-Control": "no-store",
        "Content-Length": str(size),
        "Content-Disposition": f'attachment; filename="{file_name}"',
    }
    if request.method == "HEAD":
        return Response(media_type="application/octet-stream", headers=headers)
    return StreamingResponse(
        store.aiter_chunks(url), media_type="application/octet-stream", headers=headers
    )


def _gone(url: str, file_name: str) -> str:
    where = "in the store" if store.is_store_url(url) else "on this machine"
    return f"The file {file_name} is no longer {where}."


def routes() -> list[Route]:
    return [Route(ROUTE_PREFIX + "{token}", serve_download, methods=["GET", "HEAD"])]

"""A proxy on loopback in front of the Cloud Storage emulator that a test turns into a broken
bucket: it forwards every request (PASS), or answers each one as Cloud Storage does when the
service account lacks the permission (FORBIDDEN, 403) or when the bucket is gone (NO_BUCKET,
404). Clients reach it through `STORAGE_EMULATOR_HOST=proxy.url`.

A `ThreadingHTTPServer` that forwards with `http.client`: one connection to the emulator per
request, the whole body read and sent with its length, and a `Location` header that names the
emulator (a resumable upload's session) rewritten to the proxy, so that every later request of
the upload comes through here too.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import urlsplit

PASS = "pass"
FORBIDDEN = "forbidden"
NO_BUCKET = "no-bucket"
# The error bodies Cloud Storage's JSON API answers with.
ACCOUNT = "worker@traindeck-test.iam.gserviceaccount.com"
PERMISSIONS = {"GET": "get", "HEAD": "get", "DELETE": "delete"}  # others create
ERRORS = {
    FORBIDDEN: (
        403,
        "{account} does not have storage.objects.{permission} access to the Google Cloud "
        "Storage object. Permission 'storage.objects.{permission}' denied on resource (or it "
        "may not exist).",
        "forbidden",
    ),
    NO_BUCKET: (404, "The specified bucket does not exist.", "notFound"),
}
# Hop-by-hop headers, and those the proxy sets itself.
_NOT_FORWARDED = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class StoreProxy:
    """`with StoreProxy(emulator_url) as proxy:` … `proxy.mode = FORBIDDEN` …"""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.mode = PASS
        self.answered: dict[str, int] = {PASS: 0, FORBIDDEN: 0, NO_BUCKET: 0}
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"proxy": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def refused(self, mode: str) -> int:
        """How many requests were answered as `mode` (FORBIDDEN or NO_BUCKET) so far."""
        with self._lock:
            return self.answered[mode]

    def _count(self, mode: str) -> None:
        with self._lock:
            self.answered[mode] += 1

    def __enter__(self) -> StoreProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that gives up on a request (gcsfs aborting a retried call) closes its end.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    proxy: ClassVar[StoreProxy]
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _handle(self) -> None:
        body = self._body()
        mode = self.proxy.mode
        self.proxy._count(mode)
        if mode != PASS:
            status, message, reason = ERRORS[mode]
            permission = PERMISSIONS.get(self.command, "create")
            message = message.format(account=ACCOUNT, permission=permission)
            error = {"code": status, "message": message, "errors": [{"reason": reason}]}
            payload = json.dumps({"error": error}).encode()
            self._answer(status, [("Content-Type", "application/json")], payload)
            return
        upstream = urlsplit(self.proxy.upstream)
        connection = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=120)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _NOT_FORWARDED}
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            content = response.read()
            forwarded = [
                (name, value.replace(self.proxy.upstream, self.proxy.url))
                for name, value in response.getheaders()
                if name.lower() not in _NOT_FORWARDED
            ]
            self._answer(response.status, forwarded, content)
        finally:
            connection.close()

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

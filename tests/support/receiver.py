"""A JSON webhook receiver on loopback, standing in for Slack, ntfy or any web hook: it
records every POST's JSON body, and can go down and come back on the same port."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support.browser import free_port


class Receiver:
    def __init__(self) -> None:
        self.port = free_port()
        self.received: list[dict] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """Apprise's URL for a JSON POST here."""
        return f"json://127.0.0.1:{self.port}/hook"

    def up(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                with receiver._lock:
                    receiver.received.append(body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def titles(self) -> list[str]:
        with self._lock:
            return [body["title"] for body in self.received]

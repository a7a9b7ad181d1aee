"""A tiny HTTP server on 127.0.0.1 that serves dataset archives to the worker in tests."""

from __future__ import annotations

import http.server
import socket
import tarfile
import threading
from pathlib import Path


class ArchiveServer:
    """Serves the files of one folder over HTTP on 127.0.0.1 and counts the requests."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.requests: list[str] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs) -> None:
                super().__init__(*args, directory=str(folder), **kwargs)

            def do_GET(self) -> None:
                server.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def make_tgz(source: Path, archive: Path, top: str) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname=top)
    return archive


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

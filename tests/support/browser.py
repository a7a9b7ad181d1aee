"""Starting the dashboard with `python -m dashboard` and driving Debian's Chromium, shared by the
browser tests and bench/load.py."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

# The repository: `python -m dashboard` runs from it, so that it serves this tree's code (from
# tests/ the editable install's tree would answer `dashboard.__main__` instead).
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
# Root on this machine needs no sandbox; no GPU; no calls home while a test runs.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
STARTUP_TIMEOUT_S = 90


class DashboardDidNotStart(RuntimeError):
    """`streamlit run` exited or did not answer its health check in time."""


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


def start_dashboard(address: str, env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    """Start the dashboard as the Procfile does and wait until it answers; return the server
    and the URL to reach it through loopback."""
    port = free_port(address)
    # As the Procfile runs it, with the dashboard's own settings (dashboard/streamlit.toml).
    command = [sys.executable, "-m", "dashboard", f"--port={port}", f"--address={address}"]
    # Set by hand, so Streamlit does not look up this machine's external IP on the internet.
    env = {**env, "STREAMLIT_BROWSER_SERVER_ADDRESS": "localhost"}
    with open(log, "w") as output:
        server = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT
        )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise DashboardDidNotStart(
                f"streamlit exited with {server.returncode}:\n{log.read_text()}"
            )
        try:
            with urllib.request.urlopen(f"{base_url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return server, base_url
        except OSError:
            time.sleep(0.5)
    stop_dashboard(server)
    raise DashboardDidNotStart(
        f"streamlit did not answer within {STARTUP_TIMEOUT_S} s:\n{log.read_text()}"
    )


def stop_dashboard(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


@contextlib.contextmanager
def running_dashboard(address: str, env: dict[str, str], log: Path) -> Iterator[str]:
    """The dashboard's URL while the block runs; the server is stopped after it."""
    server, base_url = start_dashboard(address, env, log)
    try:
        yield base_url
    finally:
        stop_dashboard(server)


@contextlib.contextmanager
def chromium() -> Iterator:
    """A headless Chromium browser (Playwright's Browser), closed after the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser, width: int = 1400, height: int = 1000):
    """A page in a fresh context (its own cookies), waiting up to 30 s for what it looks for."""
    page = browser.new_context(viewport={"width": width, "height": height}).new_page()
    page.set_default_timeout(30_000)
    return page

"""Running workers as separate processes and watching them, for the fault and end-to-end tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from datasets.builtin import ensure_digits

REPO = Path(__file__).resolve().parents[2]


def digits_subset(data_dir: Path, per_class: int, classes: int = 10) -> Path:
    """A folder-per-class copy of the first `per_class` digits of each of `classes` classes."""
    source = ensure_digits(data_dir / "datasets")
    target = data_dir / "subsets" / f"digits-{classes}x{per_class}"
    for label in range(classes):
        (target / str(label)).mkdir(parents=True, exist_ok=True)
        for image in sorted((source / str(label)).glob("*.png"))[:per_class]:
            shutil.copy(image, target / str(label) / image.name)
    return target


def worker_env(**extra: str) -> dict[str, str]:
    """The test's environment (DATABASE_URL, TRAINDECK_DATA set by fixtures) plus `extra`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def run_python(code: str, *args: str, timeout: float = 300, **env: str) -> str:
    """Run `code` in a fresh Python process (the worker's environment plus `env`, e.g. a
    PJRT_DEVICE that torch_xla reads once); it must succeed. Returns its standard output."""
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=worker_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def run_worker(*args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        cwd=REPO,
        env=worker_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_worker(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "worker", *args],
        cwd=REPO,
        env=worker_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def child_pids(supervisor_pid: int) -> list[int]:
    """PIDs of the job processes a supervisor started."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == supervisor_pid and b"worker.job_process" in cmdline:
            found.append(int(entry.name))
    return found


def process_state(pid: int) -> str | None:
    """The state letter in /proc/PID/stat (R running, S sleeping, T stopped, Z exited but not
    yet reaped); None once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def wait_until_stopped_at(
    pid: int, failpoint: str, output: Callable[[], str], timeout: float = 300
) -> None:
    """Wait until process `pid`, started with `failpoint` armed (worker.failpoints), stops
    itself there. It stays stopped until resumed, so this waits for a state, not a moment.
    Fails, with `output()` (what the process or its worker printed), if it exits first."""
    deadline = time.monotonic() + timeout
    while (state := process_state(pid)) not in ("T", "t"):
        if state in (None, "Z", "X"):
            raise AssertionError(
                f"the job's process exited before reaching failpoint {failpoint}:\n{output()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for failpoint {failpoint}:\n{output()}"
            )
        time.sleep(0.05)


def output_tail(process: subprocess.Popen[str], limit: int = 3000) -> str:
    """The last of what a started worker printed; it is given 30 s to end, then killed."""
    try:
        output, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
    return (output or "")[-limit:]

"""The background writer: buffers a job's metric points, log lines and progress, and writes
them to the database in batches from its own thread, so the training loop never waits on
the database. When the database is away it keeps everything and retries with backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.errors import first_line
from db import gang, queue, telemetry
from db.engine import Engine
from db.gang import Seat
from db.queue import Lease
from db.telemetry import MetricPoint
from worker import failpoints

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 2.0
MAX_BACKOFF_S = 30.0
# How long a failpoint waits for what the job reported to reach the database (tests only).
FAILPOINT_FLUSH_TIMEOUT_S = 30.0


@dataclass
class Progress:
    epoch: int
    step: int
    total_epochs: int
    total_steps: int
    eta_seconds: float | None
    device: str | None = None


class TelemetryWriter:
    """Collects points, events, XLA reports and progress; a thread writes them every ~2 s.

    The process of one host of a multi-host job (`seat`) also records each step it trains in
    its host's row (the progress watchdog's clock, db.gang). Only the gang's process 0 writes
    the job's points, reports and progress; which process this is, is known once the device is
    open (`set_primary`): until then they wait here. The other processes' log lines reach the
    job's log only as warnings and errors, each naming its host.
    """

    def __init__(
        self,
        engine: Engine,
        lease: Lease,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        seat: Seat | None = None,
    ):
        self._engine = engine
        self._lease = lease
        self._interval = flush_interval_s
        self._seat = seat
        self._primary: bool | None = True if seat is None else None
        self._host_step = 0
        self._host_step_written = 0
        self._lock = threading.Lock()
        # Held while a pass writes to the database: a test's failpoint waits for it before
        # it stops the process, so a stopped job never holds a SQLite write lock.
        self._writing = threading.Lock()
        failpoints.wait_for_before_stopping(self._writing)
        failpoints.flush_before_stopping(
            lambda: self._closing or self.flush(timeout_s=FAILPOINT_FLUSH_TIMEOUT_S)
        )
        self._points: list[MetricPoint] = []
        self._events: list[tuple[str, str]] = []
        self._reports: list[tuple[int, dict[str, Any], str]] = []
        self._progress: Progress | None = None
        self._wake = threading.Event()
        self._flushed = threading.Condition(self._lock)
        self._generation_requested = 0
        self._generation_done = 0
        self._closing = False
        self._failures = 0
        self._thread = threading.Thread(target=self._run, name="telemetry-writer", daemon=True)
        self._thread.start()

    # --- called from the training loop: no I/O, just appends under a lock ---

    def add_points(self, points: list[MetricPoint]) -> None:
        with self._lock:
            if self._primary is not False:
                self._points.extend(points)

    def add_event(self, level: str, message: str) -> None:
        with self._lock:
            if self._seat is not None and not self._speaks_for_the_job():
                if level not in ("warning", "error", "critical"):
                    return
                message = f"host {self._seat.host}: {message}"
            self._events.append((level, message))

    def add_xla_report(self, epoch: int, summary: dict[str, Any], raw: str) -> None:
        with self._lock:
            if self._primary is not False:
                self._reports.append((epoch, summary, raw))

    def set_progress(self, progress: Progress) -> None:
        with self._lock:
            self._host_step = max(self._host_step, progress.step)
            if self._primary is not False:
                self._progress = progress

    def set_primary(self, primary: bool) -> None:
        """Whether this process is its gang's process 0, which writes the job's points,
        reports and progress; another one's are dropped, those held so far too."""
        with self._lock:
            self._primary = primary
            if not primary:
                self._points, self._reports, self._progress = [], [], None
        self._wake.set()

    def _speaks_for_the_job(self) -> bool:
        """Process 0's log is the job's; before the device is open, host 0's is taken for it."""
        if self._primary is None:
            return self._seat is None or self._seat.host == 0
        return self._primary

    def request_flush(self) -> None:
        """Ask the thread to write now, without waiting for it."""
        with self._lock:
            self._generation_requested += 1
        self._wake.set()

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Write everything buffered so far; True when it reached the database in time."""
        with self._lock:
            self._generation_requested += 1
            wanted = self._generation_requested
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        with self._flushed:
            while self._generation_done < wanted:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._flushed.wait(remaining)
        return True

    def close(self, timeout_s: float = 60.0) -> bool:
        with self._lock:
            if self._primary is None:  # it ended before its device was open
                self._primary = self._speaks_for_the_job()
        written = self.flush(timeout_s)
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=5)
        return written

    @property
    def pending_points(self) -> int:
        with self._lock:
            return len(self._points)

    # --- the writer thread ---

    def _run(self) -> None:
        while not self._closing:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._closing:
                break
            with self._lock:
                generation = self._generation_requested
            if self._write_all():
                self._failures = 0
                with self._flushed:
                    self._generation_done = max(self._generation_done, generation)
                    self._flushed.notify_all()
            else:
                self._failures += 1
                backoff = min(MAX_BACKOFF_S, 0.5 * 2**self._failures)
                time.sleep(backoff)
                self._wake.set()

    def _write_all(self) -> bool:
        """One pass: take what is buffered, write it; on failure put it back in front."""
        with self._lock:
            events, self._events = self._events, []
            points: list[MetricPoint] = []
            reports: list[tuple[int, dict[str, Any], str]] = []
            progress: Progress | None = None
            if self._primary:  # else they wait for the role, or are dropped
                points, self._points = self._points, []
                reports, self._reports = self._reports, []
                progress, self._progress = self._progress, None
            host_step = self._host_step
            if self._host_step <= self._host_step_written:
                host_step = 0
        steps: list[tuple[str, Callable[[], Any]]] = []
        if points:
            steps.append(
                (
                    "points",
                    lambda: telemetry.write_metrics(self._engine, self._lease.job_id, points),
                )
            )
        if events:
            steps.append(
                ("events", lambda: telemetry.add_events(self._engine, self._lease.job_id, events))
            )
        for epoch, summary, raw in reports:
            steps.append(
                (
                    "report",
                    lambda e=epoch, s=summary, r=raw: telemetry.add_xla_report(
                        self._engine, self._lease.job_id, e, s, r
                    ),
                )
            )
        if progress is not None:
            steps.append(
                (
                    "progress",
                    lambda: queue.set_progress(
                        self._engine,
                        self._lease,
                        epoch=progress.epoch,
                        step=progress.step,
                        total_epochs=progress.total_epochs,
                        total_steps=progress.total_steps,
                        eta_seconds=progress.eta_seconds,
                        device=progress.device,
                    ),
                )
            )
        seat = self._seat
        if seat is not None and host_step:
            steps.append(("host", lambda: gang.record_progress(self._engine, seat, host_step)))
        done: set[str] = set()
        reports_done = 0
        try:
            with self._writing:
                for kind, write in steps:
                    write()
                    if kind == "report":
                        reports_done += 1
                    else:
                        done.add(kind)
                    if kind == "host":
                        with self._lock:
                            self._host_step_written = max(self._host_step_written, host_step)
        except Exception as exc:
            # Put everything back before anything else can fail: a point is never dropped.
            with self._lock:
                if "points" not in done:
                    self._points[:0] = points
                if "events" not in done:
                    self._events[:0] = events
                self._reports[:0] = reports[reports_done:]
                if "progress" not in done and self._progress is None:
                    self._progress = progress
            if self._failures == 0:
                log.warning(
                    "database write failed, keeping %d points buffered: %s",
                    len(points),
                    first_line(exc),
                )
            return False
        return True

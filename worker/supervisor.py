"""The worker supervisor: claims jobs, runs each in a child process, and watches it.

It never imports torch or torch_xla (one process owns a TPU: the child). While a child runs
it beats the job's heartbeat, passes on a cancel, enforces the time limit, and notices a lost
claim. Shutdown has two stages, as in rq: the first SIGTERM (or Ctrl-C) stops claiming and
asks the child to stop at its next batch, after which the job goes back to the queue; a
second one kills the child at once.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import os
import queue as queues
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, TypeVar

from alerts.drain import Drainer
from common.errors import first_line
from common.files import job_dir
from db import queue, sweeps, telemetry, workers
from db.engine import Engine, retry_with_backoff
from db.queue import ClaimedJob, JobSignal, Lease
from worker import devices
from worker.job_channel import Assignment, graph_key, read_done
from worker.job_process import EXIT_OK, EXIT_PRUNED, EXIT_STOPPED, LOG_PREFIX
from worker.tpu_slice import LIBTPU_LOCKFILE, clear_libtpu_lockfile

if TYPE_CHECKING:
    from db.gang import Departure

log = logging.getLogger("worker")

T = TypeVar("T")
STOP_GRACE_S = 120.0
TICK_S = 0.25
MAX_DB_BACKOFF_S = 30.0
OUTPUT_TAIL_LINES = 40
PR_SET_PDEATHSIG = 1


@dataclass
class SupervisorOptions:
    worker_id: str
    device: str = "auto"
    once: bool = False
    max_jobs: int | None = None
    poll_interval_s: float = 2.0
    heartbeat_interval_s: float = 5.0
    heartbeat_timeout_s: float = 60.0
    stop_grace_s: float = STOP_GRACE_S
    jobs_per_process: int = 1  # on XLA, jobs one process may serve in turn (job_channel)


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _die_with_parent() -> None:
    """In the child, before exec: the kernel kills it if the supervisor dies (kill -9), so an
    orphan never keeps training a job that another worker will take over."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the child also checks its parent at every batch


class JobProcess:
    """A job process and the threads that read its output and its reports.

    It serves one job, or on XLA, while its jobs succeed, the next ones with the same graphs
    (`worker.job_channel`): `current` is the job it trains now, whose log gets its output.
    """

    def __init__(self, process: subprocess.Popen[str], key: tuple | None, report_fd: int | None):
        self.process = process
        self.key = key
        self.jobs = 0
        self.last_job: int | None = None
        self.current: RunningJob | None = None
        self.output_lock = threading.Lock()
        self.done: queues.SimpleQueue[int] = queues.SimpleQueue()
        streams = [process.stdout, process.stderr]
        self.readers = [
            threading.Thread(target=self._relay, args=(stream,), daemon=True) for stream in streams
        ]
        if report_fd is not None:
            reports = os.fdopen(report_fd, encoding="utf-8", errors="replace")
            reader = threading.Thread(target=self._reports, args=(reports,), daemon=True)
            self.readers.append(reader)
        for reader in self.readers:
            reader.start()

    def assign(self, running: RunningJob, assignment: Assignment | None = None) -> bool:
        """Make `running` this process's job; with an `assignment`, send it to the waiting
        process. False when the process is gone or its input closed."""
        if assignment is not None:
            if self.process.poll() is not None or self.process.stdin is None:
                return False
            try:
                self.process.stdin.write(assignment.to_line())
                self.process.stdin.flush()
            except OSError:
                return False
        with self.output_lock:
            self.current = running
        self.jobs += 1
        self.last_job = running.job.id
        return True

    def finished(self, job_id: int) -> bool:
        """Whether the process reported `job_id` done and waits for another."""
        with contextlib.suppress(queues.Empty):
            while True:
                if self.done.get_nowait() == job_id:
                    return True
        return False

    def close(self, grace_s: float) -> None:
        """End the process (its input closed, it exits; killed if it does not within
        `grace_s`) and wait for the last of its output."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.join_readers()

    def join_readers(self) -> None:
        for reader in self.readers:
            reader.join(timeout=10)

    def _relay(self, stream: IO[str] | None) -> None:
        """Echo the process's output here, and keep lines its logging did not already store."""
        if stream is None:
            return
        for line in stream:
            sys.stderr.write(line)
            line = line.rstrip("\n")
            if not line:
                continue
            with self.output_lock:
                running = self.current
                if running is None:
                    continue
                running.output_tail.append(line)
                if not line.startswith(LOG_PREFIX):
                    running.output_for_log.append(("output", line))

    def _reports(self, stream: IO[str]) -> None:
        with stream:
            for line in stream:
                job_id = read_done(line)
                if job_id is not None:
                    self.done.put(job_id)


class RunningJob:
    """A claimed job, the process training it, and why we asked it to stop (if we did)."""

    def __init__(self, job: ClaimedJob, worker: JobProcess, error_file: str):
        self.job = job
        self.worker = worker
        self.process = worker.process
        self.error_file = error_file
        self.started = time.monotonic()
        self.stop_reason: str | None = None
        self.stop_sent_at: float | None = None
        self.killed = False
        self.reported_done = False
        self.error_text: str | None = None  # Supervisor._error_text
        self.output_tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
        self.output_for_log: list[tuple[str, str]] = []

    @property
    def output_lock(self) -> threading.Lock:
        return self.worker.output_lock

    def outcome(self) -> int | None:
        """The job's exit code once it is over: its process's, or 0 when the process reported
        the job done and waits for another."""
        if self.worker.finished(self.job.id):  # first: the process may have ended since
            self.reported_done = True
            return 0
        return self.process.poll()

    def ask_to_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        if self.stop_sent_at is None and self.process.poll() is None:
            self.stop_sent_at = time.monotonic()
            self.process.send_signal(signal.SIGTERM)

    def kill(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        if self.process.poll() is None:
            self.process.kill()
            self.killed = True


class Supervisor:
    def __init__(self, engine: Engine, options: SupervisorOptions):
        self.engine = engine
        self.options = options
        self.shutdown_requests = 0
        self.running: RunningJob | None = None
        self.kept: JobProcess | None = None  # a process whose job succeeded, kept for the next
        self.jobs_run = 0
        self.signal = JobSignal(engine)
        self._last_worker_beat = 0.0
        # A job process of ours was killed or died by a signal: libtpu's lock file it leaves
        # would make the next one find the TPU in use.
        self._process_killed = False

    # --- signals ---

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_shutdown_signal)
        signal.signal(signal.SIGINT, self._on_shutdown_signal)

    def _on_shutdown_signal(self, signum: int, _frame: object) -> None:
        self.shutdown_requests += 1
        name = signal.Signals(signum).name
        if self.shutdown_requests == 1:
            log.warning("%s: finishing up (a second one kills the running job)", name)
        else:
            log.warning("%s again: stopping now", name)

    # --- main loop ---

    def run(self) -> int:
        machine = devices.describe_machine()
        self._with_retries(
            lambda: workers.register_worker(
                self.engine, self.options.worker_id, socket.gethostname(), os.getpid(), machine
            ),
            "register this worker",
        )
        log.info("worker %s on %s, polling for jobs", self.options.worker_id, machine)
        # Every worker sends alerts from the shared outbox too (each is sent once).
        drainer = Drainer(lambda: self.engine, f"worker:{self.options.worker_id}")
        drainer.start()
        try:
            while self.shutdown_requests == 0:
                if self.options.max_jobs is not None and self.jobs_run >= self.options.max_jobs:
                    log.info("ran %d job(s), the most asked for; exiting", self.jobs_run)
                    break
                job = self._claim_next()
                if job is None:
                    if self.options.once:
                        log.info("the queue is empty; nothing to do")
                        break
                    self._beat_worker("idle", None)
                    self.signal.wait(self.options.poll_interval_s)
                    continue
                self.jobs_run += 1
                self._run_job(job)
                if self.options.once:
                    break
        finally:
            drainer.stop()
            self._close_kept()
            self.signal.close()
            self._try(lambda: workers.worker_stopped(self.engine, self.options.worker_id))
        return 0

    def _recover_stale_jobs(self) -> None:
        """Requeue other workers' abandoned jobs. Every worker does it, busy or idle, so that
        recovery never waits for an idle worker."""
        timeout = self.options.heartbeat_timeout_s
        for job_id, status in queue.requeue_stale(self.engine, timeout):
            log.warning("job %d had no heartbeat for %gs: now %s", job_id, timeout, status)

    def _claim_next(self) -> ClaimedJob | None:
        try:
            self._recover_stale_jobs()
            # Whichever worker holds a sweep's claim queues its next trials (db.sweeps).
            self._try(lambda: sweeps.drive_all(self.engine, self.options.worker_id))
            return self._claim()
        except Exception as exc:
            log.warning("cannot reach the database to claim a job: %s", first_line(exc))
            time.sleep(min(MAX_DB_BACKOFF_S, self.options.poll_interval_s * 2))
            return None

    def _claim(self) -> ClaimedJob | None:
        """The next job for this worker (a slice's workers join their slice's: SliceSupervisor)."""
        return queue.claim(self.engine, self.options.worker_id)

    # --- one job ---

    def _run_job(self, job: ClaimedJob) -> None:
        requested = job.spec.get("device", "auto")
        device = devices.resolve_device(self.options.device if requested == "auto" else requested)
        folder = job_dir(job.id)
        folder.mkdir(parents=True, exist_ok=True)
        error_file = str(folder / f".error-{job.lease.lease}.txt")
        key = graph_key(job.spec, device) if self.options.jobs_per_process > 1 else None
        running = self._hand_to_kept(job, key, error_file)
        if running is None:
            log.info(
                "job %d (%s): attempt %d/%d on %s",
                job.id,
                job.name,
                job.attempts,
                job.max_attempts,
                device,
            )
            worker = self._start_process(job, device, key, error_file)
            running = RunningJob(job, worker, error_file)
            worker.assign(running)
        worker = running.worker
        self.running = running
        try:
            exit_code = self._watch(running)
        finally:
            self.running = None
        if exit_code < 0 or running.killed:
            self._process_killed = True
        if not running.reported_done:
            worker.join_readers()  # the process ended: the last of its output is read
        self._flush_output(running)
        self._record_outcome(running, exit_code)
        with worker.output_lock:
            worker.current = None
        if self._may_keep(running, exit_code):
            self.kept = worker
        else:
            worker.close(self.options.stop_grace_s)

    def _hand_to_kept(
        self, job: ClaimedJob, key: tuple | None, error_file: str
    ) -> RunningJob | None:
        """The job, handed to the kept process when its graphs are those of the process's last
        job; else None, and a kept process is ended first (a TPU has one owner)."""
        worker, self.kept = self.kept, None
        if worker is None:
            return None
        if key is not None and key == worker.key:
            previous = worker.last_job
            running = RunningJob(job, worker, error_file)
            if worker.assign(running, Assignment(job.id, job.lease.lease, error_file)):
                log.info(
                    "job %d (%s): attempt %d/%d in the process of job %d, which compiled "
                    "the same graphs",
                    job.id,
                    job.name,
                    job.attempts,
                    job.max_attempts,
                    previous,
                )
                return running
        worker.close(self.options.stop_grace_s)
        return None

    def _may_keep(self, running: RunningJob, exit_code: int) -> bool:
        """Only a process whose job succeeded and that nobody asked to stop serves another."""
        return (
            exit_code == EXIT_OK
            and running.reported_done
            and running.stop_reason is None
            and running.stop_sent_at is None
            and not running.killed
            and self.shutdown_requests == 0
            and not self.options.once
            and running.worker.jobs < self.options.jobs_per_process
        )

    def _close_kept(self) -> None:
        worker, self.kept = self.kept, None
        if worker is not None:
            worker.close(self.options.stop_grace_s)

    def _process_arguments(self, job: ClaimedJob) -> list[str]:
        """More arguments of the job's process (a multi-host job's: SliceSupervisor)."""
        return []

    def _start_process(
        self, job: ClaimedJob, device: str, key: tuple | None, error_file: str
    ) -> JobProcess:
        if device == "xla" and self._process_killed:
            self._process_killed = False
            if clear_libtpu_lockfile():
                log.warning("removed %s, left by a killed job process", LIBTPU_LOCKFILE)
        command = [
            sys.executable, "-m", "worker.job_process",
            "--job-id", str(job.id),
            "--worker-id", job.lease.worker_id,
            "--lease", str(job.lease.lease),
            "--device", device,
            "--parent-pid", str(os.getpid()),
            "--error-file", error_file,
            *self._process_arguments(job),
        ]  # fmt: skip
        report_read = report_write = None
        if key is not None:
            report_read, report_write = os.pipe()
            command += ["--report-fd", str(report_write)]
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE if key is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                bufsize=1,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                pass_fds=(report_write,) if report_write is not None else (),
            )
        except BaseException:
            for fd in (report_read, report_write):
                if fd is not None:
                    os.close(fd)
            raise
        if report_write is not None:
            os.close(report_write)  # the child holds it: our reader sees the end when it exits
        return JobProcess(process, key, report_read)

    def _watch(self, running: RunningJob) -> int:
        job = running.job
        time_limit = job.spec.get("time_limit")
        next_beat = 0.0
        while True:
            exit_code = running.outcome()
            if exit_code is not None:
                return exit_code
            now = time.monotonic()
            if self.shutdown_requests >= 2:
                running.kill("shutdown")
            elif self.shutdown_requests == 1:
                running.ask_to_stop("shutdown")
            if time_limit and now - running.started > time_limit:
                running.ask_to_stop("time_limit")
            if running.stop_sent_at and now - running.stop_sent_at > self.options.stop_grace_s:
                log.warning(
                    "job %d did not stop within %gs; killing it", job.id, self.options.stop_grace_s
                )
                running.kill(running.stop_reason or "unresponsive")
            if now >= next_beat:
                next_beat = now + self.options.heartbeat_interval_s
                self._beat_job(running)
                self._beat_worker("busy", job.id)
                self._try(self._recover_stale_jobs)
            self._flush_output(running)
            with contextlib.suppress(subprocess.TimeoutExpired):
                running.process.wait(timeout=TICK_S)

    def _beat_job(self, running: RunningJob) -> None:
        try:
            reply = queue.heartbeat(self.engine, running.job.lease)
        except Exception as exc:
            log.warning("heartbeat of job %d failed: %s", running.job.id, first_line(exc))
            return
        if not reply.still_owned:
            log.error(
                "job %d is no longer ours (declared stale and taken over?); stopping it",
                running.job.id,
            )
            running.kill("lease_lost")
        elif reply.cancel_requested:
            running.ask_to_stop("cancel")

    def _beat_worker(self, state: str, job_id: int | None) -> None:
        now = time.monotonic()
        if now - self._last_worker_beat < self.options.heartbeat_interval_s:
            return
        self._last_worker_beat = now
        self._try(
            lambda: workers.worker_heartbeat(self.engine, self.options.worker_id, state, job_id)
        )

    def _record_outcome(self, running: RunningJob, exit_code: int) -> None:
        job, lease, reason = running.job, running.job.lease, running.stop_reason
        if reason == "lease_lost":
            return
        host_zero = self._host_zero(running, exit_code)
        if exit_code == EXIT_OK:
            self._finish(lease, "succeeded", None, host_zero)
            log.info("job %d succeeded", job.id)
        elif exit_code == EXIT_PRUNED and reason is None:
            self._finish(lease, "pruned", self._error_text(running, exit_code), host_zero)
            log.info("job %d pruned", job.id)
        elif reason == "shutdown":
            why = "its worker was shut down; it resumes from its last checkpoint"
            self._with_retries(
                lambda: queue.release(self.engine, lease, why, host_zero=host_zero), "requeue"
            )
            log.info("job %d went back to the queue", job.id)
        elif reason == "cancel":
            self._finish(lease, "cancelled", "cancelled on request", host_zero)
            log.info("job %d cancelled", job.id)
        elif reason == "time_limit":
            limit = job.spec.get("time_limit")
            message = f"stopped at its time limit of {limit} s; the last checkpoint is kept"
            self._finish(lease, "failed", message, host_zero)
            log.info("job %d failed: time limit", job.id)
        elif exit_code < 0 or exit_code == EXIT_STOPPED:
            signal_name = _signal_name(-exit_code) if exit_code < 0 else "a stop signal"
            why = f"its training process was killed by {signal_name}"
            if exit_code == -signal.SIGKILL:
                why += " (out of memory?)"
            status = self._with_retries(
                lambda: queue.requeue_after_crash(self.engine, lease, why, host_zero=host_zero),
                "requeue",
            )
            log.warning("job %d: %s; now %s", job.id, why, status)
        else:
            error = self._error_text(running, exit_code)
            self._finish(lease, "failed", error, host_zero)
            log.info("job %d failed: %s", job.id, error.strip().splitlines()[-1])
        self._try(lambda: workers.worker_job_done(self.engine, self.options.worker_id))

    def _finish(
        self, lease: Lease, status: str, error: str | None, host_zero: Departure | None
    ) -> bool | None:
        """queue.finish, retried: False when the lease was lost, None when it gave up."""
        return self._with_retries(
            lambda: queue.finish(self.engine, lease, status, error, host_zero=host_zero),
            f"record the job as {status}",
        )

    def _host_zero(self, running: RunningJob, exit_code: int) -> Departure | None:
        """How host 0 of a multi-host job leaves its seat as its job ends (SliceSupervisor):
        in the transaction of the job's change. A single-host job has no seat."""
        return None

    def _error_text(self, running: RunningJob, exit_code: int) -> str:
        """The process's error, read once (its file goes): the job and its host row get it."""
        if running.error_text is None:
            running.error_text = self._read_error(running, exit_code)
        return running.error_text

    def _read_error(self, running: RunningJob, exit_code: int) -> str:
        try:
            with open(running.error_file, encoding="utf-8") as handle:
                text = handle.read().strip()
            os.unlink(running.error_file)
            if text:
                return text
        except OSError:
            pass
        logged_errors = [
            line.split("] ERROR ", 1)[1]
            for line in running.output_tail
            if line.startswith(LOG_PREFIX) and "] ERROR " in line
        ]
        if logged_errors:
            return "\n".join(logged_errors)
        tail = "\n".join(running.output_tail)
        return f"the training process exited with code {exit_code}" + (f":\n{tail}" if tail else "")

    # --- the child's output ---

    def _flush_output(self, running: RunningJob) -> None:
        with running.output_lock:
            lines, running.output_for_log = running.output_for_log, []
        if not lines:
            return
        try:
            telemetry.add_events(self.engine, running.job.id, lines)
        except Exception:
            with running.output_lock:
                running.output_for_log[:0] = lines

    # --- database calls that must not kill the supervisor ---

    def _try(self, action: Callable[[], object]) -> None:
        try:
            action()
        except Exception as exc:
            log.warning("database update failed: %s", first_line(exc))

    def _with_retries(self, action: Callable[[], T], what: str) -> T | None:
        """Retry with backoff whatever the error; give up only on a second signal."""
        try:
            return retry_with_backoff(
                action,
                what,
                retryable=lambda _exc: True,
                give_up=lambda: self.shutdown_requests >= 2,
                max_backoff_s=MAX_DB_BACKOFF_S,
            )
        except Exception as exc:
            log.error("could not %s (%s); giving up", what, first_line(exc))
            return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"

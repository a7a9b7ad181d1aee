"""The supervisor of one host of a multi-host TPU pod slice: the slice's hosts run one job
together, and fail and resume together.

Every host of the slice runs a worker (`worker.tpu_slice` tells it its slice and host). The
worker on host 0 claims the slice's jobs (those whose `hosts` is the slice's) and holds the
job as a single-host worker does: its heartbeat, its lease, its end. The workers on the other
hosts join that attempt (`db.gang.join`). Each host starts the job's process with the same
spec; the processes meet at the start barrier (`worker.gang`) and train only once all are
there. Each host's supervisor beats its own row.

Host 0's supervisor judges the attempt at every beat (`worker.gang.judge`): when a host's
process failed, died or left, a host's worker stopped beating, the barrier stayed short for
TRAINDECK_GANG_START_TIMEOUT, or a host's process trained no step for
TRAINDECK_PROGRESS_TIMEOUT, it kills its own process and ends the attempt: the job is
requeued whole (or failed with a host's error, or released when a host's worker was shut
down), and its next attempt resumes every host from the newest checkpoint in the store. The
other hosts' supervisors see at their next beat that the attempt is over and kill their
processes. Before a killed process is followed by another, libtpu's stale lock file goes
(`Supervisor._start_process`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import astuple
from datetime import UTC, datetime

from db import gang as gang_rows
from db import queue, workers
from db.engine import Engine
from db.gang import AttemptState, Departure, Seat
from db.queue import ClaimedJob
from worker.gang import GangLimits, GangProblem, judge
from worker.job_process import EXIT_OK, EXIT_PRUNED, EXIT_STOPPED
from worker.supervisor import RunningJob, Supervisor, SupervisorOptions, _signal_name
from worker.tpu_slice import SliceHost

log = logging.getLogger("worker")


class SliceSupervisor(Supervisor):
    def __init__(
        self, engine: Engine, options: SupervisorOptions, place: SliceHost, limits: GangLimits
    ):
        super().__init__(engine, options)
        self.place = place
        self.limits = limits
        self._problem: GangProblem | None = None
        self._over: str | None = None

    @property
    def leads(self) -> bool:
        """Host 0 claims the slice's jobs and holds them; the other hosts join."""
        return self.place.host == 0

    def _claim(self) -> ClaimedJob | None:
        place = self.place
        if self.leads:
            return queue.claim(
                self.engine, self.options.worker_id, slice_name=place.name, hosts=place.hosts
            )
        return gang_rows.join(
            self.engine, self.options.worker_id, place.name, place.hosts, place.host
        )

    def _process_arguments(self, job: ClaimedJob) -> list[str]:
        place = self.place
        return ["--host", str(place.host), "--hosts", str(place.hosts), "--slice", place.name]

    def _seat(self, job: ClaimedJob) -> Seat:
        return Seat(job.id, job.lease.lease, self.place.host)

    def _run_job(self, job: ClaimedJob) -> None:
        self._problem = None
        self._over = None
        log.info("job %d: %s, attempt %d", job.id, self.place, job.attempts)
        super()._run_job(job)

    # --- at every beat ---

    def _beat_job(self, running: RunningJob) -> None:
        seat = self._seat(running.job)
        try:
            state = gang_rows.beat(self.engine, seat)
        except Exception as exc:
            log.warning("heartbeat of job %d's host row failed: %s", running.job.id, exc)
            state = None
        if self.leads:
            super()._beat_job(running)  # the job's own heartbeat, its lease, a cancel
            if running.stop_reason is None:
                self._judge(running)
            return
        if state is None:
            return
        if not state.current(seat):
            self._over = _why_over(state, seat)
            log.warning("job %d: %s; killing its process here", running.job.id, self._over)
            running.kill("attempt_over")
        elif state.cancel_requested:
            running.ask_to_stop("cancel")

    def _judge(self, running: RunningJob) -> None:
        job = running.job
        try:
            rows = gang_rows.members(self.engine, job.id, job.lease.lease)
        except Exception as exc:
            log.warning("cannot read the hosts of job %d: %s", job.id, exc)
            return
        problem = judge(
            rows,
            self.place.hosts,
            self.place.name,
            waited_s=time.monotonic() - running.started,
            now=datetime.now(UTC),
            limits=self.limits,
        )
        if problem is not None:
            self._problem = problem
            log.error("job %d: %s; killing its process on every host", job.id, problem.reason)
            running.kill("gang")

    # --- when the process has ended ---

    def _record_outcome(self, running: RunningJob, exit_code: int) -> None:
        if not self.leads:
            self._leave(running, exit_code)
            return
        if running.stop_reason == "lease_lost":  # no change of the job is ours to make
            seat, why = self._seat(running.job), "another worker took the job over"
            self._with_retries(
                lambda: gang_rows.leave(self.engine, seat, "done", why), "leave the attempt"
            )
        problem = self._problem
        if running.stop_reason != "gang" or problem is None or exit_code == EXIT_OK:
            super()._record_outcome(running, exit_code)
            return
        lease = running.job.lease
        # Host 0 ended the attempt, as the other hosts' processes are told to end: `done`.
        host_zero = Departure("done", f"it ended the attempt: {problem.reason}")
        if problem.action == "fail":
            ended = self._finish(lease, "failed", problem.reason, host_zero)
            status = "failed" if ended else "not ours any more"
        elif problem.action == "release":
            why = f"{problem.reason}; it resumes from its last checkpoint"
            released = self._with_retries(
                lambda: queue.release(self.engine, lease, why, host_zero=host_zero), "requeue"
            )
            status = "queued" if released else "not ours any more"
        else:
            status = self._with_retries(
                lambda: queue.requeue_after_crash(
                    self.engine, lease, problem.reason, host_zero=host_zero
                ),
                "requeue",
            )
        log.warning("job %d: %s; now %s", running.job.id, problem.reason, status)
        self._try(lambda: workers.worker_job_done(self.engine, self.options.worker_id))

    def _host_zero(self, running: RunningJob, exit_code: int) -> Departure | None:
        """Host 0 leaves as the other hosts do when their process ends so (`_departure`)."""
        return self._departure(running, exit_code) if self.leads else None

    def _departure(self, running: RunningJob, exit_code: int) -> Departure:
        """How a host whose process ended leaves its seat, whichever host it is."""
        reason = running.stop_reason
        if reason == "attempt_over":
            return Departure("done", self._over)
        if exit_code in (EXIT_OK, EXIT_PRUNED) or reason in ("cancel", "time_limit"):
            return Departure("done")
        if reason == "shutdown":
            return Departure("left", "its worker was shut down")
        if exit_code < 0 or exit_code == EXIT_STOPPED:
            killer = _signal_name(-exit_code) if exit_code < 0 else "a stop signal"
            return Departure("died", f"its training process was killed by {killer}")
        return Departure("failed", self._error_text(running, exit_code))

    def _leave(self, running: RunningJob, exit_code: int) -> None:
        """A joined host's process ended: say how in its row, which host 0 judges."""
        job = running.job
        state, why = astuple(self._departure(running, exit_code))
        seat = self._seat(job)
        self._with_retries(
            lambda: gang_rows.leave(self.engine, seat, state, why), "leave the attempt"
        )
        log.info("job %d: host %d's process ended (%s)", job.id, self.place.host, why or state)
        self._try(lambda: workers.worker_job_done(self.engine, self.options.worker_id))


def _why_over(state: AttemptState, seat: Seat) -> str:
    if state.status is None:
        return "the job was deleted"
    if state.status == "running" and state.lease != seat.lease:
        return f"the attempt ended (the job is in attempt lease {state.lease} now)"
    if state.status == "running":
        return "this host's seat in the attempt is gone"
    return f"the job is {state.status} now"

"""A multi-host job's gang as a worker sees it: how host 0's supervisor judges the attempt, and
the start barrier and role of each host's job process. (The rows are `db.gang`'s; the
supervisors are `worker.slice_supervisor`'s.)

Every host of the slice runs the job's process with the same spec. Each marks itself ready at
the start barrier and waits there until every host's process is: nobody trains before (on a
real slice libtpu then connects the hosts). Host 0's supervisor gives the attempt up, and every
host kills its process, when a host's process failed, died or left, when a host's worker stops
beating, when the barrier is not full within TRAINDECK_GANG_START_TIMEOUT, or when a host's
process trains no step for TRAINDECK_PROGRESS_TIMEOUT (a hung process still has a beating
worker; on a real slice its peers then wait for it in their next collective).

Only process 0 writes the job's metrics, XLA reports, progress, checkpoints, results and
export; the other processes train the same steps and write none of them (`take_role`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from db.engine import Engine, retry_while_unavailable
from db.gang import HostRow, Seat, mark_ready, ready_hosts

if TYPE_CHECKING:
    from worker.training import TrainingContext

log = logging.getLogger(__name__)

BARRIER_POLL_S = 0.5


@dataclass(frozen=True)
class GangPlace:
    """A job process's place in its gang: its seat (job, attempt, host), the hosts, the slice."""

    seat: Seat
    hosts: int
    slice_name: str


@dataclass(frozen=True)
class GangProblem:
    """Why host 0 gives the attempt up, and what becomes of the job: `requeue` (the attempt
    counts), `release` (it does not: a host's worker was shut down) or `fail` (a host's
    process reported an error)."""

    action: Literal["requeue", "release", "fail"]
    reason: str


@dataclass(frozen=True)
class GangLimits:
    start_timeout_s: float
    heartbeat_timeout_s: float
    progress_timeout_s: float


def judge(
    rows: list[HostRow],
    hosts: int,
    slice_name: str,
    waited_s: float,
    now: datetime,
    limits: GangLimits,
) -> GangProblem | None:
    """What is wrong with the attempt whose hosts are `rows`, `waited_s` seconds after host 0
    claimed it, or None while it is well."""
    for row in rows:
        why = f": {row.reason}" if row.reason else ""
        if row.state == "failed":
            return GangProblem("fail", f"host {row.host} of slice {slice_name} failed{why}")
        if row.state == "died":
            return GangProblem("requeue", f"host {row.host} of slice {slice_name}{why}")
        if row.state == "left":
            return GangProblem("release", f"host {row.host} of slice {slice_name} left{why}")
    present = [row for row in rows if row.state == "joined"]
    for row in present:
        silent = (now - row.heartbeat_at).total_seconds()
        if silent > limits.heartbeat_timeout_s:
            return GangProblem(
                "requeue",
                f"host {row.host} of slice {slice_name} (worker {row.worker_id}) sent no "
                f"heartbeat for {silent:.0f} s",
            )
    # Every row is `joined` or `done` here (a host whose process ended well still counts).
    ready = [row.ready_at for row in rows if row.ready_at is not None]
    if len(ready) < hosts:
        if waited_s <= limits.start_timeout_s:
            return None
        seated = {row.host for row in rows}
        absent = [str(host) for host in range(hosts) if host not in seated]
        waiting = [str(row.host) for row in rows if row.ready_at is None]
        details = []
        if absent:
            details.append(f"host {', '.join(absent)} never joined")
        if waiting:
            details.append(f"the job process of host {', '.join(waiting)} never got there")
        return GangProblem(
            "requeue",
            f"the start barrier timed out: {len(ready)} of the {hosts} hosts of slice "
            f"{slice_name} were ready after {limits.start_timeout_s:g} s ("
            + "; ".join(details)
            + ")",
        )
    started = max(ready)  # type: ignore[type-var]
    idle = {
        row.host: (now - max(row.progress_at or started, started)).total_seconds()
        for row in present
    }
    stalled = [row for row in present if idle[row.host] > limits.progress_timeout_s]
    if stalled:
        # The one stalled longest: on a real slice its peers then wait for it in a collective.
        row = max(stalled, key=lambda row: idle[row.host])
        return GangProblem(
            "requeue",
            f"the job process of host {row.host} of slice {slice_name} trained no step for "
            f"{idle[row.host]:.0f} s (at step {row.step}) while its worker still beat: hung",
        )
    return None


# --- in the job process -------------------------------------------------------------------


def wait_at_start_barrier(
    engine: Engine, place: GangPlace, stop: threading.Event, poll_s: float = BARRIER_POLL_S
) -> bool:
    """Mark this host's process ready, then wait until every host's is. False when the attempt
    ended meanwhile or a stop was asked for (the supervisor then ends this process)."""
    seat = place.seat
    marked = retry_while_unavailable(
        lambda: mark_ready(engine, seat), "reach the start barrier", give_up=stop.is_set
    )
    if not marked:
        return False
    said = False
    while not stop.is_set():
        ready = retry_while_unavailable(
            lambda: ready_hosts(engine, seat.job_id, seat.lease),
            "count the hosts at the start barrier",
            give_up=stop.is_set,
        )
        if ready >= place.hosts:
            log.info(
                "all %d hosts of slice %s are at the start barrier: training starts",
                place.hosts,
                place.slice_name,
            )
            return True
        if not said:
            log.info(
                "host %d is at the start barrier; %d of %d hosts are (nobody trains before all)",
                seat.host,
                ready,
                place.hosts,
            )
            said = True
        stop.wait(poll_s)
    return False


def process_index(device_kind: str, host: int) -> int:
    """Which process of the multi-host program this is: torch_xla's own index where its runtime
    spans several processes (on a real slice process 0 is not necessarily host 0), else the
    host number (each host's process is a runtime of its own: the tests on one machine, since
    torch_xla's CPU backend runs one process only)."""
    if device_kind == "xla":
        import torch_xla.runtime as xr

        if xr.process_count() > 1:
            return int(xr.process_index())
    return host


def take_role(ctx: TrainingContext) -> None:
    """Once the device is open: which process of the gang this is, and so whether it writes
    the job's metrics, reports, progress, checkpoints, results and export (process 0 only)."""
    place = ctx.gang
    if place is None:
        return
    ctx.process_index = process_index(ctx.device_kind, place.seat.host)
    ctx.writer.set_primary(ctx.process_index == 0)
    if ctx.process_index == 0:
        log.info(
            "host %d is process 0 of %d: it writes the job's metrics, checkpoints and export",
            place.seat.host,
            place.hosts,
        )
    else:
        log.warning(
            "process %d of %d: trains like process 0 and leaves the metrics, checkpoints "
            "and export to it",
            ctx.process_index,
            place.hosts,
        )

"""`python -m cloud.watch --project P --zone Z`: requeue the jobs of preempted TPU VMs and
suspended slices when nobody has the TPU VMs page open.

Every `--interval` seconds it lists the zone's nodes and, for each one that is PREEMPTED,
TERMINATED or STOPPED, puts the running jobs of its worker (`tpu-<node name>`, or every host's
`tpu-<node name>.host<N>` on a slice) back in the queue with a job event saying why. Then it
lists the zone's queued resources and does the same for the node of each one that is
SUSPENDING, SUSPENDED, FAILED or DELETING: a slice's job goes back as a whole. The TPU VMs page
does the same on each refresh; without
either, the queue still recovers such jobs once their heartbeat is older than
TRAINDECK_HEARTBEAT_TIMEOUT, only later and without naming the preemption.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from typing import NoReturn

from cloud.slices import QueuedResources, recover_jobs_of_lost_slices
from cloud.tpu import (
    TpuError,
    TpuVms,
    api_endpoint,
    default_project,
    default_zone,
    load_credentials,
    make_client,
    recover_jobs_of_lost_nodes,
)
from common.entry import run_main
from common.errors import first_line
from db.engine import DatabaseError, DatabaseUrlError, Engine, get_engine

EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"error: {message} (see {self.prog} --help)\n")


def _say(message: str) -> None:
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M:%S} {message}", flush=True)


def check_once(vms: TpuVms, engine: Engine) -> int:
    """One look at the zone's nodes, then at its queued resources; returns how many jobs
    changed state."""
    nodes = vms.list_nodes()
    recoveries = recover_jobs_of_lost_nodes(engine, nodes)
    for recovery in recoveries:
        _say(recovery.summary())
    queued = QueuedResources(vms).list()
    later = recover_jobs_of_lost_slices(engine, queued)
    for recovery in later:
        _say(recovery.summary())
    return sum(len(recovery.outcomes) for recovery in recoveries + later)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m cloud.watch", description=__doc__.split("\n")[0])
    parser.add_argument("--project", default=None, help="Google Cloud project (default: env)")
    parser.add_argument("--zone", default=None, help="zone of the TPU VMs (default: env)")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between looks")
    parser.add_argument("--once", action="store_true", help="look once, then exit")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error("--interval must be greater than 0")
    try:
        endpoint = api_endpoint()
        found = load_credentials(endpoint)
        project = args.project or default_project(found)
        zone = args.zone or default_zone()
        if not project or not zone:
            parser.error("say --project and --zone (or set TRAINDECK_TPU_PROJECT and _ZONE)")
        vms = TpuVms(make_client(endpoint, found.credentials), project, zone, endpoint)
        engine = get_engine()
    except (TpuError, DatabaseUrlError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    _say(f"watching the TPU VMs of {project} in {zone} every {args.interval:g} s")
    while True:
        try:
            check_once(vms, engine)
        except TpuError as exc:
            _say(f"could not check: {exc}")
            if args.once:
                return 1
        except DatabaseError as exc:
            _say(f"the database failed: {first_line(exc)}")
            if args.once:
                return 1
        if args.once:
            return 0
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    try:
        run_main(main)
    except KeyboardInterrupt:
        sys.exit(0)

"""`python -m worker`: run a worker supervisor against the queue in DATABASE_URL."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from common import config, store
from common.cliargs import EXIT_USER_ERROR, Parser, positive_int, positive_seconds
from common.entry import EXIT_SETTINGS
from common.settings import SettingsError
from db.engine import get_engine
from worker import tpu_slice
from worker.supervisor import Supervisor, SupervisorOptions, default_worker_id


def _worker_id(text: str) -> str:
    text = text.strip()
    if not text or len(text) > 200 or any(ord(c) < 32 for c in text):
        raise argparse.ArgumentTypeError("a worker id is 1 to 200 printable characters")
    return text


def build_parser(prog: str = "python -m worker") -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        description="Claim training jobs from the queue and run them, one at a time.",
        epilog=f"{prog} predict --job ID IMAGE… classifies images with a finished "
        f"job's exported model (see {prog} predict --help).",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="run at most one job, then exit (an empty queue exits at once)",
    )
    parser.add_argument(
        "--max-jobs", type=positive_int, default=None, metavar="N", help="exit after N jobs"
    )
    parser.add_argument(
        "--device",
        choices=("auto", "xla", "cuda", "cpu"),
        default="auto",
        help="device for jobs whose spec says auto (default: auto = TPU if "
        "present, else CUDA, else CPU)",
    )
    parser.add_argument(
        "--poll-interval",
        type=positive_seconds,
        default=2.0,
        metavar="S",
        help="seconds between polls of an empty queue (Postgres wakes at once on a submit)",
    )
    parser.add_argument(
        "--worker-id",
        type=_worker_id,
        default=None,
        metavar="ID",
        help="name of this worker in the workers table (default: host-pid)",
    )
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m worker") -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["predict"]:
        from worker import predict  # imports fastai, which the supervisor itself never needs

        return predict.main(argv[1:])
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        options = SupervisorOptions(
            worker_id=args.worker_id or default_worker_id(),
            device=args.device,
            once=args.once,
            max_jobs=args.max_jobs,
            jobs_per_process=config.jobs_per_process(),
            poll_interval_s=args.poll_interval,
            heartbeat_interval_s=config.heartbeat_interval_s(),
            heartbeat_timeout_s=config.heartbeat_timeout_s(),
        )
        config.ensure_data_dir()  # every job's checkpoints and export go there
        place = tpu_slice.this_host()
        if place is not None:
            options = _on_a_slice(options, place)
        engine = get_engine()
        store.check_reachable()  # a missing or refused bucket: one line naming it, not a job
    except SettingsError:
        raise  # one line and exit 2 from common.entry.run_main, as for every command
    except store.StoreError as exc:
        print(f"traindeck: {exc}", file=sys.stderr)
        return EXIT_SETTINGS
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    if place is None:
        supervisor = Supervisor(engine, options)
    else:
        from worker.gang import GangLimits
        from worker.slice_supervisor import SliceSupervisor

        limits = GangLimits(
            start_timeout_s=config.gang_start_timeout_s(),
            heartbeat_timeout_s=options.heartbeat_timeout_s,
            progress_timeout_s=config.progress_timeout_s(),
        )
        supervisor = SliceSupervisor(engine, options, place, limits)
        logging.getLogger("worker").info("this worker is %s", place)
    supervisor.install_signal_handlers()
    return supervisor.run()


def _on_a_slice(options: SupervisorOptions, place: tpu_slice.SliceHost) -> SupervisorOptions:
    """A slice host's options: its own worker id (the same startup script names every host's
    worker alike; host 0 keeps the name, so that a preempted slice's job is found by it), and
    a new job process for every job. Its hosts resume from the store's checkpoints, so the
    store must be one they share."""
    if not store.is_shared():
        raise tpu_slice.SliceError(
            f"this worker is {place}, whose hosts resume each job from the store's checkpoint: "
            "set TRAINDECK_STORE to a gs:// bucket they share"
        )
    worker_id = options.worker_id if place.host == 0 else f"{options.worker_id}-host{place.host}"
    return dataclasses.replace(options, worker_id=worker_id, jobs_per_process=1)

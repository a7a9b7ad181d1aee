"""The child process that trains a job: `python -m worker.job_process --job-id N ...`.

Started by the supervisor for one job, so that a crash, a leak or a wedged device ends with
the process and the supervisor lives on. It owns the accelerator while it runs. Started with
`--report-fd` (on XLA), after a job that succeeded it may be handed the next job with the same
graphs, which XLA's in-memory cache then serves (`worker.job_channel`); a job that fails or is
stopped ends it as before.

Exit codes: 0 trained and exported; 3 stopped because the supervisor asked (SIGTERM);
4 a sweep's trial its pruner stopped, the reason written to the --error-file;
1 failed, with the error written to the file given by --error-file.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import traceback
import warnings
from pathlib import Path

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_STOPPED = 3
EXIT_PRUNED = 4
LOG_PREFIX = "[traindeck job "
WRITER_CLOSE_TIMEOUT_S = 120.0


class WriterLogHandler(logging.Handler):
    """Sends log records to the job's log (job_events) through the background writer."""

    def __init__(self, writer) -> None:
        super().__init__(level=logging.INFO)
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.writer.add_event(record.levelname.lower(), self.format(record))
        except Exception:
            self.handleError(record)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m worker.job_process")
    parser.add_argument("--job-id", type=int, required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--lease", type=int, required=True)
    parser.add_argument("--device", choices=("xla", "cuda", "cpu"), required=True)
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--error-file", type=Path, required=True)
    parser.add_argument("--report-fd", type=int, default=None)
    # A multi-host job (worker.gang): this host's number, the slice's hosts, the slice.
    parser.add_argument("--host", type=int, default=0)
    parser.add_argument("--hosts", type=int, default=1)
    parser.add_argument("--slice", default=None)
    return parser.parse_args(argv)


def keep_python_numbers_out_of_the_graph() -> None:
    """Every Python number a traced op takes reaches an XLA graph as an input of its own, so a
    hyper-parameter that changes during training never changes the step's graph.

    torch_xla bakes the numbers 0 and ±1 into the graph as constants, and passes any other as
    device data shared by every number of the same value. A changing number that reaches 1,
    or the value of another one, changes the graph, which then compiles again mid-training:
    fastai's weight-decay factor 1 - lr·wd rounds to 1.0 in float32 at the low end of a
    one-cycle schedule (seen: a new training graph in epoch 3 of 3, with one input fewer), as
    Adam's bias correction 1 - 0.99^step does after about 1,650 steps. Called before torch_xla
    starts its runtime: XLA_NO_SPECIAL_SCALARS is read once. Importing torch_xla picks a
    default PJRT device, so on a worker with neither a TPU nor PJRT_DEVICE it is left for the
    training to refuse the job with its reason.
    """
    from worker.devices import tpu_present

    os.environ.setdefault("XLA_NO_SPECIAL_SCALARS", "1")
    if not tpu_present() and not os.environ.get("PJRT_DEVICE"):
        return
    import torch_xla

    torch_xla._XLAC._set_xla_enable_device_data_cache(False)


def _configure_logging(job_id: int, writer) -> None:
    terminal = logging.StreamHandler(sys.stderr)
    terminal.setFormatter(logging.Formatter(f"{LOG_PREFIX}{job_id}] %(levelname)s %(message)s"))
    to_database = WriterLogHandler(writer)
    to_database.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [terminal, to_database]
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    warnings.simplefilter("default")
    # fastai's tabular module sets a pandas option that pandas 3 deprecates, on every import.
    warnings.filterwarnings("ignore", message=".*mode.chained_assignment.*")
    for noisy in ("urllib3", "PIL", "matplotlib", "fsspec", "sqlalchemy"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.device == "xla":
        keep_python_numbers_out_of_the_graph()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides; it sends SIGTERM

    from db.engine import get_engine
    from worker.job_channel import Assignment, next_assignment

    engine = get_engine()
    assignment = Assignment(args.job_id, args.lease, str(args.error_file))
    previous: int | None = None
    while True:
        exit_code = run_job(engine, args, assignment, stop, previous)
        if exit_code != EXIT_OK or stop.is_set() or args.report_fd is None:
            return exit_code
        following = next_assignment(args.report_fd, assignment.job_id, sys.stdin)
        if following is None or stop.is_set():
            return EXIT_OK
        previous, assignment = assignment.job_id, following


def run_job(
    engine, args: argparse.Namespace, assignment, stop: threading.Event, previous: int | None
) -> int:
    """Train one job; its exit code. `previous`: the job this process trained before it."""
    from common.files import job_dir
    from db.engine import retry_while_unavailable
    from db.queue import Lease, get_job
    from db.spec import JobSpec
    from db.sweeps import trial_of
    from worker.checkpoint import write_failure
    from worker.gang import wait_at_start_barrier
    from worker.reporter import TelemetryWriter
    from worker.system_metrics import start_for_job

    lease = Lease(assignment.job_id, args.worker_id, assignment.lease)
    place = _gang_place(args, assignment)
    writer = TelemetryWriter(engine, lease, seat=place.seat if place is not None else None)
    _configure_logging(assignment.job_id, writer)
    log = logging.getLogger("worker.job")
    after = f", which trained job {previous} before" if previous is not None else ""
    log.info("job process %d%s", os.getpid(), after)
    from worker import training

    sampler = None
    try:
        job = retry_while_unavailable(
            lambda: get_job(engine, assignment.job_id), "read the job", give_up=stop.is_set
        )
        sampler = start_for_job(writer, job.created_at, args.device)
        spec = JobSpec.model_validate(job.spec)
        trial = retry_while_unavailable(
            lambda: trial_of(engine, assignment.job_id),
            "read the job's sweep",
            give_up=stop.is_set,
        )
        folder = job_dir(assignment.job_id)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise write_failure("the job's folder", folder, exc) from exc
        context = training.TrainingContext(
            engine=engine,
            lease=lease,
            spec=spec,
            job_dir=folder,
            device_kind=args.device,
            writer=writer,
            stop=stop,
            parent_pid=args.parent_pid,
            trial=trial,
            previous_job=previous,
            gang=place,
        )
        if place is not None and not wait_at_start_barrier(engine, place, stop):
            raise training.StopRequested()
        training.run(context)
        return EXIT_OK
    except training.StopRequested:
        log.info("stopped on request; the last checkpoint is kept")
        return EXIT_STOPPED
    except training.TrialPruned as pruned:
        log.info("%s", pruned)
        _write_error(Path(assignment.error_file), str(pruned))
        return EXIT_PRUNED
    except Exception as exc:
        if stop.is_set():
            log.info("stopped on request (%s)", type(exc).__name__)
            return EXIT_STOPPED
        if isinstance(exc, (training.JobFailure, *_user_errors())):
            message = str(exc)
            log.error("%s", message)
        else:
            message = traceback.format_exc()
            log.error("training failed:\n%s", message)
        _write_error(Path(assignment.error_file), message)
        return EXIT_FAILED
    finally:
        if sampler is not None:
            sampler.stop()  # before the writer closes: its last points are written too
        if not writer.close(WRITER_CLOSE_TIMEOUT_S):
            print(
                f"{LOG_PREFIX}{assignment.job_id}] WARNING could not write the last metrics to "
                f"the database ({writer.pending_points} points lost)",
                file=sys.stderr,
            )
        root = logging.getLogger()  # the job's log is closed: what comes next is not its
        root.handlers[:] = [h for h in root.handlers if not isinstance(h, WriterLogHandler)]


def _gang_place(args: argparse.Namespace, assignment):
    """This process's place in its gang, for a multi-host job; None for any other."""
    if args.hosts <= 1:
        return None
    from db.gang import Seat
    from worker.gang import GangPlace

    seat = Seat(assignment.job_id, assignment.lease, args.host)
    return GangPlace(seat, args.hosts, args.slice or "")


def _write_error(path: Path, message: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(message, encoding="utf-8")
    except OSError:
        pass  # the disk is full or the folder unwritable: the logged error line says it


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors that describe a problem with the job's input, shown without a traceback."""
    from datasets.labelling import DatasetError
    from worker.checkpoint import ArtifactWriteError

    return (DatasetError, ArtifactWriteError)


if __name__ == "__main__":
    from common.entry import run_main

    run_main(main)

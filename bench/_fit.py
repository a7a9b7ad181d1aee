"""Shared by the training benchmarks: the worker's instrumentation around a Learner, and the
CPU time of this process with every process it started (a logger's service runs apart)."""

from __future__ import annotations

import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class DigitsFit:
    """What every arm of a training benchmark shares: a scratch data folder with its SQLite
    database, the job spec, the opened device and the digits DataLoaders."""

    folder: Path
    engine: Any
    spec: Any
    setup: Any
    dls: Any
    images_per_fit: int


def prepare_digits_fit(prefix: str, epochs: int, img_size: int, bs: int, xla: bool) -> DigitsFit:
    """Point traindeck at a fresh temporary folder and build the digits DataLoaders as the
    worker does, on the CPU or (`xla`) on XLA's CPU device."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["TRAINDECK_DATA"] = str(folder)
    os.environ["DATABASE_URL"] = f"sqlite:///{folder / 'bench.db'}"
    if xla:
        os.environ.setdefault("PJRT_DEVICE", "CPU")

    from datasets.builtin import ensure_digits
    from datasets.labelling import scan_items
    from db.engine import get_engine
    from db.migrate import upgrade
    from db.spec import JobSpec
    from worker.data import build_dataloaders
    from worker.training import open_device

    engine = get_engine()
    upgrade(engine)
    spec = JobSpec(epochs=epochs, img_size=img_size, bs=bs, lr=1e-2,
                   device="xla" if xla else "cpu")  # fmt: skip
    setup = open_device(spec.device)
    dls = build_dataloaders(scan_items(ensure_digits(), {"type": "folder"}), spec, setup.device)
    return DigitsFit(folder, engine, spec, setup, dls, len(dls.train) * bs * epochs)


def instrument_like_worker(
    learn: Any,
    engine: Any,
    spec: Any,
    folder: Path,
    label: str,
    epochs: int,
    xla: bool,
    checkpoints: bool = True,
    after_write: Any = None,
    interval_policy: bool = True,
) -> Any:
    """Add what `worker.training.run` adds to a Learner: per-batch loss and lr, per-epoch
    metrics, progress, the background writer flushing to the database, the stop check, the
    wait for input (`worker.input_wait`), the profile requests' look-ups (`worker.profiling`:
    at every epoch's start and from a thread every 2 s; none is asked for here), the worker's
    checkpoints (unless `checkpoints` is off): each epoch's state kept, written in the background
    on XLA once the job's checkpoint interval has passed (after the last epoch only with
    TRAINDECK_KEEP_CHECKPOINTS, as the worker decides), or after
    every epoch when `interval_policy` is off; and on XLA the metrics
    report; and what the job process adds around it, the system-metrics sampler
    (every TRAINDECK_SYSTEM_METRICS_INTERVAL seconds, from the fit's start to its end). The
    fit ends when the last checkpoint is on disk, as the worker waits for it before the
    export; `after_write(path, epoch)` hears of each checkpoint written (the worker's uploader
    to the store). Returns the telemetry writer to close."""
    from fastai.callback.core import Callback

    from common import store
    from db import queue
    from worker.callbacks import (
        EpochEndCallback,
        StopCallback,
        TelemetryCallback,
        TrainingClock,
        XlaReportCallback,
    )
    from worker.checkpoint import CheckpointWriter
    from worker.input_wait import InputWaitCallback
    from worker.profiling import ProfileCallback
    from worker.reporter import TelemetryWriter
    from worker.system_metrics import start_for_job
    from worker.training import checkpoint_interval_s

    job_id = queue.enqueue(engine, spec)
    lease = queue.claim(engine, "bench").lease
    writer = TelemetryWriter(engine, lease)
    clock = TrainingClock(epochs, len(learn.dls.train))
    job_dir = folder / f"job-{job_id}"
    job_dir.mkdir(parents=True)  # as the worker's job process does

    # As the worker decides: in the background on an accelerator, at most every
    # checkpoint_interval_s; then handed to the uploader.
    checkpoint_writer = CheckpointWriter(
        job_dir,
        background=xla,
        after_write=after_write,
        interval_s=checkpoint_interval_s(spec) if interval_policy else 0.0,
    )

    def checkpoint(epoch: int) -> None:
        last = epoch + 1 == epochs and store.keep_final_checkpoint()  # as the worker decides
        spec_json = spec.model_dump(mode="json")
        checkpoint_writer.save(learn, epoch=epoch, lr=1e-2, spec=spec_json, last=last)

    class LastCheckpointOnDisk(Callback):
        order = EpochEndCallback.order + 1

        def after_fit(self) -> None:
            checkpoint_writer.wait()

    submitted = queue.get_job(engine, job_id).created_at

    class SystemSampling(Callback):
        """The job process's sampler, over the fit (the job process runs it over the job)."""

        def before_fit(self) -> None:
            self.sampler = start_for_job(writer, submitted, "xla" if xla else "cpu")

        def after_fit(self) -> None:
            if self.sampler is not None:
                self.sampler.stop()

    profiler = ProfileCallback(engine, job_id, clock, learn.dls.device, job_dir, _no_publish)

    class EndProfileRequests(Callback):
        """What `worker.training.run` does once the fit is over: the look-ups stop."""

        def after_fit(self) -> None:
            profiler.close()

    learn.add_cbs(
        [
            TelemetryCallback(writer, clock, label),
            InputWaitCallback(writer, clock),
            StopCallback(threading.Event(), os.getppid()),
            SystemSampling(),
            profiler,
            EndProfileRequests(),
        ]
    )
    if checkpoints:
        learn.add_cbs([EpochEndCallback(clock, checkpoint), LastCheckpointOnDisk()])
    if xla:
        learn.add_cb(XlaReportCallback(writer, clock))
    return writer


def _no_publish(kind: str, path: Path) -> None:
    raise AssertionError(f"the benchmark asks for no profile, yet a {kind} was made: {path}")


def check_fit_finished(learn: Any, epochs: int) -> None:
    """A fit that stopped early (a failed checkpoint ends it quietly) would count images it
    never trained: refuse its figures."""
    from worker.callbacks import EpochEndCallback

    for callback in learn.cbs:
        if isinstance(callback, EpochEndCallback) and callback.failure is not None:
            raise SystemExit(f"a checkpoint failed, the fit stopped early: {callback.failure}")
    if len(learn.recorder.values) != epochs:
        raise SystemExit(f"the fit stopped after {len(learn.recorder.values)} of {epochs} epochs")


def _cpu_ticks(stat: str) -> tuple[int, int]:
    """(parent pid, utime + stime + cutime + cstime) from a /proc/PID/stat line."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[1]), sum(int(value) for value in fields[11:15])


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process, its reaped children, and its live descendants."""
    ticks: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ticks[int(entry.name)] = _cpu_ticks((entry / "stat").read_text())
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _) in ticks.items() if ppid == parent]
        tree.update(children)
        frontier.extend(children)
    return sum(ticks[pid][1] for pid in tree if pid in ticks) / os.sysconf("SC_CLK_TCK")


def threads_cpu_seconds(names: tuple[str, ...]) -> dict[str, float]:
    """CPU seconds so far of this process's Python threads named in `names` (summed by name)."""
    import psutil

    named = {thread.native_id: thread.name for thread in threading.enumerate()}
    found = dict.fromkeys(names, 0.0)
    for thread in psutil.Process().threads():
        name = named.get(thread.id)
        if name in found:
            found[name] += thread.user_time + thread.system_time
    return found


def time_callbacks(learn: Any, totals: dict[str, float], package: str = "worker.") -> None:
    """Add to `totals[ClassName]` the training thread's CPU seconds (time.thread_time) spent in
    each of `learn`'s callbacks defined under `package`: what traindeck itself costs the loop,
    apart from the noise of other processes on the machine."""
    import time

    for callback in learn.cbs:
        cls = type(callback)
        if not cls.__module__.startswith(package):
            continue
        totals.setdefault(cls.__name__, 0.0)

        def timed_call(self: Any, event_name: str, _call: Any = cls.__call__) -> Any:
            started = time.thread_time()
            try:
                return _call(self, event_name)
            finally:
                totals[type(self).__name__] += time.thread_time() - started

        # Past fastai's Callback.__setattr__, which would warn of a shadowed attribute.
        object.__setattr__(
            callback, "__class__", type(cls.__name__, (cls,), {"__call__": timed_call})
        )

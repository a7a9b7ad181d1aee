"""Profile captures in the job's process: record the next N training steps when asked.

A person asks through the database (`db.profiles`). `ProfileCallback` looks for a request
synchronously at the start of every epoch and, in between, through a thread that polls every
PROFILE_POLL_S seconds (the training loop itself never waits on the database). Between two
batches it starts the profiler, counts N training steps, and stops it after the Nth:
- on XLA, torch_xla's profiler (`torch_xla.debug.profiler.start_trace`/`stop_trace`), after
  waiting for the device's queued work so that the last step is in the trace; it writes
  TensorBoard's profile layout, `plugins/profile/<time>/<host>.xplane.pb` (TensorBoard's
  profile plugin reads it) and `<host>.trace.json.gz` (a Chrome trace-event file that
  Perfetto opens), both seen written on the CPU backend here;
- otherwise `torch.profiler` (CPU, and CUDA on a GPU), exported as a Chrome trace-event file,
  `<host>.pt.trace.json`, that Perfetto opens.
The folder is zipped, put in the store and recorded as the job's `profile` artifact by a
thread of its own, while training goes on. The profiler observes and changes no value: the
job's curves go on step by step through the capture.
"""

from __future__ import annotations

import logging
import shutil
import socket
import tempfile
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from db.engine import Engine
from db.profiles import (
    Capture,
    fail_open_captures,
    fail_orphaned_recordings,
    finish_capture,
    take_request,
)
from worker.callbacks import TrainedEpochCallback, TrainingClock

log = logging.getLogger("worker.training")

PROFILE_POLL_S = 2.0
PROFILE_KIND = "profile"


class _XlaTrace:
    tool = "torch_xla.debug.profiler"

    def __init__(self, folder: Path):
        import torch_xla.debug.profiler as xp

        self._xp = xp
        xp.start_trace(str(folder))

    def stop(self) -> None:
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()  # the steps' queued device work belongs in the trace
        self._xp.stop_trace()


class _TorchTrace:
    tool = "torch.profiler"

    def __init__(self, folder: Path, device: torch.device):
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        self._cuda = device.type == "cuda"
        if self._cuda:
            activities.append(ProfilerActivity.CUDA)
        self._folder = folder
        self._profile = profile(activities=activities)
        self._profile.start()

    def stop(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()
        self._profile.stop()
        self._profile.export_chrome_trace(
            str(self._folder / f"{socket.gethostname()}.pt.trace.json")
        )


def start_trace(folder: Path, device: torch.device) -> Any:
    """A running trace (with `tool` and `stop()`) for `device`, writing under `folder`."""
    if device.type == "xla":
        return _XlaTrace(folder)
    return _TorchTrace(folder, device)


def zip_folder(folder: Path, out: Path) -> int:
    """Every file under `folder` into the zip `out`; returns how many."""
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            archive.write(path, path.relative_to(folder).as_posix())
    return len(files)


class ProfileCallback(TrainedEpochCallback):
    """Takes profile requests and records the training steps they ask for (see the module)."""

    # Last in after_batch: on XLA after the step's sync (XlaStepCallback, -20), so a step's
    # whole graph is dispatched before the trace stops.
    order = 99

    def __init__(
        self,
        engine: Engine,
        job_id: int,
        clock: TrainingClock,
        device: torch.device,
        work_dir: Path,
        publish: Callable[[str, Path], Any],
        poll_s: float = PROFILE_POLL_S,
    ):
        self.engine = engine
        self.job_id = job_id
        self.clock = clock
        self.device = device
        self.work_dir = work_dir
        self.publish = publish
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._pending: Capture | None = None
        # (capture, trace, its folder, the first step recorded)
        self._recording: tuple[Capture, Any, Path, int] | None = None
        self._done_steps = 0
        self._stop_polling = threading.Event()
        self._poller: threading.Thread | None = None
        self._uploads: list[threading.Thread] = []

    # --- requests -----------------------------------------------------------------------

    def _look_for_request(self) -> None:
        # One look at a time: a look at an epoch's start waits for the polling thread's look
        # in flight, so a request taken by either is pending before the epoch's first batch.
        with self._lock:
            if self._pending is not None or self._recording is not None:
                return
            try:
                taken = take_request(self.engine, self.job_id)
            except Exception as exc:  # the database away for a moment: the next look retries
                log.debug("profile request look-up failed: %s", exc)
                return
            self._pending = taken

    def _poll(self) -> None:
        while not self._stop_polling.wait(self.poll_s):
            self._look_for_request()

    def before_fit(self) -> None:
        super().before_fit()
        if not self.active or self._poller is not None:
            return  # lr_find's fit records nothing; fine_tune's second phase polls on
        try:  # a capture an earlier attempt's process was recording will never be stored
            fail_orphaned_recordings(self.engine, self.job_id)
        except Exception as exc:
            log.warning("profile captures: cannot close an earlier attempt's: %s", exc)
        self._poller = threading.Thread(target=self._poll, name="profile-requests", daemon=True)
        self._poller.start()

    def before_epoch(self) -> None:
        super().before_epoch()
        if self.active:
            self._look_for_request()

    # --- recording ----------------------------------------------------------------------

    def before_batch(self) -> None:
        if not self.training_batch() or self._recording is not None:
            return
        with self._lock:
            capture, self._pending = self._pending, None
        if capture is None:
            return
        folder = Path(tempfile.mkdtemp(prefix=f"profile-{capture.id}-", dir=self.work_dir))
        step = self.clock.global_step(self.epoch, self.iter)
        try:
            trace = start_trace(folder, self.device)
        except Exception as exc:
            shutil.rmtree(folder, ignore_errors=True)
            self._finish(capture, "failed", f"the profiler did not start: {exc}")
            return
        log.info(
            "profile capture #%d: recording %d steps from step %d with %s",
            capture.id, capture.steps, step + 1, trace.tool,
        )  # fmt: skip
        self._recording = (capture, trace, folder, step)
        self._done_steps = 0

    def after_batch(self) -> None:
        if self._recording is None or not self.training_batch():
            return
        self._done_steps += 1
        if self._done_steps >= self._recording[0].steps:
            self._stop_recording("")

    def _stop_recording(self, note: str) -> None:
        assert self._recording is not None
        capture, trace, folder, first = self._recording
        self._recording = None
        last = first + self._done_steps - 1
        try:
            trace.stop()
        except Exception as exc:
            shutil.rmtree(folder, ignore_errors=True)
            self._finish(capture, "failed", f"the profiler did not write its trace: {exc}")
            return
        upload = threading.Thread(
            target=self._store,
            args=(capture, trace.tool, folder, first, last, note),
            name=f"profile-upload-{capture.id}",
            daemon=True,
        )
        upload.start()
        self._uploads.append(upload)

    def _store(
        self, capture: Capture, tool: str, folder: Path, first: int, last: int, note: str
    ) -> None:
        steps = f"steps {first + 1}–{last + 1}"
        archive = folder.with_name(f"job{self.job_id}-profile-{capture.id}.zip")
        try:
            if zip_folder(folder, archive) == 0:
                raise RuntimeError(f"{tool} wrote no file")
            self.publish(PROFILE_KIND, archive)
        except Exception as exc:
            self._finish(capture, "failed", f"{steps} recorded, but not stored: {exc}")
            return
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            archive.unlink(missing_ok=True)
        message = f"{steps} recorded with {tool}" + (f"; {note}" if note else "")
        self._finish(capture, "stored", message, first=first, last=last, tool=tool)
        log.info("profile capture #%d stored: %s", capture.id, message)

    def _finish(
        self,
        capture: Capture,
        status: str,
        message: str,
        first: int | None = None,
        last: int | None = None,
        tool: str = "",
    ) -> None:
        try:
            finish_capture(
                self.engine, capture.id, status, message,
                first_step=first, last_step=last, tool=tool,
            )  # fmt: skip
        except Exception as exc:
            log.warning("profile capture #%d: cannot record its end: %s", capture.id, exc)
        if status == "failed":
            log.warning("profile capture #%d failed: %s", capture.id, message)

    # --- the end of a fit, and of the job ---------------------------------------------------

    def after_fit(self) -> None:
        """A fit that ends while recording (its last epoch came first) keeps what it recorded.
        A request not yet started waits for the next fit (fine_tune's second phase)."""
        if self.active and self._recording is not None:
            wanted = self._recording[0].steps
            self._stop_recording(
                f"the fit ended after {self._done_steps} of the {wanted} steps asked"
            )

    def close(self, why: str = "the job's training ended first") -> None:
        """At the job's end: stop polling, store any recording, wait for the uploads, and end
        the captures still open as failed, saying why."""
        self._stop_polling.set()
        if self._poller is not None:
            self._poller.join()
            self._poller = None
        if self._recording is not None:
            wanted = self._recording[0].steps
            self._stop_recording(f"{why}, after {self._done_steps} of the {wanted} steps asked")
        for upload in self._uploads:
            upload.join()
        self._uploads = []
        with self._lock:
            self._pending = None
        try:
            fail_open_captures(self.engine, self.job_id, f"not recorded: {why}")
        except Exception as exc:
            log.warning("profile captures: cannot close the open ones: %s", exc)

"""The fastai callbacks traindeck adds to a Learner.

None of them makes the device compute or copy anything the run would not anyway: on XLA a
`.item()` or `.cpu()` forces a sync, so values are taken where fastai already moved them to
the host (its smoothed loss, its epoch log) or are plain Python numbers (the learning rate).
On XLA fastai's per-batch values stay on the device and reach the host in chunks
(`worker.device_values`): the telemetry and the divergence check take each step's values from
those chunks, a few steps late, instead of from fastai's Recorder at every batch.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from fastai.callback.core import Callback, CancelFitException
from fastai.callback.schedule import LRFinder
from torch import nn

from db.telemetry import BATCH, EPOCH, MetricPoint
from worker import device_values
from worker.device_values import StepValue
from worker.failpoints import LR_FIND_TMP_SAVED, VALIDATION_STARTED, failpoint
from worker.layer_forward import override_forward, restore_forward
from worker.reporter import Progress, TelemetryWriter

log = logging.getLogger("worker.training")

# fastai's epoch-log column names → traindeck's metric names (the `epoch/` prefix is added).
EPOCH_COLUMN_NAMES = {"top_k_accuracy": "top5_accuracy"}


def in_lr_find(learn: Any) -> bool:
    return any(isinstance(cb, LRFinder) for cb in learn.cbs)


class RawLossTracker:
    """Recovers each batch's raw training loss from fastai's smoothed loss, on the host.

    fastai's Recorder keeps `val = lerp(loss, val, beta)`, i.e. val_t = beta·val_(t-1) +
    (1-beta)·loss_t, with the batch loss already copied to the CPU. Inverting that gives
    loss_t exactly, without a second device→host copy of the loss (a sync on XLA).
    """

    def __init__(self) -> None:
        self._previous = 0.0

    def raw_loss(self, smooth_loss: Any) -> float:
        if smooth_loss.count <= 1:
            self._previous = 0.0
        current = float(smooth_loss.val)
        beta = smooth_loss.beta
        raw = (current - beta * self._previous) / (1.0 - beta)
        self._previous = current
        return raw


class TrainingClock:
    """Global epoch/step numbering across the phases of a schedule (fine_tune has two)."""

    def __init__(self, total_epochs: int, steps_per_epoch: int):
        self.total_epochs = total_epochs
        self.steps_per_epoch = steps_per_epoch
        self.epoch_offset = 0

    @property
    def total_steps(self) -> int:
        return self.total_epochs * self.steps_per_epoch

    def global_epoch(self, fit_epoch: int) -> int:
        return self.epoch_offset + fit_epoch

    def global_step(self, fit_epoch: int, iteration: int) -> int:
        return self.global_epoch(fit_epoch) * self.steps_per_epoch + iteration


class TrainedEpochCallback(Callback):
    """Base for callbacks that act only on epochs really trained (not lr_find, not skipped)."""

    def before_fit(self) -> None:
        self.active = not in_lr_find(self.learn)

    def before_epoch(self) -> None:
        # fastai's SkipToEpoch (a resumed fit) cancels skipped epochs in before_epoch, after
        # which after_epoch still runs; before_train only runs for epochs that really train.
        self.trained = False

    def before_train(self) -> None:
        self.trained = True

    def acting(self) -> bool:
        return self.active and getattr(self, "trained", False)

    def training_batch(self) -> bool:
        """In after_batch: a training batch with data, outside lr_find."""
        return self.active and self.training and len(self.yb) > 0


class TelemetryCallback(TrainedEpochCallback):
    """Per-batch train loss and lr, per-epoch losses/metrics/time/throughput, and progress."""

    order = 60  # after fastai's Recorder (50), which computes the smoothed loss and the log

    def __init__(self, writer: TelemetryWriter, clock: TrainingClock, device_label: str):
        self.writer = writer
        self.clock = clock
        self.device_label = device_label
        self.raw_loss = RawLossTracker()
        self._points: list[MetricPoint] = []
        self._run_started = time.perf_counter()
        self._steps_done_in_run = 0

    def before_fit(self) -> None:
        super().before_fit()
        # On XLA each step's loss arrives with its chunk (`_add_steps`), after the step.
        feed = device_values.feed(self.learn) if self.active else None
        self.deferred = feed is not None
        if feed is not None:
            feed.listen(self._add_steps)

    def before_epoch(self) -> None:
        super().before_epoch()
        self._epoch_started = time.perf_counter()
        self._train_seconds = 0.0
        self._train_items = 0

    def before_train(self) -> None:
        super().before_train()
        self._train_started = time.perf_counter()

    def after_train(self) -> None:
        self._train_seconds = time.perf_counter() - self._train_started
        # The epoch's last batches reach the dashboard while validation runs (on XLA those
        # read so far; the rest arrive with the validation's values).
        self.writer.add_points(self._points)
        self._points = []
        self.writer.request_flush()

    def after_batch(self) -> None:
        if not self.training_batch():
            return
        step = self.clock.global_step(self.epoch, self.iter)
        epoch = self.clock.global_epoch(self.epoch)
        if not self.deferred:
            recorder = self.learn.recorder
            loss = self.raw_loss.raw_loss(recorder.smooth_loss)
            smooth = float(recorder.losses[-1])
            lr = float(recorder.lrs[-1])
            self._add_steps([StepValue(self.epoch, self.iter, loss, smooth, lr, time.time())])
        self._train_items += len(self.yb[0])
        self._steps_done_in_run += 1
        self.writer.set_progress(self._progress(epoch, step + 1))

    def _add_steps(self, values: list[StepValue]) -> None:
        """Each step's loss and lr as points, handed to the writer 64 at a time."""
        for value in values:
            step = self.clock.global_step(value.epoch, value.iteration)
            epoch = self.clock.global_epoch(value.epoch)
            self._points.append(
                MetricPoint(BATCH + "train_loss", step, value.loss, epoch, value.time)
            )
            self._points.append(MetricPoint(BATCH + "lr", step, value.lr, epoch, value.time))
        if len(self._points) >= 64:
            self.writer.add_points(self._points)
            self._points = []

    def after_epoch(self) -> None:
        if not self.acting():
            return
        epoch = self.clock.global_epoch(self.epoch)
        now = time.time()
        values = self.learn.recorder.log
        names = self.learn.recorder.metric_names
        for name, value in zip(names[1:], values[1:], strict=False):
            if name == "time" or value is None:
                continue
            metric = EPOCH_COLUMN_NAMES.get(name, name)
            self._points.append(MetricPoint(EPOCH + metric, epoch, float(value), epoch, now))
        seconds = time.perf_counter() - self._epoch_started
        self._points.append(MetricPoint(EPOCH + "time_s", epoch, seconds, epoch, now))
        if self._train_seconds > 0:
            rate = self._train_items / self._train_seconds
            self._points.append(MetricPoint(EPOCH + "images_per_s", epoch, rate, epoch, now))
        if self.dls.device.type == "cuda":
            peak_mb = torch.cuda.max_memory_allocated(self.dls.device) / 2**20
            self._points.append(
                MetricPoint(EPOCH + "cuda_max_memory_mb", epoch, peak_mb, epoch, now)
            )
        self.writer.add_points(self._points)
        self._points = []
        step = (epoch + 1) * self.clock.steps_per_epoch
        self.writer.set_progress(self._progress(epoch + 1, step))
        log.info("%s", self._epoch_line(epoch, names, values, seconds))
        self.writer.request_flush()

    def after_fit(self) -> None:
        if self._points:
            self.writer.add_points(self._points)
            self._points = []

    def _progress(self, epochs_done_or_current: int, step: int) -> Progress:
        elapsed = time.perf_counter() - self._run_started
        remaining = self.clock.total_steps - step
        eta = None
        if self._steps_done_in_run >= 5 and remaining >= 0:
            eta = elapsed / self._steps_done_in_run * remaining
        return Progress(
            epoch=epochs_done_or_current,
            step=step,
            total_epochs=self.clock.total_epochs,
            total_steps=self.clock.total_steps,
            eta_seconds=eta,
            device=self.device_label,
        )

    def _epoch_line(self, epoch: int, names: list[str], values: list[Any], seconds: float) -> str:
        parts = [f"epoch {epoch + 1}/{self.clock.total_epochs}"]
        for name, value in zip(names[1:], values[1:], strict=False):
            if name != "time" and value is not None:
                parts.append(f"{EPOCH_COLUMN_NAMES.get(name, name)} {float(value):.4f}")
        parts.append(f"{seconds:.1f} s")
        return ", ".join(parts)


class DivergenceCallback(TrainedEpochCallback):
    """Ends the fit when the loss stops being a number (NaN or infinite): training diverged.

    Once a weight is NaN every later step is NaN too, so going on only burns the device and
    overwrites a good checkpoint with a broken one. It reads values fastai already holds on
    the host (the smoothed training loss, which stays NaN from the first NaN batch on, and the
    epoch log), so it costs no device sync; on XLA the smoothed losses as their chunks arrive
    (`worker.device_values`), so the fit stops a few steps after the first bad one, and at the
    latest at the end of its epoch, when every step has been read. It runs after the telemetry
    (the curve up to the divergence is kept) and before the epoch's checkpoint, so the last
    good checkpoint stays. The reason is kept in `diverged` for the caller to fail the job with.
    """

    order = 85

    def __init__(self, clock: TrainingClock):
        self.clock = clock
        self.diverged: str | None = None

    def before_fit(self) -> None:
        super().before_fit()
        self._bad_step: StepValue | None = None
        feed = device_values.feed(self.learn) if self.active else None
        self.deferred = feed is not None
        if feed is not None:
            feed.listen(self._watch)

    def _watch(self, values: list[StepValue]) -> None:
        if self._bad_step is None:
            self._bad_step = next((v for v in values if not math.isfinite(v.smooth_loss)), None)

    def after_batch(self) -> None:
        if not self.training_batch():
            return
        if self.deferred:
            self._stop_if_a_step_went_bad()
            return
        loss = float(self.learn.recorder.smooth_loss.val)
        if not math.isfinite(loss):
            step = self.clock.global_step(self.epoch, self.iter)
            self._stop(f"the training loss became {loss} at step {step + 1}")

    def _stop_if_a_step_went_bad(self) -> None:
        bad = self._bad_step
        if bad is not None:
            step = self.clock.global_step(bad.epoch, bad.iteration)
            self._stop(
                f"the training loss became {bad.smooth_loss} at step {step + 1}",
                self.clock.global_epoch(bad.epoch),
                bad.lr,
            )

    def after_epoch(self) -> None:
        if not self.acting():
            return
        if self.deferred:
            self._stop_if_a_step_went_bad()
        names = self.learn.recorder.metric_names
        for name, value in zip(names[1:], self.learn.recorder.log[1:], strict=False):
            if name not in ("train_loss", "valid_loss") or value is None:
                continue
            if not math.isfinite(float(value)):
                self._stop(f"the {name.replace('_', ' ')} became {float(value)}")

    def _stop(self, what: str, epoch: int | None = None, lr: float | None = None) -> None:
        if epoch is None:
            epoch = self.clock.global_epoch(self.epoch)
        if lr is None:
            lr = float(self.learn.recorder.lrs[-1]) if self.learn.recorder.lrs else float("nan")
        kept = f"the checkpoint of epoch {epoch} is kept" if epoch > 0 else "nothing was saved"
        self.diverged = (
            f"training diverged: {what} in epoch {epoch + 1}/{self.clock.total_epochs} "
            f"(learning rate {lr:.3g}); {kept}. Try a lower learning rate (or lr find) or "
            "gradient clipping (grad_clip)."
        )
        raise CancelFitException()


class XlaStepCallback(Callback):
    """One `torch_xla.sync()` per batch: cuts the lazy graph so each step compiles once.

    It runs before fastai's Recorder (order 50) reads the loss, so the step's whole graph
    (forward, backward, optimizer update) executes as one computation, and right after
    `DeviceValuesCallback` (order -21) adds the batch's loss and metrics to it.

    Before the sync it collects Python's garbage. fastai's batch transforms leave reference
    cycles behind (the tracebacks of the type-dispatch misses in fasttransform hold the batch),
    and XLA counts a tensor as live until its Python object is freed: a sync makes every live
    tensor with pending work an output of the step's graph. Collecting the young generations
    only was not enough: a cycle that an automatic collection found still in use was moved to
    the oldest generation, and the next sync then had IntToFloatTensor's intermediate tensors
    as two more outputs, a new validation graph in epoch 2 or 3 (seen on the recipe). So every
    sync follows a full collection, kept cheap by freezing what exists at each epoch's start
    (`gc.freeze`: the collection skips it), and the fit's end unfreezes it.

    While the fit runs, Python's automatic collections are off: these collections are the
    only ones. CPython (3.11) returns from `gc.collect()` at once, collecting nothing, while a
    collection is in progress in another thread, and an automatic one in the prefetch thread
    is in progress for as long as a finalizer it runs has let go of the GIL. On a loaded
    machine that happened now and then, and the step's sync took the batch transforms'
    intermediate tensors in as extra outputs: a new validation graph after the first epoch.
    """

    order = -20

    def before_fit(self) -> None:
        self.collecting_automatically = gc.isenabled()
        gc.disable()

    def before_epoch(self) -> None:
        gc.collect()
        gc.freeze()

    def after_batch(self) -> None:
        import torch_xla

        gc.collect()
        torch_xla.sync()

    def after_fit(self) -> None:
        gc.unfreeze()
        if getattr(self, "collecting_automatically", False):
            gc.enable()


class XlaReportCallback(TrainedEpochCallback):
    """At every epoch end: the XLA metrics summary and raw report, and warnings about them."""

    order = 65

    def __init__(
        self,
        writer: TelemetryWriter,
        clock: TrainingClock,
        cache_dir: str = "",
        kept: dict[str, int] | None = None,
    ):
        self.writer = writer
        self.clock = clock
        self.cache_dir = cache_dir or "the data folder"
        self.kept = kept or {}  # graphs kept from the process's previous job (training.py)
        self.previous: dict[str, Any] | None = None
        self.first_epoch_reported: int | None = None

    def after_epoch(self) -> None:
        if not self.acting():
            return
        from worker import xla_report

        epoch = self.clock.global_epoch(self.epoch)
        summary = {**xla_report.read_summary(), **self.kept}
        self.writer.add_xla_report(epoch, summary, xla_report.read_raw_report())
        if self.first_epoch_reported is None:
            self.first_epoch_reported = epoch
        # A phase of fine_tune (a fit of its own) unfreezes the body: new graphs at its start.
        graphs_since = max(self.first_epoch_reported, self.clock.global_epoch(0))
        warm_up = epoch == graphs_since
        if warning := xla_report.compile_growth_warning(epoch, warm_up, self.previous, summary):
            log.warning("%s", warning)
        if warning := xla_report.cache_load_failure_warning(self.previous, summary, self.cache_dir):
            log.warning("%s", warning)
        fallbacks = xla_report.new_fallbacks(self.previous, summary)
        if fallbacks:
            listed = ", ".join(f"aten::{op} ×{count}" for op, count in sorted(fallbacks.items()))
            log.warning(
                "ops fell back to the CPU (each one copies tensors device→host→device): %s", listed
            )
        self.previous = summary


def conv_in_fp32_on_one_pixel(module: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """A strided convolution, in float32 when its input is a single pixel.

    On the CPU, oneDNN's bf16 convolution backward leaves part of the weight gradient
    unwritten when a strided 3×3 convolution with padding sees a 1×1 input (torch 2.9: the
    padding-only taps of the kernel come back as whatever the memory held, NaN or 1e37 in 1 of
    10 draws, measured against the float32 gradient). resnet18 at 16 px feeds layer4 exactly
    that; bf16 jobs on a CPU worker then diverged or ended near chance. One pixel costs
    nothing in float32.
    """
    if x.shape[-2:] == (1, 1):
        with torch.autocast("cpu", enabled=False):
            return type(module).forward(module, x.float())
    return type(module).forward(module, x)


def _strided_convolution(module: nn.Module) -> bool:
    return isinstance(module, nn.Conv2d) and max(module.stride) > 1


class AutocastCallback(Callback):
    """bf16 autocast around the forward pass and the loss (XLA, CUDA or CPU); no loss scaling.

    On the CPU, strided convolutions compute a one-pixel input in float32 while the fit runs
    (`conv_in_fp32_on_one_pixel` says why); the layers keep their class, and nothing of it
    is pickled into the export.
    """

    order = 10

    def __init__(self, device_type: str):
        self.device_type = device_type
        self.patched: list[nn.Module] = []

    def before_fit(self) -> None:
        if self.device_type == "cpu":
            self.patched = override_forward(
                self.learn.model, _strided_convolution, conv_in_fp32_on_one_pixel
            )

    def after_fit(self) -> None:
        restore_forward(self.patched)
        self.patched = []

    def before_batch(self) -> None:
        self._autocast = torch.autocast(self.device_type, dtype=torch.bfloat16)
        self._autocast.__enter__()
        self._inside = True

    def after_loss(self) -> None:
        self._leave()

    def after_cancel_batch(self) -> None:
        self._leave()

    def _leave(self) -> None:
        if getattr(self, "_inside", False):
            self._autocast.__exit__(None, None, None)
            self._inside = False


class StopCallback(Callback):
    """Ends the fit at the next batch when a stop was asked for (cancel, shutdown, time
    limit) or when the supervisor that started this process is gone."""

    order = 100
    run_valid = True

    def __init__(self, stop: threading.Event, parent_pid: int | None):
        self.stop = stop
        self.parent_pid = parent_pid

    def _check(self) -> None:
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            self.stop.set()
        if self.stop.is_set():
            raise CancelFitException()

    def before_batch(self) -> None:
        self._check()

    def after_batch(self) -> None:
        self._check()


class EpochEndCallback(TrainedEpochCallback):
    """Calls `on_epoch_end(global_epoch)` after each trained epoch (checkpointing).

    `on_epoch_end` ends the fit by raising fastai's `CancelFitException` (an early stop, a
    pruned trial: after the epoch's checkpoint). Any other error there ends the fit too and is
    kept in `failure` for the caller to raise: fastai would otherwise rewrite its message
    ("Exception occured in …") on the way out.
    """

    order = 90

    def __init__(self, clock: TrainingClock, on_epoch_end: Callable[[int], None]):
        self.clock = clock
        self.on_epoch_end = on_epoch_end
        self.failure: Exception | None = None

    def after_epoch(self) -> None:
        if not self.acting():
            return
        try:
            self.on_epoch_end(self.clock.global_epoch(self.epoch))
        except CancelFitException:
            raise
        except Exception as exc:
            self.failure = exc
            raise CancelFitException() from exc


class FailpointCallback(Callback):
    """The failpoints inside a fit (see worker.failpoints), added only when a test armed one:
    fastai's loop has no other place to name these moments."""

    order = 95  # before StopCallback: a cancel sent while stopped here ends the fit at once

    def before_batch(self) -> None:
        if in_lr_find(self.learn):
            failpoint(LR_FIND_TMP_SAVED)
        elif not self.training and self.iter == 0:  # once per validation pass
            failpoint(VALIDATION_STARTED)

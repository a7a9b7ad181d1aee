"""On XLA the values fastai reads every batch stay on the device, and the host reads them in
chunks, a few steps late, without waiting for a step.

`torch_xla.sync()` dispatches a step's graph and returns, so the host can trace step N+1 while
the device runs step N. fastai ends that overlap in every batch: its Recorder's smoothed loss
copies the loss to the host (`to_detach(learn.loss.mean())`), and each `AvgLoss` and
`AvgMetric` copies its batch value, each copy a wait for the device and a device→host transfer.
On XLA, during a fit (lr_find aside), `DeviceValuesCallback`:

- keeps each training step's loss tensor (already an output of the step's graph: nothing more
  to compute) and every `read_every` steps hands the newest ones to an asynchronous step
  closure, which copies them to the host in one transfer on torch_xla's closure thread once
  the step has run, while the training thread goes on tracing;
- adds each batch's loss and metric values to running sums on the device, inside the batch's
  own graph (validation, and training when the Recorder keeps training metrics);
- at the end of the validation pass (else of the epoch, or of the fit) reads what is left, the
  last training losses and the sums, in one transfer.

fastai's Recorder itself is unchanged. For the fit its smoothed loss, its `AvgLoss` and the
Learner's `AvgMetric`s are replaced by stand-ins whose `accumulate` does nothing (the value
was captured before the batch's sync) and whose `value` is worked out on the host, with
fastai's own arithmetic, from the values read; the originals come back after the fit. So at
the end of each epoch `recorder.losses`, `values`, `iters` and the epoch log hold what fastai's
own path gives. In between, `learn.smooth_loss` and the newest entries of `recorder.losses`
hold the newest smoothed loss known until their chunk arrives.

Listeners (`listen`) get every training step's values once they are on the host, in step
order, on the training thread: traindeck's telemetry and divergence check read them there.

Left to fastai: lr_find (its LRFinder compares every step's smoothed loss to stop early), and
metrics other than fastai's averages (an `AccumMetric`, a custom `Metric`), which read the host
as they always did. Needs the step's sync right after its `after_batch`
(`worker.callbacks.XlaStepCallback`, order -20): what it captures joins that step's graph.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from fastai.callback.core import Callback
from fastai.callback.schedule import LRFinder
from fastai.learner import AvgLoss, AvgMetric, Metric
from fastai.torch_core import find_bs

from common import config

log = logging.getLogger(__name__)

# A read that has not arrived after this long: any step closure not yet dispatched is
# dispatched by a sync (there is always one after a capture; this is a safety net).
_NUDGE_S = 5.0


@dataclass(frozen=True)
class StepValue:
    """One training step's values, on the host."""

    epoch: int  # the fit's epoch (fastai's learn.epoch)
    iteration: int  # the batch within it (learn.iter)
    loss: float  # the batch's loss, as fastai's Recorder reads it (learn.loss.mean())
    smooth_loss: float  # fastai's smoothed loss after this batch: what recorder.losses holds
    lr: float  # the learning rate of the step (recorder.lrs)
    time: float  # when the step ran (time.time())


Listener = Callable[[list[StepValue]], None]


def read_to_host(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copy XLA tensors to the host in one device→host transfer (`.cpu()` makes one each).

    The tensors must be device data (computed by a graph already dispatched): the call waits
    for that computation to finish, nothing more."""
    import torch_xla

    return list(torch_xla._XLAC._xla_get_cpu_tensors(tensors))


def _maybe_item(metric: Any) -> Any:
    """What fastai's Recorder writes in its log for a metric (`fastai.learner._maybe_item`)."""
    value = metric.value
    try:
        return value.item()
    except Exception:
        return value


class HostSmoothLoss(Metric):
    """fastai's AvgSmoothLoss (same state, same arithmetic), fed with losses read from the
    device in chunks instead of one copy per batch."""

    def __init__(self, beta: float = 0.98):
        self.beta = beta
        self.reset()

    def reset(self) -> None:
        self.count, self.val = 0, torch.tensor(0.0)

    def accumulate(self, learn: Any) -> None:
        return None  # `add` does it, once the batch's loss is on the host

    def add(self, loss: torch.Tensor) -> torch.Tensor:
        self.count += 1
        self.val = torch.lerp(loss, self.val, self.beta)
        return self.value

    @property
    def value(self) -> torch.Tensor:
        return self.val / (1 - self.beta**self.count)


class DeviceAverage(Metric):
    """fastai's AvgMetric or AvgLoss with its running sum on the device, read once per pass.

    `capture` adds a batch (before the batch's sync, so the sum is part of its graph); the
    sum comes to the host through `take`, and `value` is then total / count as fastai's."""

    def __init__(self, original: Metric):
        self.original = original
        self.reset()

    def reset(self) -> None:
        self.total: torch.Tensor | None = None  # on the device
        self.count = 0
        self.host_total: torch.Tensor | None = None
        self.unread = False

    def accumulate(self, learn: Any) -> None:
        return None  # `capture` did it, before the batch's sync

    def batch_value(self, learn: Any) -> torch.Tensor:
        if isinstance(self.original, AvgLoss):
            return learn.loss.mean()
        return self.original.func(learn.pred, *learn.yb)

    def capture(self, learn: Any) -> None:
        bs = find_bs(learn.yb)
        value = self.batch_value(learn).detach()
        if self.total is None:
            # A zero copied from the host: every batch's graph then has the same shape.
            self.total = torch.zeros((), dtype=value.dtype).to(value.device)
        self.total = self.total + value * bs
        self.count += bs
        self.unread = True

    def take(self, host_total: torch.Tensor) -> None:
        self.host_total = host_total
        self.unread = False

    @property
    def value(self) -> torch.Tensor | None:
        if self.count == 0 or self.host_total is None:
            return None
        return self.host_total / self.count

    @property
    def name(self) -> str:
        return self.original.name


@dataclass
class _Captured:
    epoch: int
    iteration: int
    index: int  # where the Recorder puts this step's smoothed loss in `recorder.losses`
    lr: float
    time: float
    loss: torch.Tensor  # on the device


@dataclass
class _TrainLog:
    """Where the Recorder logged a training pass, and the sums it logged (read later)."""

    start: int
    metrics: list[tuple[Any, torch.Tensor | None, int]]


class DeviceValuesCallback(Callback):
    """Keeps the Recorder's per-batch values on the XLA device; reads them in chunks."""

    order = -21  # after_batch before XlaStepCallback's sync (-20): captures join the step

    def __init__(self, read_every: int | None = None):
        if read_every is None:
            read_every = config.xla_read_every()  # TRAINDECK_XLA_READ_EVERY, 10 by default
        if read_every < 1:
            raise ValueError(f"read_every must be at least 1, not {read_every}")
        self.read_every = read_every
        self.active = False
        self.listeners: list[Listener] = []
        self._saved: tuple[Any, Any, Any] | None = None
        self._arrived: queue.SimpleQueue[tuple[list[_Captured], Any]] = queue.SimpleQueue()
        self._in_flight = 0
        self._pending: list[_Captured] = []
        self._train_log: _TrainLog | None = None
        self.averages: list[DeviceAverage] = []

    def listen(self, listener: Listener) -> None:
        """Call `listener` with each chunk of training steps' values as it reaches the host."""
        self.listeners.append(listener)

    # --- the fit ---------------------------------------------------------------------------

    def before_fit(self) -> None:
        self._restore()  # a fit that ended in an error did not restore them
        self.listeners = []
        self._pending, self._train_log = [], None
        recorder = getattr(self.learn, "recorder", None)
        lr_find = any(isinstance(cb, LRFinder) for cb in self.learn.cbs)
        self.active = recorder is not None and not lr_find
        if self.active:
            self._install(recorder)

    def after_batch(self) -> None:
        if not self.active:
            return
        self._take_arrived(block=False)
        if len(self.yb) == 0:  # as the Recorder, which records nothing then
            return
        recorder = self.learn.recorder
        if self.training:
            self._capture_loss(recorder)
            mets = recorder._train_mets
        else:
            mets = recorder._valid_mets
        for metric in mets:
            if isinstance(metric, DeviceAverage):
                metric.capture(self.learn)

    def after_train(self) -> None:
        if not self.active:
            return
        # The Recorder logs the training pass next (order 50); its values are read later with
        # the validation's, and the log is put right then. Sums are kept: before_validate
        # resets the metrics that training and validation share.
        self._train_log = _TrainLog(
            len(self.learn.recorder.log),
            [
                (metric, metric.total, metric.count)
                if isinstance(metric, DeviceAverage)
                else (metric, None, 0)
                for metric in self.learn.recorder._train_mets
            ],
        )

    def after_validate(self) -> None:
        if self.active:
            self.settle()

    def after_epoch(self) -> None:
        if self.active:
            self.settle()

    def after_fit(self) -> None:
        if self.active:
            try:
                self.settle()
            finally:
                self._restore()
        self.active = False

    # --- reading ---------------------------------------------------------------------------

    def settle(self) -> None:
        """Bring everything still on the device to the host; waits for the device."""
        self._take_arrived(block=True)
        train_log, self._train_log = self._train_log, None
        pending, self._pending = self._pending, []
        unread = [average for average in self.averages if average.unread]
        logged = [] if train_log is None else [m for m in train_log.metrics if m[1] is not None]
        tensors = [step.loss for step in pending]
        tensors += [average.total for average in unread]  # type: ignore[misc]
        tensors += [total for _, total, _ in logged]  # type: ignore[misc]
        values = read_to_host(tensors) if tensors else []
        if pending:
            self._deliver(pending, values[: len(pending)])
        for average, total in zip(unread, values[len(pending) :], strict=False):
            average.take(total)
        if train_log is not None:
            totals = iter(values[len(pending) + len(unread) :])
            self._correct_train_log(train_log, totals)

    def _correct_train_log(self, train_log: _TrainLog, totals: Any) -> None:
        log_ = self.learn.recorder.log
        for offset, (metric, total, count) in enumerate(train_log.metrics):
            value: Any = None
            if metric is self.smooth:
                value = _maybe_item(metric)
            elif total is not None:
                value = (next(totals) / count).item() if count else None
            else:
                continue  # not ours: the Recorder logged its own value
            if train_log.start + offset < len(log_):
                log_[train_log.start + offset] = value

    def _capture_loss(self, recorder: Any) -> None:
        loss = self.learn.loss
        loss = (loss if loss.dim() == 0 else loss.mean()).detach()
        lr = float(self.learn.opt.hypers[-1]["lr"])
        index = len(recorder.losses)  # the Recorder appends this step's entry next
        self._pending.append(_Captured(self.epoch, self.iter, index, lr, time.time(), loss))
        if len(self._pending) >= self.read_every:
            import torch_xla.core.xla_model as xm

            chunk, self._pending = self._pending, []
            self._in_flight += 1
            # Run after the step's sync, when the losses are outputs of dispatched graphs.
            xm.add_step_closure(self._read_chunk, args=(chunk,), run_async=True)

    def _read_chunk(self, chunk: list[_Captured]) -> None:
        """On torch_xla's closure thread: wait for the steps, copy their losses to the host."""
        try:
            result: Any = read_to_host([step.loss for step in chunk])
        except BaseException as exc:  # raised on the training thread when it takes the chunk
            result = exc
        self._arrived.put((chunk, result))

    def _take_arrived(self, block: bool) -> None:
        """Deliver the chunks that have arrived; with `block`, wait for every one in flight."""
        waited = 0.0
        while self._in_flight:
            try:
                chunk, result = self._arrived.get(block=block, timeout=_NUDGE_S if block else None)
            except queue.Empty:
                if not block:
                    return
                waited += _NUDGE_S
                log.debug("no step values after %.0f s: syncing to run the step closures", waited)
                import torch_xla

                torch_xla.sync()
                continue
            self._in_flight -= 1
            if isinstance(result, BaseException):
                raise RuntimeError("reading the training loss from the XLA device") from result
            self._deliver(chunk, result)

    def _deliver(self, chunk: list[_Captured], losses: list[torch.Tensor]) -> None:
        recorder = self.learn.recorder
        values = []
        for step, loss in zip(chunk, losses, strict=True):
            smooth = self.smooth.add(loss)
            if step.index < len(recorder.losses):
                recorder.losses[step.index] = smooth
            values.append(
                StepValue(
                    step.epoch, step.iteration, float(loss), float(smooth), step.lr, step.time
                )
            )
        self.learn.smooth_loss = self.smooth.value
        for listener in self.listeners:
            listener(values)

    # --- the stand-ins ---------------------------------------------------------------------

    def _install(self, recorder: Any) -> None:
        self._saved = (recorder.smooth_loss, recorder.loss, self.learn.metrics)
        self.smooth = HostSmoothLoss(recorder.smooth_loss.beta)
        recorder.smooth_loss = self.smooth
        self.averages = []
        if type(recorder.loss) is AvgLoss:
            recorder.loss = DeviceAverage(recorder.loss)
            self.averages.append(recorder.loss)
        metrics = []
        for metric in self.learn.metrics:
            if type(metric) is AvgMetric:
                metric = DeviceAverage(metric)
                self.averages.append(metric)
            metrics.append(metric)
        self.learn.metrics = metrics

    def _restore(self) -> None:
        """Put fastai's own objects back, holding the values the stand-ins ended with."""
        if self._saved is None:
            return
        smooth, loss, metrics = self._saved
        self._saved = None
        smooth.count, smooth.val = self.smooth.count, self.smooth.val
        for average in self.averages:
            average.original.total = average.host_total if average.host_total is not None else 0.0
            average.original.count = average.count if average.host_total is not None else 0
        recorder = self.learn.recorder
        recorder.smooth_loss, recorder.loss = smooth, loss
        self.learn.metrics = metrics
        self.averages = []


def feed(learn: Any) -> DeviceValuesCallback | None:
    """The Learner's DeviceValuesCallback when it is active in the fit under way, else None."""
    for callback in learn.cbs:
        if isinstance(callback, DeviceValuesCallback) and callback.active:
            return callback
    return None

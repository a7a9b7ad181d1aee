"""How much of each training step waits for its input, on every device.

The training loop asks its DataLoader for the next batch, then runs the step. Time spent in
that ask is time the step waits for data: the host loading and decoding images
(fastai's DataLoader, its workers, the item transforms), or, on XLA, the prefetch queue being
empty (`worker.prefetch.DevicePrefetcher`, which loads ahead in a thread and counts its own
wait). `InputWaitCallback` wraps each training pass's DataLoader in a `TimedLoader` (on XLA it
reads the prefetcher's count instead) and, after the pass, stores the share of the pass spent
waiting as the epoch metric `epoch/input_wait_share` (0 to 1).

Past half of a pass the job's log says the job is input-bound (once per job; an `input_bound`
alert follows that line, `db.alerts`), and the job page's Diagnostics tab says what to change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from db.telemetry import INPUT_BOUND_SHARE, INPUT_WAIT_SHARE, MetricPoint
from worker.callbacks import TrainedEpochCallback, TrainingClock
from worker.prefetch import WrappedLoader
from worker.reporter import TelemetryWriter

log = logging.getLogger("worker.training")


class TimedLoader(WrappedLoader):
    """Iterates a DataLoader, adding up in `waited_s` the time each next batch took to come."""

    def __iter__(self) -> Iterator[Any]:
        batches = iter(self.dl)
        try:
            while True:
                started = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                self.waited_s += time.perf_counter() - started
                yield batch
        finally:
            close = getattr(batches, "close", None)
            if close is not None:  # a pass left early (CancelFitException) stops its loader
                close()


def input_bound_warning(epoch: int, waited_s: float, pass_s: float) -> str | None:
    """The job's log line when the training loop waited for its input more than
    INPUT_BOUND_SHARE of a training pass (`epoch` counted from 0), else None."""
    if pass_s <= 0 or waited_s <= INPUT_BOUND_SHARE * pass_s:
        return None
    return (
        f"input-bound: training waited for its input {waited_s / pass_s:.0%} of epoch "
        f"{epoch + 1} ({waited_s:.1f} s of {pass_s:.1f} s): loading the images on the host "
        "cannot keep up with the device (more DataLoader workers with the worker's "
        "TRAINDECK_LOADER_WORKERS, smaller images or a lighter item_tfms help)"
    )


class InputWaitCallback(TrainedEpochCallback):
    """After each trained epoch's training pass: `epoch/input_wait_share`, and the log line
    once when the pass waited for its input more than it computed."""

    # After PrefetchCallback (-30), which puts its prefetcher in place in before_train: the
    # prefetcher counts its own wait (the queue empty); any other DataLoader is wrapped here.
    order = -25

    def __init__(self, writer: TelemetryWriter, clock: TrainingClock):
        self.writer = writer
        self.clock = clock
        self._told = False
        self._timed: Any = None

    def before_train(self) -> None:
        super().before_train()
        if not self.active:
            return
        dl = self.learn.dl
        if not hasattr(dl, "waited_s"):
            dl = self.learn.dl = TimedLoader(dl)
        self._timed = dl
        self._waited_before = dl.waited_s
        self._started = time.perf_counter()

    def after_train(self) -> None:
        if not self.acting() or self._timed is None:
            return
        pass_s = time.perf_counter() - self._started
        waited_s = self._timed.waited_s - self._waited_before
        self._timed = None
        if pass_s <= 0:
            return
        epoch = self.clock.global_epoch(self.epoch)
        share = min(1.0, waited_s / pass_s)
        self.writer.add_points([MetricPoint(INPUT_WAIT_SHARE, epoch, share, epoch, time.time())])
        warning = input_bound_warning(epoch, waited_s, pass_s)
        if warning and not self._told:
            self._told = True
            log.warning("%s", warning)

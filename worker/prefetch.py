"""Overlap host-side loading with device compute: an `MpDeviceLoader` for fastai's DataLoader.

fastai's DataLoader loads each batch on the host (decode, resize, collate), copies it to the
device and applies the batch transforms there, all in the training loop's thread, so the
device waits while the host loads. `DevicePrefetcher` does the host part and the copy in a
background thread, a few batches ahead, while the training thread runs the current step. It
leaves the batch transforms (to float, normalisation, augmentation) to the training thread: on
XLA they are traced into the step's graph, and tracing in two threads would mix their graphs.

A batch transform may also want inputs made on the host for each batch (the XLA augmentation
draws its random parameters there, `worker.augment`): one with a `host_inputs(batch, place)`
method gets called in the loading thread with each host batch, its result copied to the
device(s) like the batch, and handed back through `receive` just before the training thread
applies the batch transforms to that batch.

Only the copy runs in the loading thread, as XLA tensors born holding their data
(`worker.spmd.send_to_device`): the training thread's `torch_xla.sync()` takes every live XLA
tensor into its graph, so a tensor still being made or changed in another thread would join it
half-made. `place` may hand back plain tensors: the training thread gives each batch fastai's
types again (TensorImage, TensorCategory) before the batch transforms.

fastai's Learner still drives the loop: `PrefetchCallback` swaps the Learner's current
DataLoader for a prefetching view of it at the start of each training and validation pass.
After each training pass it measures how much of the pass the training thread spent waiting
for a batch; past half of it, the job's log says the job is input-bound (once per job, which
is also what an `input_bound` alert follows, `db.alerts`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from fastai.callback.core import Callback
from fastai.data.core import TfmdDL
from fastai.torch_core import retain_types

log = logging.getLogger(__name__)
# Past this share of a training pass spent waiting for input, the device mostly idles.
INPUT_BOUND_SHARE = 0.5

PREFETCH_DEPTH = 3
_POLL_S = 0.1


class _End:
    """Put after the last batch."""


class _Loaded:
    """A batch on the device, with what the host-side transforms made for it, and the host
    batch it was copied from (its tensor types)."""

    def __init__(self, batch: Any, extras: list[Any], host: Any):
        self.batch = batch
        self.extras = extras
        self.host = host


def host_side_transforms(dl: TfmdDL) -> list[Any]:
    """The batch transforms that this pass applies and that want host inputs per batch."""
    pipeline = dl.after_batch
    split_idx = getattr(pipeline, "split_idx", None)
    return [
        tfm
        for tfm in getattr(pipeline, "fs", [])
        if hasattr(tfm, "host_inputs")
        and (getattr(tfm, "split_idx", None) is None or tfm.split_idx == split_idx)
    ]


class _Failed:
    """Carries an exception from the loading thread to the training thread."""

    def __init__(self, error: BaseException):
        self.error = error


class DevicePrefetcher:
    """Iterates a fastai `TfmdDL`, loading and copying `depth` batches ahead in a thread.

    Anything else is read from the wrapped DataLoader (`bs`, `device`, `n`, …), so fastai and
    its callbacks see the DataLoader they expect. `waited_s` adds up the time the training
    thread waited for a batch: near zero when loading keeps ahead of the device.
    """

    def __init__(self, dl: TfmdDL, place: Callable[[Any], Any], depth: int = PREFETCH_DEPTH):
        self.dl = dl
        self.place = place
        self.depth = depth
        self.waited_s = 0.0
        self.batches = 0

    def __len__(self) -> int:
        return len(self.dl)

    def __getattr__(self, name: str) -> Any:
        if name == "dl":  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.dl, name)

    def __iter__(self) -> Iterator[Any]:
        dl = self.dl
        # The same dataset, order and item transforms, but no device and no batch transforms:
        # it yields collated host batches. A new one per pass, as fastai reshuffles per pass.
        host = dl.new(device=None, after_batch=None)
        dl.before_iter()  # tells the shared batch transforms whether this is training data
        preparers = host_side_transforms(dl)
        ready: queue.Queue[Any] = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        loader = threading.Thread(
            target=self._load,
            args=(host, ready, stop, preparers),
            name="traindeck-prefetch",
            daemon=True,
        )
        loader.start()
        try:
            while True:
                started = time.perf_counter()
                item = ready.get()
                self.waited_s += time.perf_counter() - started
                if isinstance(item, _End):
                    break
                if isinstance(item, _Failed):
                    raise item.error
                self.batches += 1
                for tfm, extra in zip(preparers, item.extras, strict=True):
                    tfm.receive(extra)
                yield dl.after_batch(retain_types(item.batch, item.host))
            dl.after_iter()
        finally:
            stop.set()
            while loader.is_alive():  # empty the queue so a blocked put sees the stop
                try:
                    ready.get_nowait()
                except queue.Empty:
                    loader.join(_POLL_S)

    def _load(
        self, host: TfmdDL, ready: queue.Queue[Any], stop: threading.Event, preparers: list[Any]
    ) -> None:
        batches = iter(host)
        try:
            for batch in batches:
                extras = [tfm.host_inputs(batch, self.place) for tfm in preparers]
                loaded = _Loaded(self.place(batch), extras, batch)
                if stop.is_set() or not self._put(ready, loaded, stop):
                    return
            self._put(ready, _End(), stop)
        except BaseException as exc:  # surfaces in the training thread, with its traceback
            self._put(ready, _Failed(exc), stop)
        finally:
            batches.close()

    @staticmethod
    def _put(ready: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False


def input_bound_warning(epoch: int, waited_s: float, pass_s: float) -> str | None:
    """The job's log line when the training thread waited for its input more than
    INPUT_BOUND_SHARE of a training pass (`epoch` counted from 0), else None."""
    if pass_s <= 0 or waited_s <= INPUT_BOUND_SHARE * pass_s:
        return None
    return (
        f"input-bound: training waited for its input {waited_s / pass_s:.0%} of epoch "
        f"{epoch + 1} ({waited_s:.1f} s of {pass_s:.1f} s): loading the images on the host "
        "cannot keep up with the device (smaller images or more CPU cores for the loader help)"
    )


class PrefetchCallback(Callback):
    """Runs every training and validation pass of the Learner through a `DevicePrefetcher`,
    and tells once when a training pass waited for its input more than it computed."""

    order = -30

    def __init__(self, place: Callable[[Any], Any], depth: int = PREFETCH_DEPTH):
        self.place = place
        self.depth = depth
        self.prefetchers: list[DevicePrefetcher] = []
        self._pass_started = (0.0, 0.0)  # (perf_counter, waited_s) at the training pass's start
        self._told_input_bound = False

    def before_train(self) -> None:
        self._pass_started = (time.perf_counter(), self.waited_s)
        self._wrap()

    def after_train(self) -> None:
        started, waited_before = self._pass_started
        warning = input_bound_warning(
            self.epoch, self.waited_s - waited_before, time.perf_counter() - started
        )
        if warning and not self._told_input_bound:
            self._told_input_bound = True
            log.warning("%s", warning)

    def before_validate(self) -> None:
        self._wrap()

    def _wrap(self) -> None:
        dl = self.learn.dl
        if isinstance(dl, TfmdDL):
            prefetcher = DevicePrefetcher(dl, self.place, self.depth)
            self.learn.dl = prefetcher
            self.prefetchers.append(prefetcher)

    @property
    def waited_s(self) -> float:
        """Seconds the training thread waited for input, over every pass so far."""
        return sum(prefetcher.waited_s for prefetcher in self.prefetchers)

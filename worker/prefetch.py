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
The prefetcher counts how long the training thread waited for a batch (the queue empty):
`worker.input_wait` turns that into each epoch's share of waiting, as it does on every device.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from fastai.callback.core import Callback
from fastai.data.core import TfmdDL
from fastai.torch_core import retain_types

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


class WrappedLoader:
    """A DataLoader seen through a wrapper that iterates it its own way.

    Anything else is read from the wrapped DataLoader (`bs`, `device`, `n`, …), so fastai and
    its callbacks see the DataLoader they expect. `waited_s` adds up the time the training
    thread waited for a batch.
    """

    def __init__(self, dl: Any):
        self.dl = dl
        self.waited_s = 0.0

    def __len__(self) -> int:
        return len(self.dl)

    def __getattr__(self, name: str) -> Any:
        if name == "dl":  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.dl, name)


class DevicePrefetcher(WrappedLoader):
    """Iterates a fastai `TfmdDL`, loading and copying `depth` batches ahead in a thread;
    `waited_s` stays near zero when loading keeps ahead of the device."""

    def __init__(self, dl: TfmdDL, place: Callable[[Any], Any], depth: int = PREFETCH_DEPTH):
        super().__init__(dl)
        self.place = place
        self.depth = depth
        self.batches = 0

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


class PrefetchCallback(Callback):
    """Runs every training and validation pass of the Learner through a `DevicePrefetcher`."""

    order = -30

    def __init__(self, place: Callable[[Any], Any], depth: int = PREFETCH_DEPTH):
        self.place = place
        self.depth = depth
        self.prefetchers: list[DevicePrefetcher] = []

    def before_train(self) -> None:
        self._wrap()

    def before_validate(self) -> None:
        self._wrap()

    def _wrap(self) -> None:
        dl = self.learn.dl
        if isinstance(dl, TfmdDL):
            prefetcher = DevicePrefetcher(dl, self.place, self.depth)
            self.learn.dl = prefetcher
            self.prefetchers.append(prefetcher)

"""A training checkpoint: one dict (model, optimizer, epoch, spec), written to a temporary
file and renamed into place, so a crash mid-write never leaves a broken checkpoint."""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from fastai.torch_core import apply, to_cpu, to_device
from torch import Tensor

from common.errors import first_line

CHECKPOINT_NAME = "checkpoint.pth"
FORMAT_VERSION = 1
NEARLY_FULL_BYTES = 16 * 2**20


class ArtifactWriteError(Exception):
    """A job file (checkpoint, export) could not be written: disk full, folder unwritable."""


def write_failure(what: str, path: Path, exc: BaseException) -> ArtifactWriteError:
    """A message that names the file, the reason, and the space left on its disk."""
    reason = getattr(exc, "strerror", None) or first_line(exc)
    try:
        stats = os.statvfs(path.parent)
        free_bytes = stats.f_bavail * stats.f_frsize
    except OSError:
        return ArtifactWriteError(f"cannot write {what} to {path}: {reason}")
    if not isinstance(exc, OSError) and free_bytes < NEARLY_FULL_BYTES:
        # torch's own file writer reports a full disk as an internal assertion.
        reason = f"No space left on device ({reason})"
    free = f"{free_bytes / 2**20:.0f} MB free on that disk"
    return ArtifactWriteError(f"cannot write {what} to {path}: {reason}; {free}")


def checkpoint_path(job_dir: Path) -> Path:
    return job_dir / CHECKPOINT_NAME


def checkpoint_state(
    learn: Any,
    *,
    epoch: int,
    lr: float,
    spec: dict[str, Any],
    copy: bool = False,
    tracker: dict[str, Any] | None = None,
    reuse: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The state after global epoch `epoch` (0-based), on the host.

    `copy` copies tensors that already live on the CPU too, so that training can go on while
    the state is written; into the memory of `reuse`, an earlier state nobody reads any more,
    where it fits. `tracker` is the best-epoch state (worker.best_epoch), kept as given.
    """
    earlier = reuse or {}

    def to_host(part: Any, name: str) -> Any:
        return host_copy(part, earlier.get(name)) if copy else to_cpu(part)

    return {
        "format": FORMAT_VERSION,
        "model": to_host(learn.model.state_dict(), "model"),
        "optimizer": to_host(learn.opt.state_dict(), "optimizer")
        if learn.opt is not None
        else None,
        "epoch": epoch,
        "lr": lr,
        "spec": spec,
        "classes": list(learn.dls.vocab),
        "tracker": tracker,
    }


def host_copy(state: Any, reuse: Any = None) -> Any:
    """`state` with each tensor copied to the host, those of one dtype into one block.

    Blocks because they are large (a model with its optimizer's moments: 140 MB for resnet18):
    glibc maps an allocation that size apart from its heap and unmaps it when freed. Copied
    tensor by tensor, the copies filled the heap's top, and once freed glibc gave the top back
    to the system, after which every training step faulted its activations in again: about
    650,000 page faults and a second (of a 6 s fit) per fit on the CPU, measured here. One
    block per dtype, as torch.save refuses views of one storage as different types.

    `reuse`: an earlier host copy nobody reads any more, whose blocks take this copy (a fresh
    block's pages are faulted in again: about 35 ms for those 140 MB).
    """
    sizes: dict[torch.dtype, int] = {}
    for tensor in _tensors_of(state):
        sizes[tensor.dtype] = sizes.get(tensor.dtype, 0) + tensor.numel()
    old_blocks = {tensor.dtype: tensor for tensor in _tensors_of(reuse)}  # any: one block
    blocks = {dtype: _block(old_blocks.get(dtype), dtype, size) for dtype, size in sizes.items()}
    used = dict.fromkeys(sizes, 0)

    def copy_into_block(tensor: Tensor) -> Tensor:
        start = used[tensor.dtype]
        used[tensor.dtype] = start + tensor.numel()
        view = blocks[tensor.dtype][start : start + tensor.numel()].view(tensor.shape)
        return view.copy_(tensor.detach())

    return apply(lambda o: copy_into_block(o) if isinstance(o, Tensor) else o, state)


def _tensors_of(state: Any) -> list[Tensor]:
    found: list[Tensor] = []
    if state is not None:
        apply(lambda o: found.append(o) if isinstance(o, Tensor) else o, state)
    return found


def _block(old: Tensor | None, dtype: torch.dtype, size: int) -> Tensor:
    """`size` elements of `dtype` on the host: the block under `old` (a tensor of an earlier
    host copy) when it is that size, else a new one."""
    if old is not None and old.device.type == "cpu":
        storage = old.untyped_storage()
        if storage.nbytes() == size * old.element_size():
            return torch.empty(0, dtype=dtype).set_(storage)
    return torch.empty(size, dtype=dtype)


def write_checkpoint(job_dir: Path, state: dict[str, Any]) -> Path:
    """Write a state from `checkpoint_state` as the job's checkpoint, atomically."""
    final = checkpoint_path(job_dir)
    temporary = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        # Serialised in memory first, so that a full disk surfaces as an OSError (ENOSPC)
        # from one plain write rather than as an assertion inside torch's file writer.
        buffer = io.BytesIO()
        torch.save(state, buffer)
        with open(temporary, "wb") as handle:
            handle.write(buffer.getbuffer())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, final)
    except (OSError, RuntimeError) as exc:
        kept = " (the previous checkpoint is intact)" if final.exists() else ""
        what = f"the checkpoint of epoch {state['epoch'] + 1}{kept}"
        raise write_failure(what, final, exc) from exc
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
    return final


class WriteInterval:
    """When a checkpoint is due: at the last epoch, or once `interval_s` has passed since the
    last write (or since training began)."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self._clock = clock
        self._last_write = clock()

    def due(self, last: bool) -> bool:
        return last or self._clock() - self._last_write >= self.interval_s

    def written(self) -> None:
        self._last_write = self._clock()


class CheckpointWriter:
    """Keeps each epoch's state and writes it as the job's checkpoint, at most every
    `interval_s` seconds (and whenever `save` is told it is the `last`), on a background
    thread when `background` is set.

    At every epoch's end the state is copied to the host and kept in memory; it is written
    only once `interval_s` has passed since the last write (or since training began), so a
    run of short epochs does not pay a write each. `flush` writes the newest copy kept: a stop
    request loses at most the epoch in progress; only a kill can lose up to the interval.

    In the background, serialising, writing, fsync and rename happen on a thread while the
    next epoch trains. That pays where the host waits for an accelerator; training on the CPU
    keeps every core busy, so there the write happens in `save`. One write at a time; a write
    that failed is raised by the next `save`, `flush` or `wait`, so a full disk still fails
    the job with its reason, and the checkpoint before it stays intact.
    """

    def __init__(
        self,
        job_dir: Path,
        background: bool = True,
        after_write: Callable[[Path, int], None] | None = None,
        interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.job_dir = job_dir
        self.background = background
        # Called with the file and its epoch once a checkpoint is on disk (the upload).
        self.after_write = after_write
        self.interval = WriteInterval(interval_s, clock)
        self._kept: dict[str, Any] | None = None
        self._thread: threading.Thread | None = None
        self._failure: Exception | None = None

    def save(
        self,
        learn: Any,
        *,
        epoch: int,
        lr: float,
        spec: dict[str, Any],
        last: bool = False,
        tracker: dict[str, Any] | None = None,
    ) -> None:
        """The state after `epoch`: written now if the interval has passed or it is the last
        epoch, else kept in memory for `flush` or the next write."""
        copy = self.background or self.interval.interval_s > 0
        # The state kept from the epoch before was never written: its memory takes this one.
        superseded, self._kept = self._kept, None
        state = checkpoint_state(
            learn, epoch=epoch, lr=lr, spec=spec, copy=copy, tracker=tracker, reuse=superseded
        )
        if self.interval.due(last):
            self._write(state)
        else:
            self._kept = state

    def flush(self) -> None:
        """Write the newest state kept in memory, if any, and wait until it is on disk."""
        if self._kept is not None:
            self._write(self._kept)
        self.wait()

    def _write(self, state: dict[str, Any]) -> None:
        self.wait()
        self._kept = None
        self.interval.written()
        if not self.background:
            self._written(write_checkpoint(self.job_dir, state), state["epoch"])
            return
        self._thread = threading.Thread(
            target=self._write_in_background, args=(state,), name="checkpoint-writer", daemon=True
        )
        self._thread.start()

    def _write_in_background(self, state: dict[str, Any]) -> None:
        try:
            self._written(write_checkpoint(self.job_dir, state), state["epoch"])
        except Exception as exc:  # raised on the training thread by the next save or wait
            self._failure = exc

    def _written(self, path: Path, epoch: int) -> None:
        if self.after_write is not None:
            self.after_write(path, epoch)

    def wait(self) -> None:
        """Until the last write is on disk; raises why it is not (ArtifactWriteError for a
        full disk or an unwritable folder)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure


def load_checkpoint(job_dir: Path) -> dict[str, Any] | None:
    path = checkpoint_path(job_dir)
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def restore(learn: Any, state: dict[str, Any], device: torch.device) -> None:
    """Load model and optimizer state; the optimizer is created first (on the device)."""
    learn.model.load_state_dict(state["model"])
    learn.create_opt()
    if state.get("optimizer") is not None:
        learn.opt.load_state_dict(to_device(state["optimizer"], device))

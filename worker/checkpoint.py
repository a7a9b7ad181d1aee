"""A training checkpoint: one dict (model, optimizer, epoch, spec), written to a temporary
file and renamed into place, so a crash mid-write never leaves a broken checkpoint."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

import torch
from fastai.torch_core import to_cpu, to_device

CHECKPOINT_NAME = "checkpoint.pth"
FORMAT_VERSION = 1
NEARLY_FULL_BYTES = 16 * 2**20


class ArtifactWriteError(Exception):
    """A job file (checkpoint, export) could not be written: disk full, folder unwritable."""


def write_failure(what: str, path: Path, exc: BaseException) -> ArtifactWriteError:
    """A message that names the file, the reason, and the space left on its disk."""
    reason = getattr(exc, "strerror", None) or str(exc).strip().splitlines()[0]
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


def save_checkpoint(
    job_dir: Path, learn: Any, *, epoch: int, lr: float, spec: dict[str, Any]
) -> Path:
    """Save the state after global epoch `epoch` (0-based) has finished."""
    state = {
        "format": FORMAT_VERSION,
        "model": to_cpu(learn.model.state_dict()),
        "optimizer": to_cpu(learn.opt.state_dict()) if learn.opt is not None else None,
        "epoch": epoch,
        "lr": lr,
        "spec": spec,
        "classes": list(learn.dls.vocab),
    }
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
        raise write_failure(f"the checkpoint of epoch {epoch + 1}{kept}", final, exc) from exc
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
    return final


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

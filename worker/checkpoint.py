"""A training checkpoint: one dict (model, optimizer, epoch, spec), written to a temporary
file and renamed into place, so a crash mid-write never leaves a broken checkpoint."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from fastai.torch_core import to_cpu, to_device

CHECKPOINT_NAME = "checkpoint.pth"
FORMAT_VERSION = 1


def checkpoint_path(job_dir: Path) -> Path:
    return job_dir / CHECKPOINT_NAME


def save_checkpoint(
    job_dir: Path, learn: Any, *, epoch: int, lr: float, spec: dict[str, Any]
) -> Path:
    """Save the state after global epoch `epoch` (0-based) has finished."""
    job_dir.mkdir(parents=True, exist_ok=True)
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
        with open(temporary, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, final)
    finally:
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

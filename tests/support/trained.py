"""A job trained once per session and copies of its export, for the results tests."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from common import store
from db import queue
from db.artifacts import get_artifact
from tests.support.artifacts import record_local_file

REPO = Path(__file__).resolve().parents[2]


DIGITS_SPEC = {
    "name": "results digits",
    "arch": "resnet18",
    "pretrained": False,
    "epochs": 2,
    "lr": 1e-2,
    "bs": 64,
    "img_size": 16,
    "device": "cpu",
}


WORKER_TIMEOUT_S = 900


@dataclass(frozen=True)
class TrainedJob:
    engine: Engine
    url: str
    data_dir: Path
    job_id: int

    def env(self) -> dict[str, str]:
        """The environment for a `python -m worker …` against this job's database."""
        return {
            **os.environ,
            "DATABASE_URL": self.url,
            "TRAINDECK_DATA": str(self.data_dir),
            "PYTHONPATH": str(REPO),
        }


def job_with_copied_export(trained: TrainedJob, *, flip_byte_at: int | None = None) -> int:
    """A new succeeded job whose recorded export is a copy of the trained one; with
    `flip_byte_at`, one byte of the copy is changed after it was recorded."""
    job_id = queue.submit(trained.engine, {**DIGITS_SPEC, "name": "copied export"})
    claimed = queue.claim(trained.engine, "results-test")
    assert claimed is not None and claimed.id == job_id
    assert queue.finish(trained.engine, claimed.lease, "succeeded")
    source = get_artifact(trained.engine, trained.job_id, "export")
    folder = trained.data_dir / "jobs" / str(job_id)
    folder.mkdir(parents=True)
    copy = folder / "export.pkl"
    store.get_file(source.path, copy)
    record_local_file(trained.engine, job_id, "export", copy)
    if flip_byte_at is not None:
        flip_byte(copy, flip_byte_at)
    return job_id


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))

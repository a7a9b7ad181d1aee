"""Where traindeck keeps files under the data folder, and small helpers for them."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from common import config

CHUNK_BYTES = 1 << 20


def jobs_dir() -> Path:
    return config.data_dir() / "jobs"


def job_dir(job_id: int) -> Path:
    """The folder of one job: its checkpoint, export and anything else it writes."""
    return jobs_dir() / str(int(job_id))


def datasets_dir() -> Path:
    return config.data_dir() / "datasets"


def remove_job_files(job_id: int) -> None:
    """The job's folder on this machine and its objects in the store (a deleted job)."""
    from common import store

    shutil.rmtree(job_dir(job_id), ignore_errors=True)
    store.delete_prefix(store.job_prefix(job_id))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def replace_atomically(temporary: Path, final: Path) -> None:
    """Make `temporary` (in the same folder, fully written) appear as `final` in one step."""
    with open(temporary, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, final)

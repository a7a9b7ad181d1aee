"""This worker's copies of datasets packed in the store, keyed by their SHA-256.

A dataset registered on another machine (with a bucket as the store) reaches a worker as one
archive (`datasets.archive`). The first job on it downloads the archive, checks its SHA-256
against the dataset row, and unpacks it under `TRAINDECK_DATA/cache/datasets/<sha256>/`; later
jobs on the same content use that folder. A folder appears under its final name only once it
is complete, so a crash half-way leaves nothing that looks usable. When the cache grows past
its bound (`TRAINDECK_DATASET_CACHE_GB`), the least recently used copies go.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from pathlib import Path

from common import config, store
from common.errors import first_line
from datasets.archive import unpack
from datasets.labelling import DatasetError
from db.models import Dataset

log = logging.getLogger(__name__)

COMPLETE = ".complete"  # holds the unpacked size in bytes; its time is the last use


def cache_dir() -> Path:
    return config.data_dir() / "cache" / "datasets"


def _folder_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def fetch_archive(dataset: Dataset) -> Path:
    """The unpacked files of `dataset`'s archive on this machine, fetched if need be."""
    assert dataset.archive_url and dataset.archive_sha256
    final = cache_dir() / dataset.archive_sha256
    marker = final / COMPLETE
    if marker.is_file():
        os.utime(marker)  # used now: the last to be evicted
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f".{final.name}.{uuid.uuid4().hex}.partial")
    try:
        _download_and_unpack(dataset, partial)
        with contextlib.suppress(OSError):  # another worker here finished first: use its copy
            partial.rename(final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    if not marker.is_file():
        raise DatasetError(f"dataset {dataset.name!r}: its cached copy {final} is incomplete")
    evict(keep=final)
    return final


def _download_and_unpack(dataset: Dataset, partial: Path) -> None:
    archive = partial.with_suffix(".tar")
    try:
        store.get_file(dataset.archive_url, archive)
        if store.sha256_file(archive) != dataset.archive_sha256:
            raise DatasetError(
                f"dataset {dataset.name!r}: the archive {dataset.archive_url} is not the one "
                "registered (its SHA-256 differs); register the dataset again"
            )
        unpack(archive, partial)
    except FileNotFoundError:
        raise DatasetError(
            f"dataset {dataset.name!r}: its archive {dataset.archive_url} is not in the store"
        ) from None
    except store.StoreError as exc:
        raise DatasetError(f"dataset {dataset.name!r} cannot be fetched: {exc}") from None
    except OSError as exc:
        raise DatasetError(
            f"dataset {dataset.name!r} cannot be unpacked here: {first_line(exc)}"
        ) from None
    finally:
        archive.unlink(missing_ok=True)
    (partial / COMPLETE).write_text(str(_folder_size(partial)))


def evict(keep: Path) -> None:
    """Remove the least recently used copies until the cache is within its bound."""
    limit = store.dataset_cache_bytes()
    copies = []
    for folder in cache_dir().iterdir():
        marker = folder / COMPLETE
        if marker.is_file():
            copies.append((marker.stat().st_mtime, folder, int(marker.read_text() or 0)))
    total = sum(size for _, _, size in copies)
    for _, folder, size in sorted(copies, key=lambda copy: copy[0]):
        if total <= limit:
            break
        if folder == keep:
            continue
        log.info("dataset cache over %d bytes: removing %s", limit, folder)
        shutil.rmtree(folder, ignore_errors=True)
        total -= size

"""Where dataset files live on this machine, under the data folder (`TRAINDECK_DATA/datasets/`):
`digits/`, `uploads/<name>/` for zips, and `url/<name>/` for archives the worker fetches
(`url/<name>/data/<archive>/`).
"""

from __future__ import annotations

from pathlib import Path

from common.files import datasets_dir
from datasets.labelling import (
    DatasetError,
    dataset_root,
)
from db.models import Dataset


def digits_dir(root: Path | None = None) -> Path:
    return (root or datasets_dir()) / "digits"


def uploads_dir() -> Path:
    return datasets_dir() / "uploads"


def url_fetch_dir(name: str) -> Path:
    """Where the worker keeps the archive and the extracted files of `url` dataset `name`."""
    return datasets_dir() / "url" / name


def url_data_dir(name: str) -> Path:
    return url_fetch_dir(name) / "data"


def local_root(dataset: Dataset) -> Path:
    """The folder of `dataset` on this machine (for a `url` one, where the worker put it)."""
    if dataset.kind != "url":
        return Path(dataset.location)
    data = url_data_dir(dataset.name)
    if not data.is_dir():
        raise DatasetError(
            f"dataset {dataset.name!r} ({dataset.location}) has not been fetched on this machine "
            "yet; the worker downloads it (worker.fetch.fetch_url_dataset) before its first job"
        )
    return dataset_root(data)

"""Fetching a `url` dataset on the worker: `datasets.download` downloads and unpacks it.

The extracted files live under `TRAINDECK_DATA/datasets/url/<name>/data/`, so a second job on
the same machine finds them and downloads nothing. Only public addresses (or the mirrors an
admin allows in `TRAINDECK_URL_ALLOW`) are fetched, within the size limits of
`datasets.download`; an error names the URL and the status or the reason, never what a server
answered. A machine without internet access, or a URL that does not answer, gives a FetchError
naming the URL and what to do, which the job's error shows. A download that fails, or an
archive whose files cannot train, leaves nothing on disk.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from datasets.download import FetchError, fetch_archive
from datasets.folders import url_data_dir, url_fetch_dir
from datasets.labelling import DatasetError, dataset_root
from datasets.register import normalize_dataset_url, record_fetched
from db.engine import Engine
from db.models import Dataset

FASTAI_NAMES_PAGE = "https://docs.fast.ai/data.external.html"

__all__ = ["FetchError", "fetch_url_dataset", "resolve_url"]


def resolve_url(location: str) -> str:
    """The archive URL of a registered location: `URLs.PETS` → fastai's URL for it."""
    location = normalize_dataset_url(location)
    if not location.startswith("URLs."):
        return location
    from fastai.data.external import URLs

    name = location.removeprefix("URLs.")
    value = getattr(URLs, name, None)
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise FetchError(
            f"fastai has no dataset named {location}; the names are listed at {FASTAI_NAMES_PAGE}"
        )
    return value


def fetch_url_dataset(dataset: Dataset, engine: Engine | None = None) -> Path:
    """Download and unpack a `url` dataset (once per machine) and return its folder.

    With `engine`, the first fetch also checks the files and records their classes, counts
    and undecodable files in the registry (DatasetError if the archive cannot train; its
    files are then removed).
    """
    if dataset.kind != "url":
        raise FetchError(f"dataset {dataset.name!r} is a {dataset.kind} dataset, not a url one")
    url = resolve_url(dataset.location)
    data = url_data_dir(dataset.name)
    if not data.is_dir():
        fetch_archive(url, data, f"dataset {dataset.name!r}")
    root = dataset_root(data)
    if engine is not None and not dataset.class_counts:
        try:
            record_fetched(engine, dataset, root)
        except DatasetError:
            shutil.rmtree(url_fetch_dir(dataset.name), ignore_errors=True)
            raise
    return root

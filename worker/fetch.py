"""Fetching a `url` dataset on the worker with fastai's `untar_data`.

The archive and its extracted files live under `TRAINDECK_DATA/datasets/url/<name>/`, so a
second job on the same machine finds them and downloads nothing. A machine without internet
access, or a URL that does not answer, gives a FetchError naming the URL and what to do, which
the job's error shows.
"""

from __future__ import annotations

import contextlib
import io
import socket
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.error import HTTPError, URLError

from datasets.folders import url_data_dir, url_fetch_dir
from datasets.items import dataset_items
from datasets.labelling import DatasetError, LabelledItems, dataset_root
from datasets.register import normalize_dataset_url, record_fetched
from db.datasets import get_dataset
from db.engine import Engine
from db.models import Dataset

DOWNLOAD_TIMEOUT_S = 60.0
FASTAI_NAMES_PAGE = "https://docs.fast.ai/data.external.html"


class FetchError(DatasetError):
    """A `url` dataset could not be downloaded or unpacked on this machine."""


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


@contextmanager
def _guarded_download() -> Iterator[None]:
    """A timeout on every socket (fastai sets none), tar extraction that refuses members
    leading outside the target folder, and no progress bar, for the duration of one fetch."""
    previous_timeout = socket.getdefaulttimeout()
    previous_filter = tarfile.TarFile.extraction_filter
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    tarfile.TarFile.extraction_filter = staticmethod(tarfile.data_filter)
    try:
        # fastprogress draws a text progress bar on stdout, which would flood the job's log.
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        socket.setdefaulttimeout(previous_timeout)
        tarfile.TarFile.extraction_filter = previous_filter


def _offline_message(name: str, url: str, reason: object) -> str:
    return (
        f"could not download dataset {name!r} from {url} ({reason}). Is this worker offline? "
        "Download the archive on a machine that is online, copy it here, and register the "
        f"unpacked folder with `python -m db dataset add NAME --folder PATH` "
        "(or upload it as a zip in the dashboard)"
    )


def fetch_url_dataset(dataset: Dataset, engine: Engine | None = None) -> Path:
    """Download and unpack a `url` dataset (once per machine) and return its folder.

    With `engine`, the first fetch also checks the files and records their classes, counts
    and undecodable files in the registry (DatasetError if the archive cannot train).
    """
    if dataset.kind != "url":
        raise FetchError(f"dataset {dataset.name!r} is a {dataset.kind} dataset, not a url one")
    url = resolve_url(dataset.location)
    from fastai.data.external import untar_data

    fetch_dir = url_fetch_dir(dataset.name)
    try:
        with _guarded_download():
            untar_data(
                url, archive=fetch_dir / "archive", data=url_data_dir(dataset.name), base=fetch_dir
            )
    except (URLError, HTTPError, TimeoutError, ConnectionError, socket.gaierror) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise FetchError(_offline_message(dataset.name, url, reason)) from None
    except (tarfile.TarError, EOFError) as exc:
        raise FetchError(
            f"the archive of dataset {dataset.name!r} ({url}) cannot be unpacked safely: {exc}"
        ) from None
    except Exception as exc:
        raise FetchError(f"could not fetch dataset {dataset.name!r} from {url}: {exc}") from None
    root = dataset_root(url_data_dir(dataset.name))
    if engine is not None and not dataset.class_counts:
        record_fetched(engine, dataset, root)
    return root


def load_dataset_items(dataset: Dataset, engine: Engine | None = None) -> LabelledItems:
    """The labelled items of any registered dataset, fetching a `url` one first."""
    if dataset.kind != "url":
        return dataset_items(dataset)
    root = fetch_url_dataset(dataset, engine)
    if engine is not None:
        dataset = get_dataset(engine, dataset.name) or dataset
    return dataset_items(dataset, root)

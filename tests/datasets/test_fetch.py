"""Fetching a `url` dataset with fastai's untar_data from a server on 127.0.0.1 (never the
internet), and the messages when the worker is offline or the archive is hostile."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from datasets.folders import url_data_dir
from datasets.register import register_url
from db.datasets import get_dataset
from tests.support.archive_server import ArchiveServer, closed_port, make_tgz
from tests.support.images import files_under, make_split_dataset, write_corrupt_png
from worker.fetch import FetchError, fetch_url_dataset, load_dataset_items, resolve_url


@pytest.fixture
def archives(tmp_path: Path) -> Iterator[tuple[Path, ArchiveServer]]:
    folder = tmp_path / "served"
    folder.mkdir()
    server = ArchiveServer(folder)
    yield folder, server
    server.close()


def test_a_url_dataset_is_fetched_once_and_checked(
    sqlite_engine: Engine, data_dir: Path, tmp_path: Path, archives
) -> None:
    folder, server = archives
    source = make_split_dataset(tmp_path / "src", ("a", "b"), 3, 2)
    write_corrupt_png(source / "train" / "a" / "broken.png")
    make_tgz(source, folder / "tiny.tgz", "tiny")
    register_url(sqlite_engine, "tiny", server.url("tiny.tgz"))
    dataset = get_dataset(sqlite_engine, "tiny")

    root = fetch_url_dataset(dataset, sqlite_engine)
    items = load_dataset_items(dataset, sqlite_engine)

    assert root == url_data_dir("tiny") / "tiny"
    assert server.requests == ["/tiny.tgz"]
    fetched = get_dataset(sqlite_engine, "tiny")
    assert fetched.class_counts == {"a": 5, "b": 5}
    assert fetched.bad_files == ["train/a/broken.png"]
    assert fetched.label_rule["detected"] == {
        "type": "folder",
        "split": {"train": "train", "valid": "valid"},
    }
    assert len(items.items) == 10
    assert items.is_valid is not None
    assert sum(items.is_valid) == 4


def test_an_offline_worker_gets_a_message_naming_the_url(
    sqlite_engine: Engine, data_dir: Path
) -> None:
    url = f"http://127.0.0.1:{closed_port()}/pets.tgz"
    register_url(sqlite_engine, "pets", url)

    with pytest.raises(FetchError) as caught:
        fetch_url_dataset(get_dataset(sqlite_engine, "pets"), sqlite_engine)

    message = str(caught.value)
    assert url in message
    assert "Is this worker offline?" in message
    assert "--folder PATH" in message
    assert get_dataset(sqlite_engine, "pets").item_count == 0


def test_a_missing_archive_gives_a_message(sqlite_engine: Engine, data_dir: Path, archives):
    _, server = archives
    register_url(sqlite_engine, "gone", server.url("gone.tgz"))
    with pytest.raises(FetchError, match=r"could not download dataset 'gone' from http://"):
        fetch_url_dataset(get_dataset(sqlite_engine, "gone"))


def test_a_tar_member_leading_outside_is_refused(
    sqlite_engine: Engine, data_dir: Path, tmp_path: Path, archives
) -> None:
    folder, server = archives
    payload = b"evil"
    with tarfile.open(folder / "evil.tgz", "w:gz") as tar:
        member = tarfile.TarInfo("../../../../evil.txt")
        member.size = len(payload)
        tar.addfile(member, io.BytesIO(payload))
    register_url(sqlite_engine, "evil", server.url("evil.tgz"))
    before = files_under(tmp_path)

    with pytest.raises(FetchError, match=r"cannot be unpacked safely: .* outside the destination"):
        fetch_url_dataset(get_dataset(sqlite_engine, "evil"))

    created = files_under(tmp_path) - before
    assert not [name for name in created if name.endswith("evil.txt")]
    assert tarfile.TarFile.extraction_filter is None


def test_fastai_names_resolve_and_unknown_ones_are_refused() -> None:
    assert resolve_url("URLs.MNIST_TINY").endswith("/mnist_tiny.tgz")
    with pytest.raises(FetchError, match=r"fastai has no dataset named URLs\.NOT_A_DATASET"):
        resolve_url("URLs.NOT_A_DATASET")

"""Fetching a `url` dataset from a server on 127.0.0.1 (never the internet): once, checked,
and only where allowed. A local address is refused unless an admin allows it
(TRAINDECK_URL_ALLOW), on every redirect too and after the name is resolved (once); an error
names the status and the URL, never the page; an archive over the limits, hostile or useless
leaves nothing on disk."""

from __future__ import annotations

import io
import os
import socket
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from datasets.folders import url_data_dir
from datasets.items import dataset_items
from datasets.labelling import DatasetError
from datasets.register import register_url
from db.datasets import get_dataset
from tests.support.archive_server import ArchiveServer, closed_port, make_certificate, make_tgz
from tests.support.images import (
    files_under,
    make_folder_dataset,
    make_split_dataset,
    write_corrupt_png,
)
from worker.fetch import FetchError, fetch_url_dataset, resolve_url

ALLOW = "TRAINDECK_URL_ALLOW"


@pytest.fixture
def archives(tmp_path: Path) -> Iterator[tuple[Path, ArchiveServer]]:
    folder = tmp_path / "served"
    folder.mkdir()
    server = ArchiveServer(folder)
    yield folder, server
    server.close()


@pytest.fixture
def allow_local(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test server's address, allowed as an internal mirror would be."""
    monkeypatch.setenv(ALLOW, "127.0.0.1")


def _url_files(data_dir: Path) -> set[str]:
    folder = data_dir / "datasets" / "url"
    return files_under(folder) if folder.exists() else set()


@pytest.mark.usefixtures("allow_local")
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
    again = fetch_url_dataset(get_dataset(sqlite_engine, "tiny"), sqlite_engine)

    assert root == again == url_data_dir("tiny") / "tiny"
    assert server.requests == ["/tiny.tgz"]
    fetched = get_dataset(sqlite_engine, "tiny")
    items = dataset_items(fetched, root)
    assert fetched.class_counts == {"a": 5, "b": 5}
    assert fetched.bad_files == ["train/a/broken.png"]
    assert fetched.label_rule["detected"] == {
        "type": "folder",
        "split": {"train": "train", "valid": "valid"},
    }
    assert len(items.items) == 10
    assert items.is_valid is not None
    assert sum(items.is_valid) == 4


@pytest.mark.usefixtures("allow_local")
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
    assert _url_files(data_dir) == set()


@pytest.mark.usefixtures("allow_local")
def test_a_missing_archive_gives_a_message(sqlite_engine: Engine, data_dir: Path, archives):
    _, server = archives
    register_url(sqlite_engine, "gone", server.url("gone.tgz"))
    with pytest.raises(FetchError, match=r"could not download dataset 'gone' from http://"):
        fetch_url_dataset(get_dataset(sqlite_engine, "gone"))
    assert _url_files(data_dir) == set()


@pytest.mark.usefixtures("allow_local")
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

    with pytest.raises(
        FetchError, match=r"cannot be unpacked safely: .*points outside the dataset folder"
    ):
        fetch_url_dataset(get_dataset(sqlite_engine, "evil"))

    created = files_under(tmp_path) - before
    assert not [name for name in created if name.endswith("evil.txt")]
    assert tarfile.TarFile.extraction_filter is None
    assert _url_files(data_dir) == set()


def test_fastai_names_resolve_and_unknown_ones_are_refused() -> None:
    assert resolve_url("URLs.MNIST_TINY").endswith("/mnist_tiny.tgz")
    with pytest.raises(FetchError, match=r"fastai has no dataset named URLs\.NOT_A_DATASET"):
        resolve_url("URLs.NOT_A_DATASET")


def test_a_local_server_is_refused_unless_an_admin_allows_it(
    sqlite_engine: Engine, data_dir: Path, tmp_path: Path, archives, monkeypatch
) -> None:
    folder, server = archives
    make_tgz(make_split_dataset(tmp_path / "src", ("a", "b"), 3, 2), folder / "tiny.tgz", "tiny")

    with pytest.raises(DatasetError) as refused:
        register_url(sqlite_engine, "tiny", server.url("tiny.tgz"))
    assert str(refused.value) == (
        f"{server.url('tiny.tgz')} is refused: 127.0.0.1 is a loopback address. Only public "
        "addresses are fetched; an admin can allow an internal mirror with TRAINDECK_URL_ALLOW"
    )
    assert get_dataset(sqlite_engine, "tiny") is None

    monkeypatch.setenv(ALLOW, "127.0.0.0/8, mirror.example")
    register_url(sqlite_engine, "tiny", server.url("tiny.tgz"))
    root = fetch_url_dataset(get_dataset(sqlite_engine, "tiny"), sqlite_engine)
    assert root == url_data_dir("tiny") / "tiny"
    assert get_dataset(sqlite_engine, "tiny").class_counts == {"a": 5, "b": 5}
    assert server.requests == ["/tiny.tgz"]


def test_the_worker_checks_the_address_again_when_it_fetches(
    sqlite_engine: Engine, data_dir: Path, archives, monkeypatch
) -> None:
    _, server = archives
    monkeypatch.setenv(ALLOW, "127.0.0.1")
    register_url(sqlite_engine, "tiny", server.url("tiny.tgz"))
    monkeypatch.delenv(ALLOW)

    with pytest.raises(DatasetError, match=r"127\.0\.0\.1 is a loopback address"):
        fetch_url_dataset(get_dataset(sqlite_engine, "tiny"), sqlite_engine)
    assert server.requests == []
    assert _url_files(data_dir) == set()


def _resolves_to_loopback(name: str) -> bool:
    try:
        return any(info[4][0] == "127.0.0.1" for info in socket.getaddrinfo(name, 80))
    except OSError:
        return False


def test_a_redirect_from_an_allowed_name_to_loopback_is_refused(
    sqlite_engine: Engine, data_dir: Path, tmp_path: Path, archives, monkeypatch
) -> None:
    if not _resolves_to_loopback("localhost"):
        pytest.skip("localhost does not resolve to 127.0.0.1 here")
    folder, server = archives
    make_tgz(make_split_dataset(tmp_path / "src", ("a", "b"), 3, 2), folder / "tiny.tgz", "tiny")
    server.answer("hop.tgz", 302, headers={"Location": server.url("tiny.tgz")})
    monkeypatch.setenv(ALLOW, "localhost")
    start = server.url("hop.tgz", host="localhost")
    register_url(sqlite_engine, "hop", start)

    with pytest.raises(FetchError) as refused:
        fetch_url_dataset(get_dataset(sqlite_engine, "hop"), sqlite_engine)

    assert str(refused.value) == (
        f"dataset 'hop' cannot be downloaded: {start} redirected to {server.url('tiny.tgz')} "
        "is refused: 127.0.0.1 is a loopback address. Only public addresses are fetched; an "
        "admin can allow an internal mirror with TRAINDECK_URL_ALLOW"
    )
    assert server.requests == ["/hop.tgz"]
    assert _url_files(data_dir) == set()


@pytest.mark.usefixtures("allow_local")
def test_an_error_names_its_status_and_the_url_never_the_page(
    sqlite_engine: Engine, data_dir: Path, archives
) -> None:
    _, server = archives
    page = b"<html>internal admin console: token=s3cr3t-t0ken " + b"x" * 3_000 + b"</html>"
    server.answer("private.tgz", 403, page, {"Content-Type": "text/html"})
    url = server.url("private.tgz").replace("http://", "http://ada:hunter2@")
    register_url(sqlite_engine, "private", url)

    with pytest.raises(FetchError) as failed:
        fetch_url_dataset(get_dataset(sqlite_engine, "private"), sqlite_engine)

    shown = server.url("private.tgz").replace("http://", "http://ada:***@")
    assert str(failed.value) == (
        f"could not download dataset 'private' from {shown}: the server answered 403 Forbidden"
    )
    assert "hunter2" not in str(failed.value)
    assert _url_files(data_dir) == set()


def test_the_name_is_resolved_once_and_the_checked_address_is_used(
    sqlite_engine: Engine, data_dir: Path, tmp_path: Path, archives, monkeypatch
) -> None:
    """A name is judged by the addresses it resolves to, and is asked once per request: a
    name that answers a checked address first and another one after (DNS rebinding) is
    connected to at the address that was checked, with its own name in the Host header."""
    folder, server = archives
    make_tgz(make_split_dataset(tmp_path / "src", ("a", "b"), 3, 2), folder / "tiny.tgz", "tiny")
    real = socket.getaddrinfo
    answers: list[str] = []
    asked: list[str] = []

    def rebinding(host, port, *args, **kwargs):
        if host != "mirror.test" or kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            return real(host, port, *args, **kwargs)
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers.pop(0), port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    monkeypatch.setenv(ALLOW, "127.0.0.1/32")
    register_url(sqlite_engine, "tiny", server.url("tiny.tgz", host="mirror.test"))
    dataset = get_dataset(sqlite_engine, "tiny")

    answers[:] = ["127.0.0.2"]
    with pytest.raises(FetchError, match=r"mirror\.test resolves to 127\.0\.0\.2, a loopback"):
        fetch_url_dataset(dataset, sqlite_engine)
    assert (asked, server.requests) == (["mirror.test"], [])

    asked.clear()
    answers[:] = ["127.0.0.1", "127.0.0.2", "127.0.0.2"]
    fetch_url_dataset(dataset, sqlite_engine)
    assert asked == ["mirror.test"]
    assert server.hosts == [f"mirror.test:{server.port}"]
    assert get_dataset(sqlite_engine, "tiny").class_counts == {"a": 5, "b": 5}


def test_https_checks_the_certificate_for_the_name_at_the_checked_address(
    sqlite_engine: Engine, data_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """The connection goes to the address checked for the name, and TLS (SNI and the
    certificate check) still speaks to the name."""
    folder = tmp_path / "served"
    folder.mkdir()
    make_tgz(make_split_dataset(tmp_path / "src", ("a", "b"), 3, 2), folder / "tiny.tgz", "tiny")
    authority, certificate, key = make_certificate(tmp_path, "mirror.test")
    server = ArchiveServer(folder, certificate=(certificate, key))
    real = socket.getaddrinfo

    def names(host, port, *args, **kwargs):
        if host not in ("mirror.test", "other.test") or kwargs.get("flags", 0):
            return real(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", names)
    monkeypatch.setenv("SSL_CERT_FILE", str(authority))
    monkeypatch.setenv(ALLOW, "127.0.0.1")
    try:
        register_url(sqlite_engine, "tiny", server.url("tiny.tgz", host="mirror.test"))
        register_url(sqlite_engine, "other", server.url("tiny.tgz", host="other.test"))

        fetch_url_dataset(get_dataset(sqlite_engine, "tiny"), sqlite_engine)
        with pytest.raises(FetchError, match=r"certificate verify failed.*other\.test"):
            fetch_url_dataset(get_dataset(sqlite_engine, "other"), sqlite_engine)
    finally:
        server.close()

    assert get_dataset(sqlite_engine, "tiny").class_counts == {"a": 5, "b": 5}
    assert server.hosts == [f"mirror.test:{server.port}"]
    assert {name.split("/")[0] for name in _url_files(data_dir)} == {"tiny"}


def _write_tgz(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return path


@pytest.mark.usefixtures("allow_local")
@pytest.mark.parametrize("bomb", ["bomb/a/zeros.png", "bomb/notes.txt"])
def test_a_tar_bomb_stops_at_the_unpacked_limit_and_leaves_nothing(
    sqlite_engine: Engine, data_dir: Path, tmp_path: Path, archives, monkeypatch, bomb: str
) -> None:
    folder, server = archives
    zeros = bytes(30_000_000)
    archive = _write_tgz(folder / "bomb.tgz", {"bomb/a/1.png": b"x", bomb: zeros})
    assert archive.stat().st_size < 100_000
    monkeypatch.setenv("TRAINDECK_URL_MAX_UNPACKED_MB", "10")
    register_url(sqlite_engine, "bomb", server.url("bomb.tgz"))

    with pytest.raises(FetchError) as stopped:
        fetch_url_dataset(get_dataset(sqlite_engine, "bomb"), sqlite_engine)

    assert str(stopped.value).endswith(
        "cannot be unpacked safely: the archive unpacks to more than 10 MB (an admin can raise "
        "the limit with TRAINDECK_URL_MAX_UNPACKED_MB)"
    )
    assert _url_files(data_dir) == set()


@pytest.mark.usefixtures("allow_local")
@pytest.mark.parametrize("declared", [True, False])
def test_a_download_over_the_limit_stops_and_leaves_nothing(
    sqlite_engine: Engine, data_dir: Path, archives, monkeypatch, declared: bool
) -> None:
    _, server = archives
    headers = {} if declared else {"Content-Length": ""}
    server.answer("big.tgz", 200, os.urandom(1_500_000), headers)
    monkeypatch.setenv("TRAINDECK_URL_MAX_MB", "1")
    register_url(sqlite_engine, "big", server.url("big.tgz"))

    with pytest.raises(FetchError) as stopped:
        fetch_url_dataset(get_dataset(sqlite_engine, "big"), sqlite_engine)

    size = "2 MB" if declared else "more than 1 MB"
    assert str(stopped.value) == (
        f"dataset 'big' at {server.url('big.tgz')} is {size}; the limit is 1 MB (an admin can "
        "raise it with TRAINDECK_URL_MAX_MB)"
    )
    assert _url_files(data_dir) == set()


@pytest.mark.usefixtures("allow_local")
def test_an_archive_that_cannot_train_leaves_nothing(
    sqlite_engine: Engine, data_dir: Path, tmp_path: Path, archives
) -> None:
    folder, server = archives
    lonely = make_folder_dataset(tmp_path / "src", ("only",), per_class=3)
    make_tgz(lonely, folder / "lonely.tgz", "lonely")
    register_url(sqlite_engine, "lonely", server.url("lonely.tgz"))

    with pytest.raises(DatasetError, match="a classifier needs at least 2"):
        fetch_url_dataset(get_dataset(sqlite_engine, "lonely"), sqlite_engine)

    assert _url_files(data_dir) == set()

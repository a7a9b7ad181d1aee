"""The dashboard's download route streams an object from the bucket (the Cloud Storage
emulator) with one GET on its own event loop: whole, in order, with its digest."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from common import store
from dashboard import auth, downloads


@pytest.fixture
def client(monkeypatch) -> TestClient:
    monkeypatch.setattr(auth, "session_identity", lambda: None)  # no sign-in in front
    return TestClient(Starlette(routes=downloads.routes()))


def _put(tmp_path: Path, size: int) -> store.StoredObject:
    local = tmp_path / "export.pkl"
    local.write_bytes(os.urandom(size))
    return store.put_file(local, store.job_output_key(3, "export.pkl", store.sha256_file(local)))


def test_an_object_of_several_chunks_comes_whole_with_its_digest(client, tmp_path, gcs):
    stored = _put(tmp_path, 3 * store.CHUNK_BYTES + 12_345)
    link = downloads.link_for(stored.url, "job3-export.pkl", stored.sha256)

    with client:
        response = client.get(link)

    assert response.status_code == 200
    assert response.content == (tmp_path / "export.pkl").read_bytes()
    assert response.headers["content-length"] == str(stored.bytes)
    digest = base64.b64encode(bytes.fromhex(stored.sha256)).decode()
    assert response.headers["repr-digest"] == f"sha-256=:{digest}:"


def test_an_object_deleted_from_the_bucket_is_gone_with_its_name(client, tmp_path, gcs):
    stored = _put(tmp_path, 1000)
    link = downloads.link_for(stored.url, "job3-export.pkl", stored.sha256)
    store.delete(stored.url)

    with client:
        response = client.get(link)

    assert response.status_code == 410
    assert response.text == "The file job3-export.pkl is no longer in the store."


def test_the_streamed_read_equals_the_stored_bytes_and_says_when_the_object_is_missing(
    tmp_path, gcs
):
    import asyncio

    stored = _put(tmp_path, 2 * store.CHUNK_BYTES + 1)

    async def read(url: str) -> bytes:
        return b"".join([chunk async for chunk in store.aiter_chunks(url)])

    assert asyncio.run(read(stored.url)) == (tmp_path / "export.pkl").read_bytes()
    with pytest.raises(FileNotFoundError):
        asyncio.run(read(stored.url + ".missing"))

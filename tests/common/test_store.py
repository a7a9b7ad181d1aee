"""The store against a local folder and against a real Cloud Storage emulator (gcsfs)."""

from __future__ import annotations

import os

import pytest

from common import store
from common.settings import SettingsError


@pytest.fixture(params=["local", "gcs"])
def any_store(request, data_dir):
    if request.param == "gcs":
        request.getfixturevalue("gcs")
    return request.param


def test_an_object_goes_in_and_comes_back_whole(any_store, tmp_path):
    local = tmp_path / "export.pkl"
    local.write_bytes(os.urandom(2_500_000))
    sha = store.sha256_file(local)
    stored = store.put_file(local, store.job_output_key(7, "export.pkl", sha))
    assert stored.url.endswith(f"/jobs/7/export.{sha}.pkl")
    assert stored.url.startswith("gs://traindeck-test/td/" if any_store == "gcs" else "file://")
    assert (stored.bytes, stored.sha256) == (local.stat().st_size, sha)
    assert store.exists(stored.url) and store.size(stored.url) == stored.bytes
    assert store.read_bytes(stored.url) == local.read_bytes()
    assert b"".join(store.iter_chunks(stored.url)) == local.read_bytes()
    back = store.get_file(stored.url, tmp_path / "back" / "export.pkl")
    assert back.read_bytes() == local.read_bytes()
    assert store.list_keys("jobs/7") == [f"jobs/7/export.{sha}.pkl"], "no temporary key is left"


def test_a_pointer_is_replaced_whole_and_absent_is_none(any_store):
    key = store.checkpoint_pointer_key(3)
    assert store.read_json(key) is None
    store.put_json(key, {"epoch": 1})
    store.put_json(key, {"epoch": 2})
    assert store.read_json(key) == {"epoch": 2}


def test_deleting_a_prefix_removes_every_object_of_the_job_only(any_store, tmp_path):
    local = tmp_path / "f"
    local.write_bytes(b"x")
    for job_id in (1, 2):
        store.put_file(local, store.checkpoint_key(job_id, 0))
        store.put_json(store.checkpoint_pointer_key(job_id), {"epoch": 0})
    store.delete_prefix(store.job_prefix(1))
    store.delete_prefix(store.job_prefix(99))  # nothing there: no error
    assert store.list_keys("jobs/1") == []
    assert len(store.list_keys("jobs/2")) == 2


def test_a_missing_object_is_file_not_found(any_store, tmp_path):
    url = store.url_for("jobs/5/export.0.pkl")
    assert not store.exists(url)
    with pytest.raises(FileNotFoundError):
        store.read_bytes(url)
    assert not (tmp_path / "out").exists()


def test_an_old_row_with_a_local_path_still_reads(data_dir, tmp_path):
    old = tmp_path / "jobs" / "1" / "export.pkl"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"old bytes")
    assert not store.is_store_url(str(old))
    assert store.read_bytes(str(old)) == b"old bytes"


@pytest.mark.parametrize(
    "url", ["s3://bucket/x", "gs://", "gs:///prefix", "bucket/prefix", "gs://b/p?x=1"]
)
def test_a_malformed_store_url_is_one_line_naming_it(data_dir, monkeypatch, url):
    monkeypatch.setenv("TRAINDECK_STORE", url)
    with pytest.raises(SettingsError) as caught:
        store.store_url()
    message = str(caught.value)
    assert "\n" not in message and repr(url) in message and "gs://BUCKET" in message
    with pytest.raises(store.StoreError, match="is not a store URL"):
        store.validate_store_url(url)


def test_a_missing_bucket_is_named_at_start_up(gcs, monkeypatch):
    monkeypatch.setenv("TRAINDECK_STORE", "gs://no-such-bucket/td")
    with pytest.raises(store.StoreError) as caught:
        store.check_reachable()
    assert "bucket no-such-bucket" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_stopped_store_fails_the_write_and_leaves_no_object(gcs, tmp_path, monkeypatch):
    # gcsfs retries a refused connection six times with back-off (about 30 s a call); the
    # waits are skipped here, the calls and their failure are real.
    import gcsfs.retry

    real_sleep = gcsfs.retry.asyncio.sleep
    monkeypatch.setattr(gcsfs.retry.asyncio, "sleep", lambda _delay: real_sleep(0))
    local = tmp_path / "checkpoint.pth"
    local.write_bytes(os.urandom(100_000))
    key = store.checkpoint_key(4, 2)
    gcs.stop()
    with pytest.raises(store.StoreError) as caught:
        store.put_file(local, key)
    assert "bucket traindeck-test" in str(caught.value)
    gcs.start()
    assert store.list_keys("jobs/4") == []
    assert store.put_file(local, key).bytes == 100_000, "the next upload lands"

"""With a bucket as the store, a registered dataset is packed once into it, named by its
content; a worker's copy is fetched, checked and cached; unregistering removes the archive
once no dataset names it."""

from __future__ import annotations

import tarfile

import pytest

from common import store
from datasets.register import register_folder, unregister_dataset
from db.datasets import get_dataset
from tests.support.images import make_folder_dataset
from worker.dataset_cache import COMPLETE, cache_dir, fetch_archive


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_folder_is_packed_once_fetched_checked_and_removed_with_its_last_dataset(
    engine, database_url, data_dir, gcs
):
    folder = make_folder_dataset(data_dir / "pets", per_class=3)
    register_folder(engine, "pets", folder)
    register_folder(engine, "pets-again", folder)
    first, second = get_dataset(engine, "pets"), get_dataset(engine, "pets-again")
    assert first.archive_url.startswith("gs://traindeck-test/td/datasets/")
    assert first.archive_url == second.archive_url, "the same files: one archive"
    assert first.manifest_sha256 == second.manifest_sha256, "the same files: one manifest"
    assert sorted(store.list_keys("datasets")) == sorted(
        [
            f"datasets/{first.archive_sha256}.tar",
            f"datasets/{first.manifest_sha256}.manifest.json.gz",
        ]
    )

    copy = fetch_archive(first)
    assert copy == cache_dir() / first.archive_sha256 and (copy / COMPLETE).is_file()
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*.png")) == sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*.png")
    )
    assert fetch_archive(second) == copy, "the second job on it reads the cached copy"

    unregister_dataset(engine, "pets")
    assert store.exists(first.archive_url), "still named by pets-again"
    deleted = unregister_dataset(engine, "pets-again")
    assert first.archive_url in deleted and not store.exists(first.archive_url)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_an_archive_that_is_not_the_registered_one_is_refused(engine, database_url, data_dir, gcs):
    from datasets.labelling import DatasetError

    register_folder(engine, "pets", make_folder_dataset(data_dir / "pets", per_class=2))
    dataset = get_dataset(engine, "pets")
    other = data_dir / "other.tar"
    with tarfile.open(other, "w") as tar:
        tar.add(make_folder_dataset(data_dir / "x", per_class=1), arcname=".")
    store.put_file(other, store.dataset_archive_key(dataset.archive_sha256))  # swapped
    with pytest.raises(DatasetError, match="not the one registered"):
        fetch_archive(dataset)
    assert not (cache_dir() / dataset.archive_sha256).exists(), "nothing half-written is used"

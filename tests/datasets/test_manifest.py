"""A dataset's manifest: written at registration, read by the preview without listing or
opening anything, checked by its hash, compared with the files by sizes and times."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from common import cpus, store
from datasets import manifest
from datasets.items import dataset_items, dataset_preview
from datasets.register import register_csv, register_folder, unregister_dataset
from db.datasets import get_dataset
from tests.support.images import make_csv_dataset, make_split_dataset, write_corrupt_png
from tests.support.reads import watch_reads


def test_registration_keeps_the_manifest_in_the_store_beside_the_archive(engine, data_dir):
    root = make_split_dataset(data_dir / "split", train_per_class=3, valid_per_class=2)
    write_corrupt_png(root / "train" / "cat" / "broken.png")
    register_folder(engine, "split", root)
    dataset = get_dataset(engine, "split")

    assert dataset.manifest_url == store.url_for(
        store.dataset_manifest_key(dataset.manifest_sha256)
    )
    data = store.read_bytes(dataset.manifest_url)
    assert hashlib.sha256(data).hexdigest() == dataset.manifest_sha256
    found = manifest.decode(data)
    assert found.classes == ["cat", "dog"]
    assert "train/cat/broken.png" not in found.files, "an undecodable file is left out"
    scanned = dataset_items(dataset)
    assert [(Path(path), label) for path, label in found.items(root).items] == scanned.items
    assert found.valid == scanned.is_valid
    assert found.total_bytes == sum(path.stat().st_size for path, _ in scanned.items)
    assert set(found.folders) == {"", "train", "train/cat", "train/dog", "valid", "valid/cat",
                                  "valid/dog"}  # fmt: skip
    assert manifest.changes(found, root) == []


def test_the_preview_reads_the_manifest_and_lists_no_folder(engine, data_dir, monkeypatch):
    root = make_split_dataset(data_dir / "split", train_per_class=5, valid_per_class=2)
    register_folder(engine, "split", root)
    dataset = get_dataset(engine, "split")
    seen = watch_reads(monkeypatch, root)

    samples, splits = dataset_preview(dataset, count=6)

    assert seen == {"opened": [], "listed": []}
    assert splits == {"train": {"cat": 5, "dog": 5}, "valid": {"cat": 2, "dog": 2}}
    assert [label for _, label in samples] == ["cat", "dog"] * 3
    assert all(path.is_file() and path.is_relative_to(root) for path, _ in samples)


def test_unregistering_removes_the_manifest_once_no_dataset_names_it(engine, data_dir):
    root = make_split_dataset(data_dir / "split")
    register_folder(engine, "first", root)
    register_folder(engine, "second", root)  # the same files: the same manifest
    url = get_dataset(engine, "first").manifest_url
    assert get_dataset(engine, "second").manifest_url == url

    unregister_dataset(engine, "first")
    assert store.exists(url)
    assert url in unregister_dataset(engine, "second")
    assert not store.exists(url)


def test_an_altered_or_missing_manifest_is_not_used(engine, data_dir):
    root = make_split_dataset(data_dir / "split")
    register_folder(engine, "split", root)
    dataset = get_dataset(engine, "split")

    assert manifest.load(dataset.manifest_url, "0" * 64) is None
    store.delete(dataset.manifest_url)
    assert manifest.load(dataset.manifest_url, dataset.manifest_sha256) is None


def test_a_changed_labels_csv_is_a_change(engine, data_dir):
    csv_file = make_csv_dataset(data_dir / "listed", per_class=3)
    register_csv(engine, "listed", csv_file)
    dataset = get_dataset(engine, "listed")
    found = manifest.load(dataset.manifest_url, dataset.manifest_sha256)
    assert manifest.changes(found, csv_file.parent) == []

    with open(csv_file, "a", encoding="utf-8") as labels:
        labels.write("pics/cat-0.png,dog\n")
    assert manifest.changes(found, csv_file.parent) == ["labels.csv (changed)"]


def test_the_checks_run_in_bounded_chunks(monkeypatch):
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 2)
    calls: list[int] = []

    def work(part):
        calls.append(len(part))
        return [os.getpid() for _ in part]

    chunks = cpus.map_in_chunks(work, range(1000), 10)
    first = next(chunks)
    assert len(first) == 10
    assert len(calls) <= 4, "at most two chunks per thread submitted before one is taken"
    assert sum(len(chunk) for chunk in chunks) == 990

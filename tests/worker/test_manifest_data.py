"""A job's DataLoaders from the dataset's manifest: nothing listed or opened before the first
batch, a changed folder registered again, a file that stops decoding skipped and counted."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
import torch
from fastai.data.block import CategoryBlock, DataBlock, TransformBlock
from fastai.data.core import Datasets
from fastai.data.transforms import (
    Categorize,
    IndexSplitter,
    IntToFloatTensor,
    ItemGetter,
    RandomSplitter,
    ToTensor,
)
from fastai.torch_core import set_seed
from fastai.vision.augment import Normalize, Resize
from fastai.vision.core import PILImage, imagenet_stats

from common import store
from datasets.images import open_image
from datasets.item_table import ItemTable
from datasets.register import register_folder
from db import queue
from db.datasets import get_dataset
from db.results import get_results
from db.spec import JobSpec
from db.telemetry import events_since
from tests.support.images import make_folder_dataset, make_split_dataset, write_image
from tests.support.reads import watch_reads
from tests.support.workers import (
    child_pids,
    output_tail,
    start_worker,
    wait_for,
    wait_until_stopped_at,
)
from worker import data
from worker.data import build_dataloaders, load_items
from worker.failpoints import VALIDATION_STARTED
from worker.skipped import RECORD_NAME, SkipRecord, report, skipped_files

CPU = torch.device("cpu")
SPEC = JobSpec(bs=4, img_size=16, device="cpu", augment=False)


def test_the_worker_opens_no_image_and_lists_no_folder_before_the_first_batch(
    sqlite_engine, data_dir, monkeypatch
):
    root = make_folder_dataset(data_dir / "animals", per_class=6)
    register_folder(sqlite_engine, "animals", root)
    seen = watch_reads(monkeypatch, root)

    items = load_items(sqlite_engine, "animals")
    dls = build_dataloaders(items, SPEC, CPU, SkipRecord(data_dir / RECORD_NAME))
    assert seen == {"opened": [], "listed": []}
    assert len(dls.train_ds) + len(dls.valid_ds) == 12 and dls.vocab == ["cat", "dog"]

    images, labels = dls.train.one_batch()
    assert images.shape == (4, 3, 16, 16) and labels.shape == (4,)
    assert len(seen["opened"]) == 4, "the first batch opens its own four images, no more"
    assert seen["listed"] == []


def test_the_loaders_are_those_fastai_makes_from_the_first_image(sqlite_engine, data_dir):
    root = make_folder_dataset(data_dir / "animals", per_class=6)
    register_folder(sqlite_engine, "animals", root)
    items = load_items(sqlite_engine, "animals")
    ours = build_dataloaders(items, SPEC, CPU, SkipRecord(data_dir / RECORD_NAME))

    block = DataBlock(  # as fastai's documentation builds them, looking at the first image
        blocks=(
            TransformBlock(type_tfms=[open_image, PILImage.create], batch_tfms=IntToFloatTensor),
            CategoryBlock,
        ),
        get_items=lambda _source: items.items,
        get_x=ItemGetter(0),
        get_y=ItemGetter(1),
        splitter=RandomSplitter(valid_pct=SPEC.valid_pct, seed=SPEC.seed),
        item_tfms=Resize(SPEC.img_size),
        batch_tfms=[Normalize.from_stats(*imagenet_stats)],
    )
    theirs = block.dataloaders(None, bs=SPEC.bs, device=CPU, num_workers=0)

    def described(dls) -> tuple:
        return (
            [part.types for part in dls.train_ds.tls],
            dls.train._types,
            dls.n_inp,
            list(dls.vocab),
            list(dls.train_ds.items),
            list(dls.valid_ds.items),
            [type(step).__name__ for step in dls.train.after_item.fs],
            [type(step).__name__ for step in dls.train.after_batch.fs],
        )

    assert described(ours) == described(theirs)


def _fastai_split_loaders(items, spec, splitter):
    """The DataLoaders as the worker made them before `ItemTable`: fastai's Datasets over a
    list of (path, label) pairs, split by fastai's own splitter."""
    pairs = list(items.items)
    tfms = [
        [ItemGetter(0), open_image, PILImage.create],
        [ItemGetter(1), Categorize(items.classes)],
    ]
    splits = [[int(index) for index in part] for part in splitter(pairs)]
    dsets = Datasets(pairs, tfms, splits=splits)
    return dsets.dataloaders(
        bs=spec.bs, device=CPU, num_workers=0, after_item=[Resize(spec.img_size), ToTensor()]
    )


def _epoch_order(dl) -> list[tuple[str, str]]:
    return [tuple(map(str, dl.items[index])) for index in dl.get_idxs()]


@pytest.mark.parametrize("fixed_split", [False, True], ids=["random-split", "fixed-split"])
def test_the_items_labels_split_and_order_are_fastais(sqlite_engine, data_dir, fixed_split):
    """The compact table changes no training result: the same items in each part, the same
    labels, and the same shuffled order for a seed as fastai's lists of pairs give."""
    if fixed_split:
        root = make_split_dataset(data_dir / "d", ("cat", "dog", "fox"), 7, 3)
    else:
        root = make_folder_dataset(data_dir / "d", ("cat", "dog", "fox"), per_class=9)
    register_folder(sqlite_engine, "d", root)
    items = load_items(sqlite_engine, "d")
    assert isinstance(items.items, ItemTable)
    if fixed_split:
        splitter = IndexSplitter([i for i, flag in enumerate(items.is_valid) if flag])
    else:
        splitter = RandomSplitter(valid_pct=SPEC.valid_pct, seed=SPEC.seed)

    set_seed(SPEC.seed)
    ours = build_dataloaders(items, SPEC, CPU)
    after_ours = torch.rand(3)
    set_seed(SPEC.seed)
    theirs = _fastai_split_loaders(items, SPEC, splitter)
    after_theirs = torch.rand(3)

    assert torch.equal(after_ours, after_theirs), "the split leaves torch's generator alike"
    for part in (0, 1):
        assert list(ours[part].items) == list(theirs[part].items)
        assert [y for _, y in ours[part].dataset] == [y for _, y in theirs[part].dataset]
    for epoch in range(2):
        assert _epoch_order(ours.train) == _epoch_order(theirs.train), f"epoch {epoch}"
    assert _epoch_order(ours.valid) == _epoch_order(theirs.valid)
    assert ours.vocab == theirs.vocab
    assert torch.equal(ours.valid.one_batch()[1], theirs.valid.one_batch()[1])


def test_the_loaders_keep_no_list_per_image(sqlite_engine, data_dir):
    """Each part of the split is a view of one table: no list of pairs, paths or indices."""
    root = make_folder_dataset(data_dir / "animals", per_class=6)
    register_folder(sqlite_engine, "animals", root)
    dls = build_dataloaders(load_items(sqlite_engine, "animals"), SPEC, CPU)
    for dl in dls.loaders:
        for part in dl.dataset.tls:
            assert isinstance(part.items, ItemTable)
            assert all(isinstance(split, slice) for split in part.splits)
    assert len(dls.train_ds) == 10 and len(dls.valid_ds) == 2
    # What the export pickles keeps the steps and none of the items.
    empty = dls.new_empty()
    assert all(len(dl.dataset) == 0 for dl in empty.loaders)
    assert not any(
        isinstance(part.items, ItemTable) for dl in empty.loaders for part in dl.dataset.tls
    )


def test_random_split_is_fastais_random_splitter():
    for count, valid_pct, seed in ((10, 0.2, 42), (1_001, 0.25, 7), (5, 0.0, 0), (3, 0.5, 1)):
        torch.manual_seed(999)
        train, valid = data.random_split(count, valid_pct, seed)
        after = torch.rand(2)
        torch.manual_seed(999)
        their_train, their_valid = RandomSplitter(valid_pct=valid_pct, seed=seed)(range(count))
        assert torch.equal(after, torch.rand(2))
        assert train.tolist() == list(their_train) and valid.tolist() == list(their_valid)


def test_a_folder_changed_after_registration_is_noticed_and_registered_again(
    sqlite_engine, data_dir, caplog
):
    root = make_folder_dataset(data_dir / "animals", ("cat", "dog"), per_class=4)
    # The folders' times from before registration, so that the file added below changes
    # them whatever the clock's granularity.
    for folder in (root / "cat", root / "dog"):
        os.utime(folder, ns=(0, 0))
    register_folder(sqlite_engine, "animals", root)
    before = get_dataset(sqlite_engine, "animals")
    caplog.set_level(logging.WARNING)

    load_items(sqlite_engine, "animals")
    assert not caplog.records, "an unchanged folder is not registered again"

    (root / "cat" / "000.png").unlink()
    write_image(root / "dog" / "001.png", (1, 2, 3), size=20)  # another size
    write_image(root / "cat" / "new.png", (200, 40, 40))
    items = load_items(sqlite_engine, "animals")

    (message,) = [record.getMessage() for record in caplog.records]
    assert message.startswith("dataset 'animals' changed since it was registered (3 differences: ")
    for change in (
        "cat/ (files added or removed)",
        "cat/000.png (removed)",
        "dog/001.png (changed)",
    ):
        assert change in message
    assert "registered it again: 8 images in 2 classes" in message
    names = sorted(Path(path).relative_to(root).as_posix() for path, _ in items.items)
    assert "cat/new.png" in names and "cat/000.png" not in names and len(names) == 8

    after = get_dataset(sqlite_engine, "animals")
    assert after.manifest_sha256 != before.manifest_sha256
    assert store.exists(after.manifest_url) and not store.exists(before.manifest_url)
    caplog.clear()
    load_items(sqlite_engine, "animals")
    assert not caplog.records, "registered again once"


def test_a_dataset_registered_before_manifests_gets_one_at_its_first_job(
    sqlite_engine, data_dir, caplog
):
    root = make_folder_dataset(data_dir / "animals", per_class=3)
    register_folder(sqlite_engine, "animals", root)
    store.delete(get_dataset(sqlite_engine, "animals").manifest_url)
    caplog.set_level(logging.WARNING)

    assert len(load_items(sqlite_engine, "animals").items) == 6
    (message,) = [record.getMessage() for record in caplog.records]
    assert "has no manifest in the store" in message and "registered it again" in message
    assert store.exists(get_dataset(sqlite_engine, "animals").manifest_url)


@pytest.mark.parametrize("loader_processes", [False, True], ids=["in-process", "worker-processes"])
def test_a_file_that_stops_decoding_is_skipped_and_counted(
    sqlite_engine, data_dir, caplog, monkeypatch, loader_processes
):
    if loader_processes:  # as for a large dataset: the images are read in DataLoader workers
        monkeypatch.setattr(data, "SMALL_DATASET_ITEMS", 0)
        monkeypatch.setattr(data, "usable_cpus", lambda: 2)  # one worker, on any machine
    root = make_split_dataset(data_dir / "split", train_per_class=4, valid_per_class=3)
    register_folder(sqlite_engine, "split", root)
    record = SkipRecord(data_dir / RECORD_NAME)
    dls = build_dataloaders(load_items(sqlite_engine, "split"), SPEC, CPU, record)
    assert (dls.valid.fake_l.num_workers > 0) == loader_processes
    broken = root / "valid" / "dog" / "002.png"
    broken.write_bytes(broken.read_bytes()[:40])  # damaged after registration

    seen = sum(len(labels) for _, labels in dls.valid)
    assert seen == 5, "six validation images, one left out of its batch"
    caplog.set_level(logging.WARNING)
    report(record)
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"skipped 1 file that could not be decoded when read: {broken} (")
    assert message.endswith("(1 skipped in this job so far)")

    assert sum(len(labels) for _, labels in dls.valid) == 5, "read again: skipped again"
    assert skipped_files(dls.valid.new(shuffle=False)) == {str(broken)}, "counted once"


@pytest.mark.slow
def test_a_file_that_stops_decoding_mid_training_is_skipped_counted_and_the_job_succeeds(
    sqlite_engine, data_dir
):
    root = make_split_dataset(data_dir / "split", train_per_class=8, valid_per_class=4, size=16)
    register_folder(sqlite_engine, "split", root)
    spec = {"dataset": "split", "arch": "resnet18", "img_size": 16, "bs": 4, "epochs": 2}
    job_id = queue.submit(sqlite_engine, {**spec, "device": "cpu", "augment": False})
    armed = VALIDATION_STARTED  # the first epoch trained; its first validation batch read
    worker = start_worker("--once", "--device", "cpu", TRAINDECK_FAILPOINTS=armed)
    try:
        (child,) = wait_for(lambda: child_pids(worker.pid), 120, "the job's process")
        wait_until_stopped_at(child, armed, lambda: output_tail(worker))
        broken = root / "valid" / "dog" / "003.png"  # in the last validation batch
        broken.write_bytes(broken.read_bytes()[:40])
        os.kill(child, signal.SIGCONT)
        output, _ = worker.communicate(timeout=600)
    finally:
        worker.kill()
    assert worker.returncode == 0, output[-3000:]

    job = queue.get_job(sqlite_engine, job_id)
    assert job.status == "succeeded", job.error
    messages = [event.message for event in events_since(sqlite_engine, job_id)]
    skips = [m for m in messages if m.startswith("skipped ")]
    assert skips == [
        f"skipped 1 file that could not be decoded when read: {broken} ("
        + skips[0].split(f"{broken} (", 1)[1]
    ]
    assert skips[0].endswith("(1 skipped in this job so far)")
    result = get_results(sqlite_engine, job_id)
    assert result is not None, "\n".join(messages)
    predictions = result.predictions
    assert len(predictions) == 7 and str(broken) not in {row[0] for row in predictions}

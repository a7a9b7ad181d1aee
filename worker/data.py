"""fastai DataLoaders for a job, from the dataset's manifest (`datasets.manifest`).

Before the first batch nothing is listed, decoded or opened: the manifest names the files and
their labels, and fastai's one-item type probe runs on a blank in-memory image. A file that no
longer decodes when a batch reads it is skipped and reported (`worker.skipped`).
"""

from __future__ import annotations

import io
import logging
from typing import Any

import numpy as np
import torch
from fastai.data.core import DataLoaders, Datasets, TfmdDL
from fastai.data.transforms import (
    Categorize,
    IntToFloatTensor,
    ItemGetter,
    ToTensor,
)
from fastai.torch_core import to_device
from fastai.vision.augment import Normalize, Resize, aug_transforms
from fastai.vision.core import PILImage, imagenet_stats
from fasttransform.cast import explode_types

from common import config
from common.cpus import usable_cpus
from common.memory import release_freed_memory
from datasets.builtin import ensure_digits
from datasets.folders import local_root
from datasets.images import open_image
from datasets.item_table import ItemTable
from datasets.labelling import DatasetError, LabelledItems, scan_items
from datasets.register import current_manifest
from db.datasets import get_dataset
from db.engine import Engine
from db.spec import JobSpec, batch_size_problem, training_images
from worker.augment import XlaAugment
from worker.dataset_cache import fetch_archive
from worker.fetch import fetch_url_dataset
from worker.skipped import OpenOrSkip, SkipRecord

log = logging.getLogger(__name__)

__all__ = ["build_dataloaders", "load_items", "loader_workers", "random_split", "usable_cpus"]

SMALL_DATASET_ITEMS = 5_000
MAX_LOADER_WORKERS = 16
PROBE_PX = 8


def load_items(engine: Engine, dataset_name: str) -> LabelledItems:
    """The dataset's labelled images as files on this machine, from its manifest (fetching a
    `url` dataset or an archive first). A folder changed since registration, or a dataset
    without a manifest, is registered again, and the job's log says so."""
    dataset = get_dataset(engine, dataset_name)
    if dataset_name == "digits" and (dataset is None or dataset.kind == "builtin"):
        # Built in: written on whichever machine trains, wherever the registry says it is.
        return scan_items(ensure_digits(), {"type": "folder"})
    if dataset is None:
        raise DatasetError(f"dataset {dataset_name!r} is not registered")
    if dataset.archive_url:
        # Packed into the store where it was registered, and checked by its hash.
        root = fetch_archive(dataset)
    elif dataset.kind == "url":
        root = fetch_url_dataset(dataset, engine)
        dataset = get_dataset(engine, dataset_name) or dataset
    else:
        root = local_root(dataset)
        if not root.is_dir():
            raise DatasetError(f"dataset {dataset.name!r}: folder {root} does not exist here")
    manifest, message = current_manifest(engine, dataset, root, compare=not dataset.archive_url)
    if message:
        log.warning("%s", message)
    items = manifest.items(root)
    # The manifest's lists (every file's name, size and time) are freed here: give their
    # pages back, or glibc keeps them for the whole job (`common.memory`).
    del manifest
    release_freed_memory()
    if len(items.classes) < 2:
        raise DatasetError(f"dataset {dataset.name!r} has fewer than 2 classes at {root}")
    return items


def random_split(count: int, valid_pct: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The training and the validation indices of fastai's `RandomSplitter(valid_pct, seed)`
    over `count` items, the same numbers in the same order (it seeds torch's generator and
    holds out the first `int(valid_pct * count)` of a permutation), as arrays: fastai's own
    makes a Python integer of each."""
    torch.manual_seed(seed)
    permutation = torch.randperm(count).numpy()
    cut = int(valid_pct * count)
    return permutation[cut:], permutation[:cut]


def loader_workers(item_count: int, cpus: int | None = None) -> int:
    """DataLoader worker processes: the worker's TRAINDECK_LOADER_WORKERS when set; else none
    for small sets (start-up costs more than it saves; on XLA the prefetch thread loads
    them), else one per spare CPU, leaving one for the training loop, at most
    MAX_LOADER_WORKERS."""
    chosen = config.loader_workers()
    if chosen is not None:
        return chosen
    if item_count < SMALL_DATASET_ITEMS:
        return 0
    return max(0, min(MAX_LOADER_WORKERS, (cpus or usable_cpus()) - 1))


def augmentation(spec: JobSpec, device: torch.device) -> list[Any]:
    """fastai's aug_transforms; on an XLA device the same augmentations in a form XLA runs
    whole (host-drawn parameters, no CPU fallback, one graph per step: `worker.augment`)."""
    if device.type == "xla":
        log.info(
            "augmentation on the XLA device: fastai's aug_transforms (flip, rotation, zoom, "
            "perspective warp, lighting), its random numbers drawn on the host for each batch"
        )
        return [XlaAugment(spec.img_size, seed=spec.seed)]
    return aug_transforms(size=spec.img_size)


def _blank_png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (PROBE_PX, PROBE_PX)).save(buffer, format="PNG")
    return buffer.getvalue()


def _set_up(dsets: Datasets, sample: tuple[Any, ...]) -> None:
    """fastai's `TfmdLists.setup`, which runs the first training item through the type
    transforms to learn their types, with `sample` in its place (a blank in-memory image and
    a real label): the types are the same, and no file of the dataset is opened."""
    for part in dsets.tls:
        # Not on the training part: no step learns from the data (the classes are given), and
        # that part would be a copy of every training item.
        part.tfms.setup(part, train_setup=False)
        part.types, x = [], sample
        for step in part.tfms.fs:
            part.types.append(getattr(step, "input_types", type(x)))
            x = step(x)
        part.types.append(type(x))


def _probe_types(dl: TfmdDL, dsets: Datasets, sample: tuple[Any, ...]) -> None:
    """What fastai's `TfmdDL._one_pass` learns from the first item (the batch's types, and
    how many are inputs), learnt from `sample` instead."""
    item = tuple(part.tfms(sample) for part in dsets.tls)
    done = dl.after_batch(to_device(dl.do_batch([dl.after_item(item)]), dl.device))
    dl._n_inp = 1 if not isinstance(done, (list, tuple)) or len(done) == 1 else len(done) - 1
    dl._types = explode_types(done)


def build_dataloaders(
    items: LabelledItems,
    spec: JobSpec,
    device: torch.device,
    record: SkipRecord | None = None,
) -> DataLoaders:
    """The job's training and validation DataLoaders, as fastai's ImageBlock and CategoryBlock
    make them, built without opening a file. Each image is read by `open_image` (upright, 8
    bits), as predictions and thumbnails read it (PILImage.create alone ignores EXIF and clips
    16-bit values); with `record`, a file that does not decode then is skipped and recorded
    there (`worker.skipped`). The export pickles these steps, so
    `datasets.images.open_image` must stay importable by that name for a model to load."""
    if len(items.items) < 2 or len(items.classes) < 2:
        raise DatasetError(
            f"dataset {spec.dataset!r} needs at least 2 classes of readable images; found "
            f"{len(items.items)} images in {len(items.classes)} classes"
        )
    table = items.items if isinstance(items.items, ItemTable) else ItemTable.from_pairs(items.items)
    count = len(table)
    if items.is_valid is not None:
        flags = np.asarray(items.is_valid, dtype=bool)
        training_count = count - int(flags.sum())
    else:
        flags = None
        training_count = training_images(count, spec.valid_pct)
    problem = batch_size_problem(spec.bs, training_count, spec.dataset)
    if problem:
        raise DatasetError(problem)
    batch_tfms = augmentation(spec, device) if spec.augment else []
    opener = OpenOrSkip(record) if record is not None else open_image
    # The classes given: fastai would otherwise read every label to find them.
    tfms = [[ItemGetter(0), opener, PILImage.create], [ItemGetter(1), Categorize(items.classes)]]
    if flags is not None:  # as fastai's IndexSplitter splits
        train_indices, valid_indices = np.flatnonzero(~flags), np.flatnonzero(flags)
    else:
        train_indices, valid_indices = random_split(count, spec.valid_pct, spec.seed)
    # The training items first, then the validation ones, so that each part is a slice: the
    # parts are views of one index array, where fastai would make lists of ints and of items.
    ordered = table.take(np.concatenate((train_indices, valid_indices)))
    parts = [slice(0, len(train_indices)), slice(len(train_indices), count)]
    dsets = Datasets(ordered, tfms, splits=parts, do_setup=False)
    sample = (_blank_png(), table.label(0))
    _set_up(dsets, sample)
    workers = loader_workers(count)
    log.info("%d DataLoader worker process(es) load the images (TRAINDECK_LOADER_WORKERS)", workers)
    train = TfmdDL(
        dsets.subset(0),
        bs=spec.bs,
        shuffle=True,
        drop_last=True,
        device=device,
        num_workers=workers,
        after_item=[Resize(spec.img_size), ToTensor()],
        after_batch=[IntToFloatTensor(), *batch_tfms, Normalize.from_stats(*imagenet_stats)],
    )
    _probe_types(train, dsets, sample)
    valid = train.new(dsets.subset(1), bs=spec.bs, shuffle=False, drop_last=False, n=None)
    del train_indices, valid_indices  # the split's arrays, copied into `ordered`
    release_freed_memory()
    return DataLoaders(train, valid, path=".", device=device)

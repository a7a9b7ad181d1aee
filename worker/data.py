"""fastai DataLoaders for a job, from the labelled images `datasets.items` lists."""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from fastai.data.block import CategoryBlock, DataBlock, TransformBlock
from fastai.data.core import DataLoaders
from fastai.data.transforms import IndexSplitter, IntToFloatTensor, ItemGetter, RandomSplitter
from fastai.vision.augment import Normalize, Resize, aug_transforms
from fastai.vision.core import PILImage, imagenet_stats
from PIL import Image

from datasets.builtin import ensure_digits
from datasets.images import open_image
from datasets.items import dataset_items
from datasets.labelling import DatasetError, LabelledItems, scan_items
from db.datasets import get_dataset
from db.engine import Engine
from db.spec import JobSpec, batch_size_problem, training_images
from worker.augment import XlaAugment
from worker.dataset_cache import fetch_archive
from worker.fetch import load_dataset_items

log = logging.getLogger(__name__)

SMALL_DATASET_ITEMS = 5_000
MAX_LOADER_WORKERS = 16


def load_items(engine: Engine, dataset_name: str) -> LabelledItems:
    """The dataset's labelled images as files on this machine (fetching a `url` one)."""
    dataset = get_dataset(engine, dataset_name)
    if dataset_name == "digits" and (dataset is None or dataset.kind == "builtin"):
        # Built in: written on whichever machine trains, wherever the registry says it is.
        return scan_items(ensure_digits(), {"type": "folder"})
    if dataset is None:
        raise DatasetError(f"dataset {dataset_name!r} is not registered")
    if dataset.archive_url:
        # Packed into the store where it was registered: read from this worker's copy.
        return dataset_items(dataset, fetch_archive(dataset))
    return load_dataset_items(dataset, engine)


def image_block() -> TransformBlock:
    """fastai's ImageBlock, reading each file with `open_image` (upright, 8 bits) as
    predictions and thumbnails do: PILImage.create alone ignores EXIF and clips 16-bit values.

    The export pickles these steps, so `datasets.images.open_image` must stay importable by that
    name for a model to load."""
    return TransformBlock(type_tfms=[open_image, PILImage.create], batch_tfms=IntToFloatTensor)


def _decodes(path: Path) -> bool:
    try:
        with Image.open(path) as image:
            image.verify()
        return True
    except Exception:
        return False


def drop_undecodable(items: LabelledItems) -> LabelledItems:
    """Leave out files PIL cannot read, so one bad file never stops a job."""
    paths = [path for path, _ in items.items]
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) * 2)) as pool:
        readable = list(pool.map(_decodes, paths))
    if all(readable):
        return items
    kept = [item for item, ok in zip(items.items, readable, strict=True) if ok]
    flags = None
    if items.is_valid is not None:
        flags = [flag for flag, ok in zip(items.is_valid, readable, strict=True) if ok]
    skipped = items.skipped + [
        str(path) for path, ok in zip(paths, readable, strict=True) if not ok
    ]
    return LabelledItems(kept, flags, skipped)


def usable_cpus() -> int:
    """CPUs this process may run on: a container or `taskset` may allow fewer than exist."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def loader_workers(item_count: int, cpus: int | None = None) -> int:
    """DataLoader worker processes: none for small sets (start-up costs more than it saves;
    on XLA the prefetch thread loads them), else one per spare CPU, leaving one for the
    training loop, at most MAX_LOADER_WORKERS."""
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


def build_dataloaders(items: LabelledItems, spec: JobSpec, device: torch.device) -> DataLoaders:
    if len(items.items) < 2 or len(items.classes) < 2:
        raise DatasetError(
            f"dataset {spec.dataset!r} needs at least 2 classes of readable images; found "
            f"{len(items.items)} images in {len(items.classes)} classes"
        )
    all_items = items.items
    if items.is_valid is not None:
        valid_indices = [i for i, flag in enumerate(items.is_valid) if flag]
        splitter = IndexSplitter(valid_indices)
        training_count = len(all_items) - len(valid_indices)
    else:
        splitter = RandomSplitter(valid_pct=spec.valid_pct, seed=spec.seed)
        training_count = training_images(len(all_items), spec.valid_pct)
    problem = batch_size_problem(spec.bs, training_count, spec.dataset)
    if problem:
        raise DatasetError(problem)
    batch_tfms = augmentation(spec, device) if spec.augment else []
    batch_tfms.append(Normalize.from_stats(*imagenet_stats))
    block = DataBlock(
        blocks=(image_block(), CategoryBlock),
        get_items=lambda _source: all_items,
        get_x=ItemGetter(0),
        get_y=ItemGetter(1),
        splitter=splitter,
        item_tfms=Resize(spec.img_size),
        batch_tfms=batch_tfms,
    )
    dls = block.dataloaders(
        None,
        bs=spec.bs,
        device=device,
        num_workers=loader_workers(len(all_items)),
    )
    return dls

"""The labelled images of a registered dataset: the Datasets page's preview (from the
manifest, `datasets.manifest`), and a scan of its folder for a row from before manifests.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from datasets import manifest
from datasets.folders import local_root
from datasets.labelling import (
    DatasetError,
    LabelledItems,
    detect_label_rule,
    scan_items,
)
from db.models import Dataset


def concrete_rule(dataset: Dataset, root: Path) -> dict[str, Any]:
    rule = dict(dataset.label_rule or {"type": "folder"})
    if rule.get("type") == "auto":
        return detect_label_rule(root, rule.get("label_regex"))
    return rule


def dataset_items(dataset: Dataset, location: Path | None = None) -> LabelledItems:
    """The labelled images of a registered dataset, read from its folder on this machine
    (`location` overrides it: the folder `fetch_url_dataset` returned for a `url` dataset).

    Files recorded as undecodable at registration are left out and listed in `skipped`.
    """
    root = Path(location) if location is not None else local_root(dataset)
    if not root.is_dir():
        raise DatasetError(f"dataset {dataset.name!r}: folder {root} does not exist here")
    try:
        items = scan_items(root, concrete_rule(dataset, root))
    except DatasetError as exc:
        raise DatasetError(f"dataset {dataset.name!r}: {exc}") from None
    bad = set(dataset.bad_files or [])
    if bad:
        kept: list[tuple[Path, str]] = []
        flags: list[bool] = []
        skipped = list(items.skipped)
        for index, (path, label) in enumerate(items.items):
            relative = path.relative_to(root).as_posix()
            if relative in bad:
                skipped.append(f"{relative} (cannot be decoded)")
                continue
            kept.append((path, label))
            if items.is_valid is not None:
                flags.append(items.is_valid[index])
        items = LabelledItems(kept, flags if items.is_valid is not None else None, skipped)
    if len(items.classes) < 2:
        raise DatasetError(f"dataset {dataset.name!r} has fewer than 2 classes at {root}")
    return items


def preview_items(
    dataset: Dataset, count: int = 24, seed: int = 0, location: Path | None = None
) -> list[tuple[Path, str]]:
    """Up to `count` sample images, taken from every class in turn so each class shows."""
    return dataset_preview(dataset, count, seed, location)[0]


def dataset_preview(
    dataset: Dataset, count: int = 24, seed: int = 0, location: Path | None = None
) -> tuple[list[tuple[Path, str]], dict[str, dict[str, int]] | None]:
    """Sample images (from every class in turn) and the per-split class counts, read from the
    dataset's manifest: no folder is listed and no image opened. A row from before manifests
    is scanned instead."""
    root = Path(location) if location is not None else local_root(dataset)
    found = None
    if dataset.manifest_url and dataset.manifest_sha256:
        found = manifest.load(dataset.manifest_url, dataset.manifest_sha256)
    items = found.items(root) if found is not None else dataset_items(dataset, root)
    by_class: dict[str, list[Path | str]] = {}
    for path, label in items.items:
        by_class.setdefault(label, []).append(path)
    rng = random.Random(seed)
    queues = {label: rng.sample(paths, len(paths)) for label, paths in sorted(by_class.items())}
    chosen: list[tuple[Path, str]] = []
    while len(chosen) < count and any(queues.values()):
        for label, paths in queues.items():
            if paths and len(chosen) < count:
                chosen.append((Path(paths.pop()), label))
    return chosen, split_counts(items)


def split_counts(items: LabelledItems) -> dict[str, dict[str, int]] | None:
    """Images per class in the training and the validation part of a fixed split."""
    if items.is_valid is None:
        return None
    counts: dict[str, dict[str, int]] = {"train": {}, "valid": {}}
    for (_, label), flag in zip(items.items, items.is_valid, strict=True):
        part = counts["valid" if flag else "train"]
        part[label] = part.get(label, 0) + 1
    return counts

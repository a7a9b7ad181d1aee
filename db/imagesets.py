"""Image datasets on disk: the built-in digits set, and counting a folder-per-class layout.

Pure file work with PIL and scikit-learn; no torch, so the dashboard and the CLI can use it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine

from db.datasets import save_dataset
from db.files import datasets_dir
from db.models import Dataset

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
DIGITS_IMAGE_COUNT = 1797


def is_image_name(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES


def digits_dir(root: Path | None = None) -> Path:
    return (root or datasets_dir()) / "digits"


def ensure_digits(root: Path | None = None) -> Path:
    """Write scikit-learn's handwritten digits as PNGs, one folder per class, once.

    The files are written into a temporary folder beside the target and renamed into place,
    so a crash half-way never leaves a partial dataset that looks complete.
    """
    target = digits_dir(root)
    if target.is_dir() and sum(1 for _ in target.glob("*/*.png")) == DIGITS_IMAGE_COUNT:
        return target
    from PIL import Image
    from sklearn.datasets import load_digits

    target.parent.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    staging = Path(tempfile.mkdtemp(prefix=".digits-", dir=target.parent))
    try:
        for index, (pixels, label) in enumerate(zip(digits.images, digits.target, strict=True)):
            class_dir = staging / str(int(label))
            class_dir.mkdir(exist_ok=True)
            grey = (pixels * (255.0 / 16.0)).round().astype("uint8")
            Image.fromarray(grey, mode="L").save(class_dir / f"{index:04d}.png")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def count_folder_classes(root: Path) -> dict[str, int]:
    """Image count per class of a folder-per-class layout (`root/<class>/<image>`)."""
    counts: Counter[str] = Counter()
    for path in root.glob("*/*"):
        if path.is_file() and is_image_name(path):
            counts[path.parent.name] += 1
    return dict(sorted(counts.items()))


def register_builtin_datasets(engine: Engine, root: Path | None = None) -> Path:
    """Materialise the digits set and record it in the registry."""
    location = ensure_digits(root)
    counts = count_folder_classes(location)
    save_dataset(
        engine,
        name="digits",
        kind="builtin",
        location=str(location),
        label_rule={"type": "folder"},
        classes=sorted(counts, key=int),
        class_counts=counts,
    )
    return location


@dataclass(frozen=True)
class LabelledItems:
    """The images of a dataset with their labels, ready for the worker to load.

    `is_valid` is None for a random split (by the job's valid_pct and seed), or one flag per
    item when the dataset fixes its own split (a `train/` and a `valid/` folder).
    """

    items: list[tuple[Path, str]]
    is_valid: list[bool] | None = None
    skipped: list[str] = field(default_factory=list)

    @property
    def classes(self) -> list[str]:
        return sorted({label for _, label in self.items})


class DatasetError(ValueError):
    """A dataset cannot be used as it is; the message says what is wrong with it."""


def folder_per_class_items(root: Path) -> LabelledItems:
    """`root/<class>/<image>` → items labelled by their folder name."""
    items = [
        (path, path.parent.name)
        for path in sorted(root.glob("*/*"))
        if path.is_file() and is_image_name(path)
    ]
    return LabelledItems(items)


def dataset_items(dataset: Dataset) -> LabelledItems:
    """The labelled images of a registered dataset, read from its location on this machine."""
    location = Path(dataset.location)
    if not location.is_dir():
        raise DatasetError(f"dataset {dataset.name!r}: folder {location} does not exist here")
    rule = (dataset.label_rule or {}).get("type", "folder")
    if rule == "folder":
        items = folder_per_class_items(location)
    else:
        raise DatasetError(f"dataset {dataset.name!r}: unknown labelling rule {rule!r}")
    bad = set(dataset.bad_files or [])
    if bad:
        kept = [(path, label) for path, label in items.items if str(path) not in bad]
        items = LabelledItems(kept, None, sorted(bad))
    if len(items.classes) < 2:
        raise DatasetError(f"dataset {dataset.name!r} has fewer than 2 classes at {location}")
    return items

"""The built-in dataset: scikit-learn's handwritten digits written as PNGs, one folder per class."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path

from datasets.folders import digits_dir
from datasets.labelling import (
    is_image_name,
)
from db.datasets import (
    save_dataset,
)
from db.engine import Engine

DIGITS_IMAGE_COUNT = 1797


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
        replace=True,
    )
    return location

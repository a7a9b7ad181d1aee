"""Tiny image sets the dataset tests write for themselves (nothing is downloaded)."""

from __future__ import annotations

import csv
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

# One clear colour per class, so a model can tell the classes apart even in one epoch.
CLASS_COLOURS = [(220, 40, 40), (40, 200, 60), (40, 60, 220), (230, 210, 30), (160, 40, 200)]


def colour_for(index: int) -> tuple[int, int, int]:
    return CLASS_COLOURS[index % len(CLASS_COLOURS)]


def write_image(
    path: Path, colour: tuple[int, int, int], size: int = 12, mode: str = "RGB"
) -> Path:
    """A small image of one colour with a lighter square, in `mode` (RGB, L, RGBA or P)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", (size, size), colour)
    light = tuple(min(255, c + 30) for c in colour)
    image.paste(light, (size // 4, size // 4, size // 2, size // 2))
    if mode == "L":
        image = image.convert("L")
    elif mode == "RGBA":
        image = image.convert("RGBA")
        image.putalpha(200)
    elif mode == "P":
        image = image.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    suffix = path.suffix.lower()
    if suffix in (".jpg", ".jpeg"):
        image.convert("RGB").save(path, quality=90)
    else:
        image.save(path)
    return path


def grey_ramp(low: float, high: float, size: int = 12, dtype: type = np.uint16) -> np.ndarray:
    """size×size values rising evenly from `low` to `high`, row by row."""
    return np.linspace(low, high, size * size).reshape(size, size).astype(dtype)


def write_array(path: Path, values: np.ndarray) -> Path:
    """An image of exactly these values, in the mode their dtype gives (uint16 "I;16", int32
    "I", float32 "F"): a PNG holds 8 or 16 bits, a TIFF any of them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(values).save(path)
    return path


def write_sideways_jpeg(path: Path, orientation: int, size: int = 16) -> Path:
    """A JPEG stored with a dark left half and a light right half, tagged with the EXIF
    `orientation` (6: turn 90° clockwise to view, 8: 90° anticlockwise)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", (size, size), (230, 230, 230))
    image.paste((20, 20, 20), (0, 0, size // 2, size))
    exif = Image.Exif()
    exif[0x0112] = orientation
    image.save(path, quality=95, exif=exif)
    return path


def write_corrupt_png(path: Path) -> Path:
    """A file that claims to be a PNG but is cut off after its header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    good = path.with_name("source-" + path.name)
    write_image(good, (10, 10, 10), size=32)
    data = good.read_bytes()
    good.unlink()
    path.write_bytes(data[: len(data) // 3])
    return path


def make_folder_dataset(
    root: Path,
    classes: tuple[str, ...] = ("cat", "dog"),
    per_class: int = 4,
    size: int = 12,
    modes: tuple[str, ...] = ("RGB",),
) -> Path:
    """`root/<class>/<n>.png`, cycling through the image `modes`."""
    for class_index, name in enumerate(classes):
        for n in range(per_class):
            mode = modes[n % len(modes)]
            write_image(root / name / f"{n:03d}.png", colour_for(class_index), size, mode)
    return root


def make_split_dataset(
    root: Path,
    classes: tuple[str, ...] = ("cat", "dog"),
    train_per_class: int = 4,
    valid_per_class: int = 2,
    valid_name: str = "valid",
    size: int = 12,
) -> Path:
    """`root/train/<class>/…` and `root/<valid_name>/<class>/…` (fastai's GrandparentSplitter)."""
    make_folder_dataset(root / "train", classes, train_per_class, size)
    make_folder_dataset(root / valid_name, classes, valid_per_class, size)
    return root


def make_pets_dataset(
    root: Path,
    breeds: tuple[str, ...] = ("Abyssinian", "great_pyrenees", "american_bulldog"),
    per_breed: int = 4,
    size: int = 12,
) -> Path:
    """The Oxford-IIIT Pets layout: `images/<Breed_name>_<n>.jpg` and an `annotations/`
    folder whose trimaps carry the same names (and must not count as images)."""
    for index, breed in enumerate(breeds):
        for n in range(1, per_breed + 1):
            write_image(root / "images" / f"{breed}_{n}.jpg", colour_for(index), size)
            write_image(root / "annotations" / "trimaps" / f"{breed}_{n}.png", (1, 1, 1), size)
    (root / "annotations" / "list.txt").write_text("# names\n")
    return root


def make_csv_dataset(
    root: Path,
    classes: tuple[str, ...] = ("cat", "dog"),
    per_class: int = 4,
    header: bool = True,
    with_split: bool = False,
    size: int = 12,
) -> Path:
    """`root/pics/<n>.png` and `root/labels.csv` of file,label[,is_valid]. Returns the CSV."""
    rows: list[list[str]] = []
    for class_index, name in enumerate(classes):
        for n in range(per_class):
            relative = f"pics/{name}-{n}.png"
            write_image(root / relative, colour_for(class_index), size)
            row = [relative, name]
            if with_split:
                row.append("true" if n == 0 else "false")
            rows.append(row)
    csv_path = root / "labels.csv"
    with open(csv_path, "w", newline="") as handle:
        writer = csv.writer(handle)
        if header:
            writer.writerow(["file", "label", "is_valid"][: len(rows[0])])
        writer.writerows(rows)
    return csv_path


def zip_folder(folder: Path, zip_path: Path, prefix: str = "") -> Path:
    """Zip every file under `folder`, with member names `prefix` + the relative path."""
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, prefix + path.relative_to(folder).as_posix())
    return zip_path


def files_under(folder: Path) -> set[str]:
    """Every file and folder under `folder`, as relative names (for before/after checks)."""
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*")}

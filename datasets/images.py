"""How traindeck reads an image: turned upright by its EXIF orientation, scaled to 8 bits,
in RGB. Training (`worker.data`), predictions (`inference.model`), the dataset check
(`datasets.validation`) and every preview and thumbnail call `open_image`, so the model is
given what the page shows. PIL and numpy only: the dashboard and the CLI use it too.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps

ImageSource = Path | str | bytes | BinaryIO
# Where `open_image` leaves the file's own mode ('L 16-bit', 'RGB', …) in the image's info.
SOURCE_MODE = "traindeck_source_mode"
FULL_16_BIT = 65535


def mode_label(image: Image.Image) -> str:
    """The file's pixel format, named for a person: 'RGB', 'L 16-bit', 'F 32-bit float'."""
    mode = image.mode
    if mode.startswith("I;16") or (mode == "I" and image.format == "PNG"):
        return "L 16-bit"  # older Pillow opens a 16-bit PNG as "I"
    if mode == "I":
        return "I 32-bit"
    if mode == "F":
        return "F 32-bit float"
    return mode


def _min_max(values: np.ndarray) -> np.ndarray:
    low, high = float(values.min()), float(values.max())
    return (values - low) * (255.0 / (high - low)) if high > low else values * 0.0


def to_8_bit(image: Image.Image) -> Image.Image:
    """`image` itself when it has at most 8 bits per channel, else its 8-bit grey ("L")."""
    if image.mode not in ("I", "F") and not image.mode.startswith("I;"):
        return image
    values = np.nan_to_num(np.asarray(image, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    # PIL's convert("RGB") clips every value above 255, so a 16-bit image comes out white.
    # Integers are scaled by a fixed range, so a dark and a light image of one set stay apart:
    # 16 bits by /257 (0..65535 onto 0..255; a PNG of fewer significant bits is stored scaled
    # to the full range), 32-bit "I" the same when it holds 0..65535 (how 16-bit data is kept
    # in 32 bits). Floats within [0, 1] are ×255. Any other values have no known range and
    # are stretched min-max per image (a flat one comes out black).
    if image.mode == "F":
        fixed = values.min() >= 0.0 and values.max() <= 1.0
        scaled = values * 255.0 if fixed else _min_max(values)
    else:
        fixed = values.min() >= 0.0 and values.max() <= FULL_16_BIT
        scaled = values / 257.0 if fixed else _min_max(values)
    return Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8), mode="L")


def open_image(source: ImageSource, draft: tuple[int, int] | None = None) -> Image.Image:
    """The image in `source` (a path, bytes or a binary file) as upright 8-bit RGB, with its
    file's mode in `info[SOURCE_MODE]`. PIL's errors pass through for the caller to word.

    `draft` lets a JPEG decode at about that size: a check that it reads need not see
    every pixel."""
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    with Image.open(source) as opened:
        if draft is not None:
            opened.draft("RGB", draft)
        mode = mode_label(opened)
        image = to_8_bit(ImageOps.exif_transpose(opened)).convert("RGB")
    image.info[SOURCE_MODE] = mode
    return image

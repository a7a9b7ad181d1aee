"""`datasets.images.open_image`, how every part of traindeck reads an image: more than 8 bits
per channel scaled, not clipped; turned upright by EXIF; 8-bit RGB untouched. And the modes
registration reports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sqlalchemy import Engine

from datasets.images import SOURCE_MODE, open_image
from datasets.validation import image_problem
from tests.support.images import (
    grey_ramp,
    make_folder_dataset,
    write_array,
    write_corrupt_png,
    write_image,
    write_sideways_jpeg,
)
from traindeck.cli import main


def grey(image: Image.Image) -> np.ndarray:
    """The image's first channel (open_image gives grey sources as equal R, G and B)."""
    assert image.mode == "RGB"
    return np.asarray(image)[:, :, 0].astype(int)


@pytest.mark.parametrize("name", ["deep.png", "deep.tif"])
def test_16_bit_grey_is_scaled_by_its_range_not_clipped(tmp_path: Path, name: str) -> None:
    dark = write_array(tmp_path / "dark" / name, grey_ramp(1_000, 20_000))
    light = write_array(tmp_path / "light" / name, grey_ramp(40_000, 65_535))

    dark_pixels, light_pixels = grey(open_image(dark)), grey(open_image(light))

    assert Image.open(dark).mode == "I;16"
    assert dark_pixels.max() < 255 and light_pixels.min() < 255
    assert dark_pixels.max() < light_pixels.min()
    assert np.array_equal(dark_pixels, np.rint(grey_ramp(1_000, 20_000) / 257))
    assert (dark_pixels.min(), light_pixels.max()) == (4, 255)
    assert open_image(dark).info[SOURCE_MODE] == "L 16-bit"


def test_big_endian_16_bit_tiff_reads_as_little_endian_does(tmp_path: Path) -> None:
    values = grey_ramp(1_000, 60_000)
    big = write_array(tmp_path / "big.tif", values.astype(">u2"))

    assert Image.open(big).mode == "I;16B"
    assert np.array_equal(grey(open_image(big)), np.rint(values / 257))


def test_32_bit_integers_of_16_bit_range_scale_as_16_bits_wider_ones_stretch(
    tmp_path: Path,
) -> None:
    narrow = write_array(tmp_path / "narrow.tif", grey_ramp(0, 30_000, dtype=np.int32))
    wide = write_array(tmp_path / "wide.tif", grey_ramp(-50_000, 3_000_000, dtype=np.int32))

    assert grey(open_image(narrow)).max() == round(30_000 / 257)
    stretched = grey(open_image(wide))
    assert (stretched.min(), stretched.max()) == (0, 255)
    assert open_image(wide).info[SOURCE_MODE] == "I 32-bit"


def test_floats_within_0_and_1_scale_by_255_others_stretch(tmp_path: Path) -> None:
    unit = write_array(tmp_path / "unit.tif", grey_ramp(0.0, 0.5, dtype=np.float32))
    wide = write_array(tmp_path / "wide.tif", grey_ramp(-3.0, 40.0, dtype=np.float32))

    assert grey(open_image(unit)).max() == 128
    stretched = grey(open_image(wide))
    assert (stretched.min(), stretched.max()) == (0, 255)
    assert open_image(unit).info[SOURCE_MODE] == "F 32-bit float"


@pytest.mark.parametrize(("orientation", "dark_half"), [(6, "top"), (8, "bottom")])
def test_an_exif_rotated_jpeg_comes_out_upright(
    tmp_path: Path, orientation: int, dark_half: str
) -> None:
    path = write_sideways_jpeg(tmp_path / "phone.jpg", orientation)

    pixels = grey(open_image(path.read_bytes()))

    top, bottom = pixels[:8].mean(), pixels[8:].mean()
    left, right = pixels[:, :8].mean(), pixels[:, 8:].mean()
    assert abs(left - right) < 10
    assert (top < bottom - 100) if dark_half == "top" else (bottom < top - 100)


def test_8_bit_rgb_is_unchanged(tmp_path: Path) -> None:
    path = write_image(tmp_path / "plain.png", (200, 40, 90), size=12)
    with Image.open(path) as original:
        expected = np.asarray(original.convert("RGB"))

    image = open_image(path)

    assert np.array_equal(np.asarray(image), expected)
    assert image.info[SOURCE_MODE] == "RGB"


def test_an_unreadable_file_gets_a_reason_not_a_traceback(tmp_path: Path) -> None:
    broken = write_corrupt_png(tmp_path / "broken.png")

    assert image_problem(broken).startswith("cannot be decoded")
    assert image_problem(write_array(tmp_path / "deep.png", grey_ramp(0, 65_535))) is None


def test_registration_lists_the_modes_it_found(
    sqlite_engine: Engine, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_folder_dataset(data_dir / "scans", ("a", "b"), per_class=2)
    for n in range(3):
        write_array(root / "a" / f"deep-{n}.png", grey_ramp(0, 65_535))
    write_array(root / "b" / "float.tif", grey_ramp(0.0, 1.0, dtype=np.float32))

    assert main(["dataset", "add", "scans", "--folder", str(root)]) == 0
    assert "modes: RGB ×4, L 16-bit ×3, F 32-bit float ×1" in capsys.readouterr().out
    assert main(["dataset", "add", "scans2", "--folder", str(root), "--json"]) == 0
    modes = json.loads(capsys.readouterr().out)["modes"]
    assert modes == {"RGB": 4, "L 16-bit": 3, "F 32-bit float": 1}

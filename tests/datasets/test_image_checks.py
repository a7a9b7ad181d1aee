"""Checking a dataset's images costs at most what the settings allow: an image with too many
pixels is refused from its header, unread (TRAINDECK_IMAGE_MAX_MEGAPIXELS), and one dataset's
check decodes at most TRAINDECK_CHECK_MAX_MEGAPIXELS. The costs are counted in pixels, never
timed."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import Engine

from datasets.image_checks import BATCH_IMAGES, PixelLimits, check_images
from datasets.labelling import DatasetError
from datasets.register import register_folder, register_zip
from datasets.validation import check_image
from db.datasets import get_dataset
from tests.support.images import colour_for, make_folder_dataset, write_corrupt_png, write_image

HUGE = 12_000
HUGE_REASON = (
    "is 12,000×12,000 pixels (144 megapixels); the limit is 50 megapixels per image (an admin "
    "can raise it with TRAINDECK_IMAGE_MAX_MEGAPIXELS)"
)


def write_huge_png(path: Path) -> Path:
    """A 12000×12000 PNG of one bit per pixel, all zeros: about 20 KB to send, 144 megapixels
    (and over 400 MB in RGB) to decode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("1", (HUGE, HUGE)).save(path)
    return path


def test_a_12000_pixel_square_png_is_refused_from_its_header(
    sqlite_engine: Engine, data_dir: Path
) -> None:
    root = make_folder_dataset(data_dir / "shapes", per_class=3)
    huge = write_huge_png(root / "cat" / "huge.png")
    assert huge.stat().st_size < 600_000

    registration = register_folder(sqlite_engine, "shapes", root)

    assert registration.report.bad_files == {"cat/huge.png": HUGE_REASON}
    assert get_dataset(sqlite_engine, "shapes").bad_files == ["cat/huge.png"]
    assert get_dataset(sqlite_engine, "shapes").class_counts == {"cat": 3, "dog": 3}
    # Only the six 12×12 images were decoded.
    assert registration.report.decoded_pixels == 6 * 12 * 12
    assert "cat/huge.png (is 12,000×12,000 pixels" in registration.summary()


def test_a_small_zip_of_huge_pngs_costs_only_their_headers(
    sqlite_engine: Engine, data_dir: Path, tmp_path: Path
) -> None:
    huge = write_huge_png(tmp_path / "huge.png").read_bytes()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for label in ("cat", "dog"):
            for n in range(2):
                small = io.BytesIO()
                Image.new("RGB", (12, 12), colour_for(n)).save(small, "PNG")
                archive.writestr(f"{label}/{n}.png", small.getvalue())
            for n in range(40):
                archive.writestr(f"{label}/huge-{n}.png", huge)
    assert len(buffer.getvalue()) < 2_000_000

    registration = register_zip(sqlite_engine, "bombs", io.BytesIO(buffer.getvalue()))

    assert len(registration.report.bad_files) == 80
    assert set(registration.report.bad_files.values()) == {HUGE_REASON}
    assert registration.report.decoded_pixels == 4 * 12 * 12


def test_a_dataset_over_the_decode_budget_is_refused_before_decoding(
    sqlite_engine: Engine, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_folder_dataset(data_dir / "big", per_class=2, size=700)
    monkeypatch.setenv("TRAINDECK_CHECK_MAX_MEGAPIXELS", "1")

    with pytest.raises(DatasetError) as refused:
        register_folder(sqlite_engine, "big", root)

    assert str(refused.value) == (
        "checking these images would decode 2.0 megapixels; the limit is 1.0 megapixels "
        "decoded to check one dataset (an admin can raise it with "
        "TRAINDECK_CHECK_MAX_MEGAPIXELS)"
    )
    assert get_dataset(sqlite_engine, "big") is None


def test_a_jpeg_costs_what_its_draft_decodes(tmp_path: Path) -> None:
    photo = write_image(tmp_path / "photo.jpg", (200, 100, 50), size=2_000)

    (found,), decoded = check_images([photo], PixelLimits(max_check_pixels=1_000_000))

    assert found.mode == "RGB" and found.problem is None
    assert decoded == found.pixels == 250 * 250


def test_the_pool_checks_batches_in_order_and_reports_progress(tmp_path: Path) -> None:
    count = 2 * BATCH_IMAGES + 5
    paths = [write_image(tmp_path / f"{n:03d}.png", colour_for(n), size=8) for n in range(count)]
    paths[3] = write_corrupt_png(tmp_path / "broken.png")
    paths[40] = write_huge_png(tmp_path / "huge.png")
    seen: list[tuple[int, int]] = []

    checked, decoded = check_images(
        paths, PixelLimits(), lambda done, total: seen.append((done, total))
    )

    problems = {index: found.problem for index, found in enumerate(checked) if found.problem}
    assert sorted(problems) == [3, 40]
    assert problems[3].startswith("cannot be decoded")
    assert problems[40] == HUGE_REASON
    assert decoded == (count - 2) * 64
    assert seen[-1] == (count, count)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_pils_own_bomb_error_is_a_reason(tmp_path: Path, monkeypatch) -> None:
    path = write_image(tmp_path / "wide.png", (1, 2, 3), size=100)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000)
    assert check_image(path) == (
        None,
        "has too many pixels to decode safely (Pillow refuses it as a decompression bomb)",
    )


def test_the_pool_started_from_a_page_script_does_not_run_that_script_again(
    tmp_path: Path, monkeypatch
) -> None:
    """As while a Streamlit page runs: `__main__` is the page script and its folder, which
    holds a `datasets.py` (the Datasets page), is first on the path. The pool's processes are
    spawned then; they must neither run the page again nor import it as the `datasets`
    package."""
    import sys
    import types

    from datasets import image_checks

    pages = tmp_path / "pages"
    pages.mkdir()
    ran = tmp_path / "the page ran"
    script = f"open({str(ran)!r}, 'a').write('ran')\n"
    (pages / "datasets.py").write_text(script)
    page = types.ModuleType("__main__")
    page.__file__ = str(pages / "datasets.py")
    monkeypatch.setitem(sys.modules, "__main__", page)
    monkeypatch.setattr(sys, "path", [str(pages), *sys.path])
    monkeypatch.setattr(image_checks, "_pool", None)  # a pool of new processes
    path = write_image(tmp_path / "ok.png", (1, 2, 3), size=8)
    try:
        checked, decoded = check_images([path], PixelLimits())
    finally:
        pool = image_checks._pool
        if pool is not None:
            pool.shutdown(wait=True)
    assert [found.problem for found in checked] == [None] and decoded == 64
    assert not ran.exists(), "a pool process ran the page script"
    assert sys.modules["__main__"] is page and sys.path[0] == str(pages), "both put back"

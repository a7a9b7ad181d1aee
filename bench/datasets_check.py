"""How fast registration checks a dataset: decoding every image (JPEG in draft mode vs a full
decode), scanning a folder, and unpacking an uploaded zip. Prints figures; never fails on time.

    .venv/bin/python -m bench.datasets_check [IMAGES]
"""

from __future__ import annotations

import sys
import tempfile
import time
import zipfile
from pathlib import Path

from PIL import Image

from common.entry import run_main
from datasets.labelling import detect_label_rule, scan_items
from datasets.uploads import extract_zip
from datasets.validation import find_bad_files, image_problem

CLASSES = 10
SIDES = (500, 1024)  # about an Oxford-IIIT Pets photo; a phone photo scaled down


def write_jpegs(root: Path, count: int, side: int) -> None:
    base = Image.radial_gradient("L").resize((side, side)).convert("RGB")
    for index in range(count):
        folder = root / f"class{index % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        base.rotate(index % 360).save(folder / f"{index:05d}.jpg", quality=85)


def full_decode(path: Path) -> None:
    with Image.open(path) as image:
        image.load()


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f} images/s ({seconds * 1000 / count:.2f} ms each)"


def measure(count: int, side: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "ds"
        write_jpegs(root, count, side)

        started = time.perf_counter()
        items = scan_items(root, detect_label_rule(root))
        scan_s = time.perf_counter() - started

        started = time.perf_counter()
        for path, _ in items.items:
            full_decode(path)
        full_s = time.perf_counter() - started

        started = time.perf_counter()
        bad = find_bad_files(root, items)
        draft_s = time.perf_counter() - started
        assert not bad and image_problem(items.items[0][0]) is None

        archive = Path(scratch) / "upload.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
            for path, _ in items.items:
                zipped.write(path, path.relative_to(root).as_posix())
        started = time.perf_counter()
        extract_zip(archive, Path(scratch) / "unpacked")
        unzip_s = time.perf_counter() - started

    print(f"{count:,} JPEGs of {side}x{side} in {CLASSES} class folders")
    print(f"  scan the folder layout:        {rate(count, scan_s)}")
    print(f"  full decode (PIL load):        {rate(count, full_s)}")
    print(f"  registration check (draft):    {rate(count, draft_s)}")
    print(f"  draft check vs full decode:    {full_s / draft_s:.1f}x faster")
    print(f"  safe zip extraction:           {rate(count, unzip_s)}")


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    for side in SIDES:
        measure(count, side)


if __name__ == "__main__":
    run_main(main)

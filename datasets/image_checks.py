"""Checking that images decode, at a bounded cost, away from the process that asked.

The cost of checking an image is the number of pixels decoded, known from its header before a
pixel is decoded (PIL's `Image.open` reads only the header; a JPEG is decoded at a reduced
scale, `DRAFT_SIZE`, so its cost is the reduced size). Two limits:

- one image may have at most `TRAINDECK_IMAGE_MAX_MEGAPIXELS`: a larger one is left out as
  undecodable, the reason naming its size, without decoding it (PIL's own decompression-bomb
  error is caught as well);
- the check of one dataset may decode at most `TRAINDECK_CHECK_MAX_MEGAPIXELS` in all: every
  header is read first, and a dataset whose images add up to more is refused before any is
  decoded. The decoded pixels are counted too, so a file that grows in between cannot pass.

The work runs in a small pool of processes (`CHECK_PROCESSES`) shared by every check of this
process, with at most that many batches in flight per check: a check never holds the
dashboard's own process (its CPU, or the hundreds of MB a large image takes to decode), two
uploads take turns, and a decoder that crashes or runs out of memory ends a pool process, not
the dashboard. The pool starts on first use (spawned, so it shares nothing with the threads of
the process that starts it) and lives as long as that process.

A spawned process first runs the parent's `__main__` script again, from its path, and takes the
parent's `sys.path`. While a Streamlit page runs, `__main__` is that page (Streamlit installs
each script it runs as `__main__`) and the script's folder is first on `sys.path`: a pool
started from the Datasets page would run the whole page in each of its processes, and under
Streamlit's AppTest, whose script folder is `dashboard/pages/`, `import datasets` there finds
the page `datasets.py` instead of this package, so the pool's processes fail. The pool's
processes are therefore started (`_spawning_plainly`) with a `__main__` that names no script
and without that script's folder on the path they copy.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from common.cpus import usable_cpus
from datasets.labelling import DatasetError

MAX_IMAGE_ENV = "TRAINDECK_IMAGE_MAX_MEGAPIXELS"
MAX_CHECK_ENV = "TRAINDECK_CHECK_MAX_MEGAPIXELS"
MEGAPIXEL = 1_000_000
# Decoding a JPEG at a reduced scale proves it is readable at a fraction of the cost.
DRAFT_SIZE = (64, 64)
# Leave a core to the dashboard; at most four checking at once; counted from the CPUs this
# process may use (a container or taskset may allow fewer than the machine has).
CHECK_PROCESSES = max(1, min(4, usable_cpus() - 1))
BATCH_IMAGES = 32

ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True)
class PixelLimits:
    """How many pixels one image may have, and how many one dataset's check may decode."""

    max_image_pixels: int = 50 * MEGAPIXEL
    max_check_pixels: int = 5_000 * MEGAPIXEL

    @classmethod
    def from_env(cls) -> PixelLimits:
        from common.settings import settings

        current = settings()
        return cls(
            max_image_pixels=current.image_max_megapixels * MEGAPIXEL,
            max_check_pixels=current.check_max_megapixels * MEGAPIXEL,
        )


@dataclass(frozen=True)
class ImageCheck:
    """What checking one image found: its mode ('RGB', 'L 16-bit', …) when it decodes, else
    why not; `pixels` is what reading its header (`cost`) or decoding it took."""

    mode: str | None = None
    problem: str | None = None
    pixels: int = 0


def megapixels(pixels: int) -> str:
    shown = pixels / MEGAPIXEL
    return f"{shown:,.0f}" if shown >= 10 else f"{shown:,.1f}"


def _too_many_pixels(width: int, height: int, limits: PixelLimits) -> str:
    return (
        f"is {width:,}×{height:,} pixels ({megapixels(width * height)} megapixels); the limit "
        f"is {megapixels(limits.max_image_pixels)} megapixels per image (an admin can raise it "
        f"with {MAX_IMAGE_ENV})"
    )


BOMB = "has too many pixels to decode safely (Pillow refuses it as a decompression bomb)"


def _cannot_decode(path: Path, exc: Exception) -> str:
    detail = str(exc).replace(str(path), path.name) or type(exc).__name__
    return f"cannot be decoded: {detail}"


def cost(path: Path, limits: PixelLimits) -> ImageCheck:
    """The pixels checking `path` would decode, from its header alone (nothing is decoded),
    or the problem that leaves it out."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(path) as opened:
                width, height = opened.size
                if width * height > limits.max_image_pixels:
                    return ImageCheck(problem=_too_many_pixels(width, height, limits))
                opened.draft("RGB", DRAFT_SIZE)
                width, height = opened.size
    except Image.DecompressionBombError:
        return ImageCheck(problem=BOMB)
    except Exception as exc:
        return ImageCheck(problem=_cannot_decode(path, exc))
    return ImageCheck(pixels=width * height)


def check(path: Path, limits: PixelLimits) -> ImageCheck:
    """Decode `path` as training reads it (`datasets.images.open_image`, a JPEG at draft
    scale), refusing it unread when its header says it has too many pixels."""
    from PIL import Image

    from datasets.images import SOURCE_MODE, open_image

    found = cost(path, limits)
    if found.problem is not None:
        return found
    try:
        with warnings.catch_warnings():
            # PIL's other warnings (a palette's transparency dropped by RGB) would repeat
            # once per file of a dataset.
            warnings.simplefilter("ignore")
            image = open_image(path, draft=DRAFT_SIZE)
    except Image.DecompressionBombError:
        return ImageCheck(problem=BOMB)
    except Exception as exc:
        return ImageCheck(problem=_cannot_decode(path, exc))
    # Counted from what was decoded: the file may have changed since its header was read.
    return ImageCheck(mode=image.info[SOURCE_MODE], pixels=image.width * image.height)


def _in_pool(work: str, paths: Sequence[str], limits: PixelLimits) -> list[ImageCheck]:
    """One batch, in a pool process."""
    from PIL import Image

    # PIL's own bomb check (at the same point as `cost`'s, right after the header) would
    # refuse a large image without saying its size: in these processes `cost` decides.
    Image.MAX_IMAGE_PIXELS = None
    do = cost if work == "cost" else check
    return [do(Path(path), limits) for path in paths]


_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


def _shared_pool() -> ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(
                max_workers=CHECK_PROCESSES, mp_context=multiprocessing.get_context("spawn")
            )
        return _pool


_spawn_lock = threading.Lock()
_PLAIN_MAIN = types.ModuleType("__main__")  # no __file__, no __spec__: nothing to run again


@contextlib.contextmanager
def _spawning_plainly() -> Iterator[None]:
    """Processes spawned in this block do not run the parent's `__main__` script again, nor
    see its folder first on their path (see the module's notes). The parent's own `__main__`
    and path are back at the end of the block (unless another thread replaced them)."""
    with _spawn_lock:
        main = sys.modules.get("__main__")
        script = getattr(main, "__file__", None)
        folder = os.path.dirname(os.path.abspath(script)) if script else None
        path = sys.path
        kept = [entry for entry in path if os.path.abspath(entry or ".") != folder]
        sys.modules["__main__"] = _PLAIN_MAIN
        if len(kept) != len(path):
            sys.path = kept
        try:
            yield
        finally:
            if sys.modules.get("__main__") is _PLAIN_MAIN and main is not None:
                sys.modules["__main__"] = main
            if sys.path is kept:
                sys.path = path


def _discard_pool(broken: ProcessPoolExecutor) -> None:
    global _pool
    with _pool_lock:
        if _pool is broken:
            _pool = None
    broken.shutdown(wait=False, cancel_futures=True)


def _batches(paths: Sequence[Path]) -> Iterator[tuple[int, list[str]]]:
    for start in range(0, len(paths), BATCH_IMAGES):
        yield start, [str(path) for path in paths[start : start + BATCH_IMAGES]]


def _run(
    work: str,
    paths: Sequence[Path],
    limits: PixelLimits,
    done: Callable[[int, list[ImageCheck]], None],
) -> list[ImageCheck]:
    """`work` ('cost' or 'check') on every path in the pool, in batches, at most
    CHECK_PROCESSES of them in flight; `done(start, results)` after each batch, in this
    thread. The results come back in the order of `paths`."""
    results: list[ImageCheck] = [ImageCheck()] * len(paths)
    pending = _batches(paths)
    pool = _shared_pool()
    running: dict[Future[list[ImageCheck]], tuple[int, list[str]]] = {}
    try:
        while True:
            while len(running) < CHECK_PROCESSES and (batch := next(pending, None)):
                # A submission may start one of the pool's processes (spawned on demand).
                with _spawning_plainly():
                    running[pool.submit(_in_pool, work, batch[1], limits)] = batch
            if not running:
                return results
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                start, batch_paths = running.pop(future)
                try:
                    checked = future.result()
                except BrokenProcessPool:
                    _discard_pool(pool)
                    names = ", ".join(Path(path).name for path in batch_paths[:5])
                    raise DatasetError(
                        "the image check stopped: its process ended while decoding one of "
                        f"{names}{' …' if len(batch_paths) > 5 else ''} (out of memory?)"
                    ) from None
                results[start : start + len(checked)] = checked
                done(start, checked)
    finally:
        for future in running:
            future.cancel()


def _over_budget(limits: PixelLimits, found: str) -> DatasetError:
    return DatasetError(
        f"{found}; the limit is {megapixels(limits.max_check_pixels)} megapixels decoded to "
        f"check one dataset (an admin can raise it with {MAX_CHECK_ENV})"
    )


def check_images(
    paths: Sequence[Path],
    limits: PixelLimits | None = None,
    progress: ProgressCallback | None = None,
) -> tuple[list[ImageCheck], int]:
    """Check every image, in the pool, within `limits`; returns one ImageCheck per path (in
    order) and the pixels decoded in all. A DatasetError when the images together would
    decode more than the dataset's budget (then none is decoded)."""
    limits = limits or PixelLimits.from_env()
    total = len(paths)
    costs = _run("cost", paths, limits, lambda start, checked: None)
    planned = sum(found.pixels for found in costs)
    if planned > limits.max_check_pixels:
        raise _over_budget(
            limits, f"checking these images would decode {megapixels(planned)} megapixels"
        )
    to_check = [path for path, found in zip(paths, costs, strict=True) if found.problem is None]
    finished = total - len(to_check)
    decoded = 0

    def done(start: int, checked: list[ImageCheck]) -> None:
        nonlocal finished, decoded
        finished += len(checked)
        decoded += sum(found.pixels for found in checked)
        if decoded > limits.max_check_pixels:
            raise _over_budget(limits, "the images grew while they were checked, past the limit")
        if progress is not None:
            progress(finished, total)

    if progress is not None and finished:
        progress(finished, total)
    checked = iter(_run("check", to_check, limits, done))
    results = [found if found.problem is not None else next(checked) for found in costs]
    return results, decoded

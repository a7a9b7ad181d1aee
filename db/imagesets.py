"""Image datasets on disk: the built-in digits set, registering a user's dataset (a folder,
a CSV, an uploaded zip, a URL), and the labelled items the worker trains on.

Pure file work with PIL and scikit-learn; no torch, so the dashboard and the CLI can use it.
The labelling rules are described in `db.labelling`, the checks in `db.dataset_validation`,
the safe zip extraction in `db.uploads`.

Where files go under the data folder (`TRAINDECK_DATA/datasets/`): `digits/`, `uploads/<name>/`
for zips, and `url/<name>/` for archives the worker fetches (`url/<name>/data/<archive>/`).
"""

from __future__ import annotations

import random
import re
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlparse

from sqlalchemy import Engine

from db.dataset_validation import (
    DatasetReport,
    ProgressCallback,
    inspect_dataset,
    normalize_dataset_name,
    resolve_inside_roots,
    validate_dataset_name,
)
from db.datasets import (
    DatasetExists,
    active_jobs_using,
    get_dataset,
    remove_dataset,
    save_dataset,
    update_dataset_contents,
)
from db.files import datasets_dir
from db.labelling import (
    IMAGE_SUFFIXES,
    DatasetError,
    LabelledItems,
    compile_label_regex,
    dataset_root,
    detect_label_rule,
    is_image_name,
    scan_items,
)
from db.models import Dataset
from db.uploads import UploadLimits, extract_zip

__all__ = [
    "IMAGE_SUFFIXES",
    "DatasetError",
    "LabelledItems",
    "Registration",
    "dataset_items",
    "is_image_name",
    "preview_items",
    "record_fetched",
    "register_csv",
    "register_folder",
    "register_url",
    "register_zip",
    "unregister_dataset",
]

DIGITS_IMAGE_COUNT = 1797
ARCHIVE_SUFFIXES = (".tgz", ".tar.gz", ".tar", ".zip", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
FASTAI_URL_NAME = re.compile(r"^(?:URLs\.)?([A-Z][A-Z0-9_]*)$")
STAGING_PREFIX = ".staging-"
STALE_STAGING_S = 24 * 3600


def digits_dir(root: Path | None = None) -> Path:
    return (root or datasets_dir()) / "digits"


def uploads_dir() -> Path:
    return datasets_dir() / "uploads"


def url_fetch_dir(name: str) -> Path:
    """Where the worker keeps the archive and the extracted files of `url` dataset `name`."""
    return datasets_dir() / "url" / name


def url_data_dir(name: str) -> Path:
    return url_fetch_dir(name) / "data"


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


# --- registering a dataset ------------------------------------------------------------------


@dataclass(frozen=True)
class Registration:
    """A dataset just registered, with what a person should know about it."""

    name: str
    kind: str
    location: str
    report: DatasetReport | None
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.report is None:
            head = f"registered {self.name!r}: {self.location}"
        else:
            head = f"registered {self.name!r} at {self.location}: {self.report.summary()}"
        return "\n".join([head, *self.notes])


def _refuse_taken(engine: Engine, name: str) -> None:
    if get_dataset(engine, name) is not None:
        raise DatasetError(
            f"a dataset named {name!r} is already registered; choose another name or remove "
            f"it first (python -m db dataset remove {name})"
        )


def _insert(engine: Engine, name: str, kind: str, location: str, report: DatasetReport) -> None:
    try:
        save_dataset(
            engine,
            name=name,
            kind=kind,
            location=location,
            label_rule=report.label_rule,
            classes=report.classes,
            class_counts=report.class_counts,
            bad_files=sorted(report.bad_files),
        )
    except DatasetExists as exc:
        raise DatasetError(str(exc)) from None


def register_folder(
    engine: Engine,
    name: str,
    folder: Path | str,
    label_regex: str | None = None,
    progress: ProgressCallback | None = None,
) -> Registration:
    """Register a folder on this machine: one sub-folder per class (optionally inside
    `train/` and `valid/`), or images labelled by `label_regex` on their file names."""
    name = validate_dataset_name(name)
    _refuse_taken(engine, name)
    root = resolve_inside_roots(folder, "folder")
    if not root.is_dir():
        raise DatasetError(f"{folder} is not a folder")
    rule = detect_label_rule(root, label_regex or None)
    report = inspect_dataset(root, rule, progress=progress)
    report.raise_problems(name)
    _insert(engine, name, "folder", str(root), report)
    return Registration(name, "folder", str(root), report)


def register_csv(
    engine: Engine, name: str, csv_file: Path | str, progress: ProgressCallback | None = None
) -> Registration:
    """Register the images listed in a CSV of `file,label[,is_valid]`; file paths are
    relative to the CSV's folder."""
    name = validate_dataset_name(name)
    _refuse_taken(engine, name)
    path = resolve_inside_roots(csv_file, "CSV file")
    if not path.is_file():
        raise DatasetError(f"{csv_file} is not a file")
    rule = {"type": "csv", "file": path.name}
    report = inspect_dataset(path.parent, rule, progress=progress)
    report.raise_problems(name)
    _insert(engine, name, "folder", str(path.parent), report)
    return Registration(name, "folder", str(path.parent), report)


def _remove_stale_staging(parent: Path) -> None:
    """Staging folders of uploads whose process died long ago."""
    cutoff = time.time() - STALE_STAGING_S
    for stale in parent.glob(STAGING_PREFIX + "*"):
        try:
            if stale.stat().st_mtime < cutoff:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            continue


def _reserve_folder(parent: Path, name: str) -> Path:
    """A new empty folder `parent/name` (or `name-2`, `name-3`, ...), created atomically."""
    for attempt in range(1, 1000):
        candidate = parent / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise DatasetError(f"too many upload folders named {name} in {parent}")


def _remove_upload(staging: Path, final: Path | None) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    if final is not None:
        shutil.rmtree(final, ignore_errors=True)


def register_zip(
    engine: Engine,
    name: str,
    archive: Path | str | BinaryIO,
    label_regex: str | None = None,
    progress: ProgressCallback | None = None,
    limits: UploadLimits | None = None,
) -> Registration:
    """Register an uploaded zip: extract it safely beside its final folder, check it, then
    rename it into place and add the registry row. Any failure removes every file written."""
    name = validate_dataset_name(name)
    if label_regex:
        compile_label_regex(label_regex)
    _refuse_taken(engine, name)
    if isinstance(archive, str):
        archive = Path(archive)
    if isinstance(archive, Path) and not archive.is_file():
        raise DatasetError(f"zip file {archive} does not exist")
    parent = uploads_dir()
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(parent)
    staging = parent / f"{STAGING_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
    extracted = extract_zip(archive, staging, limits)
    final: Path | None = None
    try:
        staged_root = dataset_root(staging)
        inner = staged_root.relative_to(staging)
        rule = detect_label_rule(staged_root, label_regex or None)
        report = inspect_dataset(staged_root, rule, progress=progress)
        report.raise_problems(name)
        final = _reserve_folder(parent, name)
        staging.rename(final)
        root = final / inner
        report.root = root
        _insert(engine, name, "upload", str(root), report)
    except DatasetError as exc:
        _remove_upload(staging, final)
        raise DatasetError(str(exc).replace(str(staging), "the archive")) from None
    except BaseException:
        _remove_upload(staging, final)
        raise
    notes = list(extracted.skipped)
    return Registration(name, "upload", str(root), report, notes)


def normalize_dataset_url(text: str) -> str:
    """`URLs.NAME` for a fastai dataset name, or the http(s) URL of an archive."""
    text = (text or "").strip()
    match = FASTAI_URL_NAME.match(text)
    if match:
        return f"URLs.{match.group(1)}"
    parsed = urlparse(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise DatasetError(
            f"{text!r} is neither a fastai dataset name (such as URLs.PETS) nor an http(s) URL"
        )
    archive_name = parsed.path.rsplit("/", 1)[-1].lower()
    if not archive_name.endswith(ARCHIVE_SUFFIXES):
        raise DatasetError(
            f"{text} does not name an archive; expected a file ending in "
            + ", ".join(ARCHIVE_SUFFIXES)
        )
    return text


def register_url(
    engine: Engine, name: str, url: str, label_regex: str | None = None
) -> Registration:
    """Register an archive the worker fetches with fastai's `untar_data` before its first
    job. Its layout is checked then (`record_fetched`), since only the worker downloads."""
    name = validate_dataset_name(name)
    url = normalize_dataset_url(url)
    rule: dict[str, Any] = {"type": "auto"}
    if label_regex:
        compile_label_regex(label_regex)
        rule["label_regex"] = label_regex
    _refuse_taken(engine, name)
    try:
        save_dataset(
            engine,
            name=name,
            kind="url",
            location=url,
            label_rule=rule,
            classes=[],
            class_counts={},
        )
    except DatasetExists as exc:
        raise DatasetError(str(exc)) from None
    note = "the worker downloads and checks it before the first job that uses it"
    return Registration(name, "url", url, None, [note])


def unregister_dataset(engine: Engine, name: str, *, force: bool = False) -> list[str]:
    """Remove a dataset from the registry; delete the files traindeck wrote for it (an
    upload's folder, a URL's download), never a user's own folder. Returns what was deleted."""
    name = normalize_dataset_name(name)
    dataset = get_dataset(engine, name)
    if dataset is None:
        raise DatasetError(f"no dataset named {name!r} is registered")
    jobs = active_jobs_using(engine, name)
    if jobs and not force:
        listed = ", ".join(str(job) for job in jobs)
        raise DatasetError(
            f"dataset {name!r} is used by queued or running jobs ({listed}); cancel them first"
        )
    remove_dataset(engine, name)
    deleted: list[str] = []
    owned = None
    if dataset.kind == "upload":
        uploads = uploads_dir().resolve()
        location = Path(dataset.location).resolve()
        if location.is_relative_to(uploads) and location != uploads:
            owned = uploads / location.relative_to(uploads).parts[0]
    elif dataset.kind == "url":
        owned = url_fetch_dir(name)
    if owned is not None and owned.exists():
        shutil.rmtree(owned, ignore_errors=True)
        deleted.append(str(owned))
    return deleted


# --- reading a registered dataset -----------------------------------------------------------


def local_root(dataset: Dataset) -> Path:
    """The folder of `dataset` on this machine (for a `url` one, where the worker put it)."""
    if dataset.kind != "url":
        return Path(dataset.location)
    data = url_data_dir(dataset.name)
    if not data.is_dir():
        raise DatasetError(
            f"dataset {dataset.name!r} ({dataset.location}) has not been fetched on this machine "
            "yet; the worker downloads it (worker.fetch.fetch_url_dataset) before its first job"
        )
    return dataset_root(data)


def _concrete_rule(dataset: Dataset, root: Path) -> dict[str, Any]:
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
        items = scan_items(root, _concrete_rule(dataset, root))
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


def record_fetched(
    engine: Engine, dataset: Dataset, root: Path, progress: ProgressCallback | None = None
) -> DatasetReport:
    """Check a fetched `url` dataset like a registered folder and store its classes, counts
    and undecodable files. Raises DatasetError when it cannot train."""
    rule = dict(dataset.label_rule or {"type": "auto"})
    report = inspect_dataset(root, _concrete_rule(dataset, root), progress=progress)
    report.raise_problems(dataset.name)
    rule["detected"] = report.label_rule
    update_dataset_contents(
        engine,
        dataset.name,
        label_rule=rule,
        classes=report.classes,
        class_counts=report.class_counts,
        bad_files=sorted(report.bad_files),
    )
    return report


def preview_items(
    dataset: Dataset, count: int = 24, seed: int = 0, location: Path | None = None
) -> list[tuple[Path, str]]:
    """Up to `count` sample images, taken from every class in turn so each class shows."""
    by_class: dict[str, list[Path]] = {}
    for path, label in dataset_items(dataset, location).items:
        by_class.setdefault(label, []).append(path)
    rng = random.Random(seed)
    queues = {label: rng.sample(paths, len(paths)) for label, paths in sorted(by_class.items())}
    chosen: list[tuple[Path, str]] = []
    while len(chosen) < count and any(queues.values()):
        for label, paths in queues.items():
            if paths and len(chosen) < count:
                chosen.append((paths.pop(), label))
    return chosen


def split_counts(items: LabelledItems) -> dict[str, dict[str, int]] | None:
    """Images per class in the training and the validation part of a fixed split."""
    if items.is_valid is None:
        return None
    counts: dict[str, dict[str, int]] = {"train": {}, "valid": {}}
    for (_, label), flag in zip(items.items, items.is_valid, strict=True):
        part = counts["valid" if flag else "train"]
        part[label] = part.get(label, 0) + 1
    return counts

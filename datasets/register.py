"""Registering a user's dataset (a folder, a CSV, an uploaded zip, a URL) and removing one.

Pure file work with PIL; no torch, so the dashboard and the CLI can use it. The labelling
rules are in `datasets.labelling`, the checks in `datasets.validation`, the safe zip
extraction in `datasets.uploads`.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlparse

from common import store
from datasets import archive, manifest
from datasets.folders import uploads_dir, url_fetch_dir
from datasets.items import concrete_rule
from datasets.labelling import (
    DatasetError,
    compile_label_regex,
    dataset_root,
    detect_label_rule,
)
from datasets.uploads import UploadLimits, extract_zip
from datasets.urls import check_url, shown_url
from datasets.validation import (
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
    archive_in_use,
    get_dataset,
    manifest_in_use,
    remove_dataset,
    save_dataset,
    update_dataset_contents,
)
from db.engine import Engine
from db.models import Dataset

log = logging.getLogger(__name__)

ARCHIVE_SUFFIXES = (".tgz", ".tar.gz", ".tar", ".zip", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
FASTAI_URL_NAME = re.compile(r"^(?:URLs\.)?([A-Z][A-Z0-9_]*)$")
STAGING_PREFIX = ".staging-"
STALE_STAGING_S = 24 * 3600


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


def _pack_for_other_machines(name: str, location: str) -> archive.Archive | None:
    """With a shared store, the dataset's files packed into it for workers elsewhere."""
    if not store.is_shared():
        return None
    try:
        return archive.pack(Path(location))
    except store.StoreError as exc:
        raise DatasetError(
            f"dataset {name!r} cannot be packed into the store for the workers: {exc}"
        ) from None


def _insert(engine: Engine, name: str, kind: str, location: str, report: DatasetReport) -> None:
    packed = _pack_for_other_machines(name, location)
    manifest_url, manifest_sha256 = manifest.save(manifest.build(Path(location), report))
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
            archive_url=packed.url if packed else None,
            archive_sha256=packed.sha256 if packed else None,
            manifest_url=manifest_url,
            manifest_sha256=manifest_sha256,
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
    """`URLs.NAME` for a fastai dataset name, or the http(s) URL of an archive on a public
    address or an allowed mirror (`datasets.urls.check_url`; the worker checks again, after
    resolving the name, when it downloads)."""
    text = (text or "").strip()
    match = FASTAI_URL_NAME.match(text)
    if match:
        return f"URLs.{match.group(1)}"
    parsed = urlparse(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise DatasetError(
            f"{shown_url(text)!r} is neither a fastai dataset name (such as URLs.PETS) nor an "
            "http(s) URL"
        )
    archive_name = parsed.path.rsplit("/", 1)[-1].lower()
    if not archive_name.endswith(ARCHIVE_SUFFIXES):
        raise DatasetError(
            f"{shown_url(text)} does not name an archive; expected a file ending in "
            + ", ".join(ARCHIVE_SUFFIXES)
        )
    check_url(text)
    return text


def register_url(
    engine: Engine, name: str, url: str, label_regex: str | None = None
) -> Registration:
    """Register an archive the worker fetches (`datasets.download`) before its first job.
    Its layout is checked then (`record_fetched`), since only the worker downloads."""
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
    if _forget_manifest(engine, dataset):
        deleted.append(dataset.manifest_url)
    if dataset.archive_url and not archive_in_use(engine, dataset.archive_sha256):
        try:
            store.delete(dataset.archive_url)
        except store.StoreError as exc:
            raise DatasetError(
                f"dataset {name!r} is unregistered, but its archive stays in the store: {exc}"
            ) from None
        deleted.append(dataset.archive_url)
    return deleted


def record_fetched(
    engine: Engine, dataset: Dataset, root: Path, progress: ProgressCallback | None = None
) -> DatasetReport:
    """Check a fetched `url` dataset like a registered folder and store its classes, counts,
    undecodable files and manifest. Raises DatasetError when it cannot train."""
    return _record_contents(engine, dataset, root, progress)[0]


def _record_contents(
    engine: Engine, dataset: Dataset, root: Path, progress: ProgressCallback | None = None
) -> tuple[DatasetReport, manifest.Manifest]:
    """Scan and decode `root` as registration does, and record the result in the dataset's
    row with a new manifest (the old one leaves the store once no dataset names it)."""
    rule = dict(dataset.label_rule or {"type": "auto"})
    report = inspect_dataset(root, concrete_rule(dataset, root), progress=progress)
    report.raise_problems(dataset.name)
    if rule.get("type") == "auto":
        rule["detected"] = report.label_rule
    else:
        rule = report.label_rule
    found = manifest.build(root, report)
    manifest_url, manifest_sha256 = manifest.save(found)
    update_dataset_contents(
        engine,
        dataset.name,
        label_rule=rule,
        classes=report.classes,
        class_counts=report.class_counts,
        bad_files=sorted(report.bad_files),
        manifest_url=manifest_url,
        manifest_sha256=manifest_sha256,
    )
    if dataset.manifest_sha256 != manifest_sha256:
        _forget_manifest(engine, dataset)
    return report, found


def _forget_manifest(engine: Engine, dataset: Dataset) -> bool:
    """Remove the manifest `dataset` named from the store once no dataset names it; whether
    it was removed."""
    if not dataset.manifest_url or manifest_in_use(engine, dataset.manifest_sha256):
        return False
    try:
        store.delete(dataset.manifest_url)
    except store.StoreError as exc:
        log.warning("the manifest of dataset %r stays in the store: %s", dataset.name, exc)
        return False
    return True


def current_manifest(
    engine: Engine, dataset: Dataset, root: Path, *, compare: bool
) -> tuple[manifest.Manifest, str | None]:
    """The dataset's manifest for its files under `root` on this machine, and a message when
    the dataset had to be registered again to get it: it had no manifest (registered before
    manifests existed, or it was lost), or (with `compare`, for a folder read in place) the
    files differ from it in size or modification time."""
    found = None
    if dataset.manifest_url and dataset.manifest_sha256:
        found = manifest.load(dataset.manifest_url, dataset.manifest_sha256)
    if found is not None:
        differences = manifest.changes(found, root) if compare else []
        if not differences:
            return found, None
        why = f"changed since it was registered ({manifest.describe_changes(differences)})"
    else:
        why = "has no manifest in the store (registered before manifests, or it was removed)"
    try:
        report, found = _record_contents(engine, dataset, root)
    except DatasetError as exc:
        raise DatasetError(
            f"dataset {dataset.name!r} {why}, and it cannot be used now: {exc}"
        ) from None
    return found, f"dataset {dataset.name!r} {why}; registered it again: {report.summary()}"

"""A dataset's manifest: what registration learned, kept so that no job scans or decodes again.

Registration scans the folder by its labelling rule and decodes every image once
(`datasets.validation.inspect_dataset`). The manifest keeps the result: every usable image
(relative to the dataset's root), its label and split flag, the size and modification time of
each, and the modification times of the folders that hold them (a file added or removed
changes its folder's time), plus the size and time of a labels CSV. It is one gzipped JSON
object in the store, named by its SHA-256 beside the dataset's archive
(`common.store.dataset_manifest_key`); the dataset row records its URL and hash.

A worker reads it, checks its hash and builds its DataLoaders from it: no folder is listed
and no image opened before the first batch. A folder read in place may have changed since
registration: `changes` compares the recorded sizes and times with the files' (`os.stat` in
bounded chunks on every CPU the process may use; nothing is opened), and a changed folder is
registered again (`datasets.register.current_manifest`). A copy unpacked from the dataset's
archive is the registered content, checked by its hash, and is not compared.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from common import store
from common.cpus import map_in_chunks
from datasets.item_table import ItemTable
from datasets.labelling import DatasetError, LabelledItems
from datasets.validation import DatasetReport, counted

FORMAT = 1
STAT_CHUNK = 4096
CHANGES_NAMED = 5


@dataclass(frozen=True)
class Manifest:
    rule: dict[str, Any]
    classes: list[str]
    files: list[str]  # relative to the root, with forward slashes
    labels: list[int]  # index into `classes`
    valid: list[bool] | None  # one flag per file for a fixed split, else None
    sizes: list[int]
    mtimes: list[int]  # st_mtime_ns
    folders: dict[str, int]  # every folder holding a file, and those above it ("" the root)
    sources: dict[str, list[int]]  # other files the labels come from: [size, st_mtime_ns]
    format: int = FORMAT

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def items(self, root: Path) -> LabelledItems:
        """The labelled images under `root` (where the dataset lies on this machine), as
        path strings in a compact table (`datasets.item_table`): what the DataLoaders read,
        with nothing listed or opened."""
        prefix = os.path.join(str(root), "")
        table = ItemTable.from_names(prefix, self.files, self.labels, self.classes)
        valid = None if self.valid is None else np.array(self.valid, dtype=bool)
        return LabelledItems(table, valid)


def _stat(path: str) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_size, found.st_mtime_ns


def _stats(paths: list[str]) -> list[tuple[int, int] | None]:
    result: list[tuple[int, int] | None] = []
    for chunk in map_in_chunks(lambda part: [_stat(path) for path in part], paths, STAT_CHUNK):
        result.extend(chunk)
    return result


def _folders_of(files: list[str]) -> list[str]:
    folders = {""}
    for name in {str(PurePosixPath(name).parent) for name in files}:
        parts = PurePosixPath(name).parts if name != "." else ()
        folders.update("/".join(parts[:depth]) for depth in range(1, len(parts) + 1))
    return sorted(folders)


def build(root: Path, report: DatasetReport) -> Manifest:
    """The manifest of the dataset `report` describes, its files now lying under `root`."""
    paths = [os.path.join(str(root), name) for name in report.files]
    stats = _stats(paths)
    vanished = [name for name, found in zip(report.files, stats, strict=True) if found is None]
    if vanished:
        raise DatasetError(
            f"{counted(len(vanished), 'file')} disappeared while the dataset was checked "
            f"({', '.join(vanished[:CHANGES_NAMED])}); register it again"
        )
    folders = _folders_of(report.files)
    folder_times = _stats([os.path.join(str(root), name) for name in folders])
    sources = {}
    if report.label_rule.get("type") == "csv":
        name = str(report.label_rule["file"])
        found = _stat(os.path.join(str(root), name))
        if found is not None:
            sources[name] = list(found)
    index = {label: number for number, label in enumerate(report.classes)}
    return Manifest(
        rule=report.label_rule,
        classes=report.classes,
        files=list(report.files),
        labels=[index[label] for label in report.labels],
        valid=None if report.valid is None else list(report.valid),
        sizes=[found[0] for found in stats],  # type: ignore[index]
        mtimes=[found[1] for found in stats],  # type: ignore[index]
        folders={
            name: found[1] for name, found in zip(folders, folder_times, strict=True) if found
        },
        sources=sources,
    )


def changes(manifest: Manifest, root: Path) -> list[str]:
    """What differs between the files under `root` and the manifest, one line each (empty
    when nothing does), from sizes and modification times alone."""
    base = str(root)
    found: list[str] = []
    for name, recorded in manifest.folders.items():
        now = _stat(os.path.join(base, name))
        if now is None or now[1] != recorded:
            found.append(f"{name or 'the top folder'}/ (files added or removed)")
    for name, (size, mtime) in manifest.sources.items():
        if _stat(os.path.join(base, name)) != (size, mtime):
            found.append(f"{name} (changed)")

    def compare(numbers: range) -> list[str]:
        differing = []
        for number in numbers:
            name = manifest.files[number]
            now = _stat(os.path.join(base, name))
            if now is None:
                differing.append(f"{name} (removed)")
            elif now != (manifest.sizes[number], manifest.mtimes[number]):
                differing.append(f"{name} (changed)")
        return differing

    for differing in map_in_chunks(compare, range(len(manifest.files)), STAT_CHUNK):
        found.extend(differing)
    return found


def describe_changes(found: list[str]) -> str:
    shown = "; ".join(found[:CHANGES_NAMED])
    more = len(found) - CHANGES_NAMED
    return f"{counted(len(found), 'difference')}: {shown}" + (
        f"; and {more} more" if more > 0 else ""
    )


# --- in the store ---------------------------------------------------------------------------


def encode(manifest: Manifest) -> bytes:
    text = json.dumps(asdict(manifest), separators=(",", ":"), ensure_ascii=False)
    return gzip.compress(text.encode("utf-8"), compresslevel=6, mtime=0)


def decode(data: bytes) -> Manifest | None:
    """The manifest in `data`, or None when it is of another format (written by another
    version of traindeck)."""
    fields = json.loads(gzip.decompress(data))
    if fields.get("format") != FORMAT:
        return None
    return Manifest(**fields)


def save(manifest: Manifest) -> tuple[str, str]:
    """Put the manifest into the store (once per content); its URL and SHA-256."""
    data = encode(manifest)
    digest = hashlib.sha256(data).hexdigest()
    key = store.dataset_manifest_key(digest)
    url = store.url_for(key)
    try:
        if not store.exists(url):
            with tempfile.TemporaryDirectory(prefix="traindeck-manifest-") as folder:
                local = Path(folder) / "manifest.json.gz"
                local.write_bytes(data)
                store.put_file(local, key, digest)
    except store.StoreError as exc:
        raise DatasetError(
            f"the dataset's manifest cannot be written to the store: {exc}"
        ) from None
    return url, digest


def load(url: str, sha256: str) -> Manifest | None:
    """The manifest at `url` if its SHA-256 is `sha256`; None when it is gone, altered or of
    another format (the caller registers the dataset again)."""
    try:
        data = store.read_bytes(url)
    except FileNotFoundError:
        return None
    except store.StoreError as exc:
        raise DatasetError(f"the dataset's manifest cannot be read: {exc}") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        return None
    try:
        return decode(data)
    except (OSError, ValueError, TypeError):
        return None

"""A dataset's files packed once into the store, for workers on other machines.

With a shared store (a `gs://` bucket) a dataset registered from a folder, a CSV or a zip is
packed into one uncompressed tar (images are already compressed), named by its SHA-256 in
the store, and the dataset row records its URL and hash. A worker fetches it into a local
cache (`worker.dataset_cache`), checks the hash, and unpacks it. With the local store the
folder is read in place, as before.

Only the files a job reads go in: the images and the CSV that labels them, below the
dataset's root, with their paths relative to it, so the labelling rule works unchanged.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common import store
from datasets.labelling import DatasetError, is_hidden, is_image_name


@dataclass(frozen=True)
class Archive:
    url: str
    sha256: str
    bytes: int


def _members(root: Path) -> list[Path]:
    members = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not is_hidden(d))
        for name in sorted(files):
            path = Path(folder) / name
            if is_hidden(name) or path.is_symlink():
                continue
            if is_image_name(path) or path.suffix.lower() == ".csv":
                members.append(path)
    return members


def _normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # The same files give the same archive and so the same hash, whoever packs them.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    info.mode = 0o644
    return info


def pack(root: Path) -> Archive:
    """Pack the dataset below `root` into the store (once per content); its URL and hash."""
    members = _members(root)
    if not members:
        raise DatasetError(f"{root} holds no images to pack")
    with tempfile.TemporaryDirectory(prefix="traindeck-pack-") as folder:
        packed = Path(folder) / "dataset.tar"
        with tarfile.open(packed, "w", format=tarfile.PAX_FORMAT) as tar:
            for path in members:
                tar.add(path, arcname=path.relative_to(root).as_posix(), filter=_normalised)
        digest = store.sha256_file(packed)
        url = store.url_for(store.dataset_archive_key(digest))
        if not store.exists(url):
            store.put_file(packed, store.dataset_archive_key(digest), digest)
        return Archive(url, digest, packed.stat().st_size)


def unpack(archive: Path, target: Path) -> Path:
    """Unpack a fetched (and hash-checked) archive into `target`, refusing links and paths
    outside it (tarfile's `data` filter)."""
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    return target

"""The store: where every file that crosses machines lives, named by a URL.

`TRAINDECK_STORE` unset: a folder under the data folder (`TRAINDECK_DATA/store`), for one
machine. `gs://BUCKET/PREFIX`: Google Cloud Storage through fsspec's gcsfs, with Application
Default Credentials (a TPU VM's service account, or `gcloud auth application-default login`).

This module owns the store: no other code builds an object's key or touches an object. An
object appears under its final key whole or not at all: it is written under a temporary key
and then renamed (on Cloud Storage a server-side copy, which creates the final object in one
step). Immutable content (dataset archives, exports) is named by its SHA-256.

Rows record an object by its URL (`gs://…` or `file://…`); rows written before the store
existed hold a plain local path, which `open_object` and friends still read.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

from common import config
from common.errors import first_line
from common.settings import is_bucket_url, settings

CHUNK_BYTES = 1 << 20
STORE_ENV = "TRAINDECK_STORE"
SCHEMES = ("gs", "file")
# gcsfs 2026.x probes a gRPC endpoint for hierarchical buckets before its first call; against
# the emulator (and on buckets without that feature) the probe waits about a minute.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# gcsfs logs a traceback for each retried or fallen-back call; StoreError carries the cause.
logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
# aiohttp warns on every single-request upload gcsfs makes of a small file (a few MB).
warnings.filterwarnings("ignore", "Sending a large body directly", ResourceWarning)


class StoreError(OSError):
    """The store cannot be used; one line naming the store and the cause."""


@dataclass(frozen=True)
class StoredObject:
    url: str
    bytes: int
    sha256: str


# --- settings (common.settings reads and checks them) ----------------------------------------


def checkpoints_kept() -> int:
    """How many of a running job's newest checkpoints stay in the store."""
    return settings().checkpoints_kept


def keep_final_checkpoint() -> bool:
    """Whether a succeeded job keeps its newest checkpoint in the store (else they all go)."""
    return settings().keep_checkpoints


def dataset_cache_bytes() -> int:
    """How much room a worker's copies of datasets from the store may take on its disk."""
    return int(settings().dataset_cache_gb * 1e9)


def _local_root() -> Path:
    return config.data_dir() / "store"


def store_url() -> str:
    """The configured store as a URL (`gs://bucket/prefix` or `file:///…/store`); a malformed
    TRAINDECK_STORE is a SettingsError (one line)."""
    configured = settings().store
    if configured:
        return configured
    return _local_root().resolve().as_uri()


def is_store_url(text: str) -> bool:
    return urlparse(text).scheme in SCHEMES


def is_shared() -> bool:
    """Whether other machines can read this store (a bucket, not this machine's folder)."""
    return urlparse(store_url()).scheme == "gs"


def validate_store_url(text: str) -> str:
    """`text` if it is a usable store URL, else StoreError saying what one looks like."""
    if not is_bucket_url(text):
        raise StoreError(
            f"TRAINDECK_STORE={text!r} is not a store URL: use gs://BUCKET or gs://BUCKET/PREFIX "
            "(or leave it unset for a folder under the data folder)"
        )
    return text.rstrip("/")


def _filesystem(scheme: str) -> Any:
    import fsspec

    if scheme == "gs":
        # One client per process; gcsfs caches listings, which every call below bypasses.
        return fsspec.filesystem("gs", skip_instance_cache=False)
    return fsspec.filesystem("file")


def _split(url: str) -> tuple[Any, str]:
    """The filesystem and the path within it of a store URL or an old local path."""
    parsed = urlparse(url)
    if parsed.scheme == "gs":
        return _filesystem("gs"), f"{parsed.netloc}{parsed.path}"
    if parsed.scheme == "file":
        return _filesystem("file"), parsed.path
    return _filesystem("file"), url


def _bucket_words(url: str) -> str:
    parsed = urlparse(url)
    return f"bucket {parsed.netloc}" if parsed.scheme == "gs" else "the local store"


def failure(url: str, exc: BaseException, doing: str) -> StoreError:
    """One line for a failed store call: the bucket, what was being done, and the cause."""
    if isinstance(exc, StoreError):
        return exc
    cause = first_line(exc)
    if isinstance(exc, FileNotFoundError):
        # Writing or listing needs no object to exist: only the bucket can be missing.
        missing = doing in ("write", "reach") and urlparse(url).scheme == "gs"
        cause = "no such bucket" if missing else "no such object or bucket"
    elif isinstance(exc, PermissionError) or _refused(cause):
        # gcsfs says "Forbidden: <request URL>", then Cloud Storage's reason on the next line.
        reason = [line.strip() for line in str(exc).splitlines()[1:] if line.strip()]
        cause = f"permission refused ({reason[0] if reason else cause})"
    return StoreError(f"{_bucket_words(url)}: cannot {doing} {url}: {cause}")


def _refused(message: str) -> bool:
    return message.startswith(("Forbidden", "Unauthorized")) or bool(
        re.search(r"\b40[13]\b", message)
    )


def url_for(key: str) -> str:
    return f"{store_url()}/{key.lstrip('/')}"


def display_name(url: str) -> str:
    """The name a person knows an object by: `export.pkl` for `…/export.<sha256>.pkl`."""
    name = urlparse(url).path.rsplit("/", 1)[-1] if is_store_url(url) else Path(url).name
    return re.sub(r"\.[0-9a-f]{64}(?=\.|$)", "", name)


# --- keys: built here only ------------------------------------------------------------------


def job_prefix(job_id: int) -> str:
    return f"jobs/{int(job_id)}"


def job_output_key(job_id: int, name: str, sha256: str) -> str:
    """A job's output named by its content: `jobs/7/export.<sha256>.pkl` for `export.pkl`."""
    stem, _, suffix = name.partition(".")
    return (
        f"{job_prefix(job_id)}/{stem}.{sha256}.{suffix}"
        if suffix
        else f"{job_prefix(job_id)}/{stem}.{sha256}"
    )


def checkpoint_key(job_id: int, epoch: int) -> str:
    return f"{job_prefix(job_id)}/checkpoints/epoch-{int(epoch):04d}.pth"


def checkpoint_pointer_key(job_id: int) -> str:
    return f"{job_prefix(job_id)}/checkpoints/latest.json"


def distributed_checkpoint_url(job_id: int) -> str:
    """The folder of a job's distributed checkpoints (a job whose XLA runtime spans several
    processes: `worker.multihost`). torch_xla's CheckpointManager writes and lists the files in
    it through fsspec itself, one sub-folder per epoch; under the job's checkpoints, so they
    are removed with them. Listings cached in this process are dropped first: the manager
    lists the folder when it starts."""
    from fsspec.core import url_to_fs

    url = url_for(f"{job_prefix(job_id)}/checkpoints/distributed")
    # The filesystem object the manager gets for the URL (fsspec keeps one per thread).
    fs, _path = url_to_fs(url)
    fs.invalidate_cache()
    return url


def dataset_archive_key(sha256: str) -> str:
    return f"datasets/{sha256}.tar"


def dataset_manifest_key(sha256: str) -> str:
    return f"datasets/{sha256}.manifest.json.gz"


# --- writing --------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def put_file(local: Path, key: str, sha256: str | None = None) -> StoredObject:
    """Upload `local` under `key`, visible whole or not at all; returns its URL, size, hash."""
    url = url_for(key)
    fs, path = _split(url)
    digest = sha256 or sha256_file(local)
    size = local.stat().st_size
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        if "file" in fs.protocol:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        fs.put_file(str(local), temporary)
        fs.mv(temporary, path)
    except Exception as exc:
        with contextlib.suppress(Exception):
            fs.rm(temporary)
        raise failure(url, exc, "write") from exc
    return StoredObject(url, size, digest)


def put_json(key: str, value: Any) -> str:
    """A small JSON object (a pointer) under `key`, replaced whole."""
    url = url_for(key)
    fs, path = _split(url)
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        if "file" in fs.protocol:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        fs.pipe_file(temporary, json.dumps(value).encode())
        fs.mv(temporary, path)
    except Exception as exc:
        with contextlib.suppress(Exception):
            fs.rm(temporary)
        raise failure(url, exc, "write") from exc
    return url


# --- reading --------------------------------------------------------------------------------


def exists(url: str) -> bool:
    fs, path = _split(url)
    try:
        fs.invalidate_cache()
        return bool(fs.exists(path))
    except Exception as exc:
        raise failure(url, exc, "look up") from exc


def size(url: str) -> int:
    fs, path = _split(url)
    try:
        fs.invalidate_cache()
        return int(fs.info(path)["size"])
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise failure(url, exc, "look up") from exc


def version(url: str) -> str:
    """What changes when the object is replaced (size and generation, or size and mtime), for
    a cache that must notice a changed object; FileNotFoundError when it is gone."""
    fs, path = _split(url)
    try:
        fs.invalidate_cache()
        info = fs.info(path)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise failure(url, exc, "look up") from exc
    changed = info.get("generation") or info.get("mtime") or info.get("updated")
    return f"{info['size']}:{changed}"


def read_json(key: str) -> Any | None:
    """The JSON object under `key`, or None when there is none."""
    url = url_for(key)
    fs, path = _split(url)
    try:
        fs.invalidate_cache()
        return json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise failure(url, exc, "read") from exc


@contextlib.contextmanager
def open_object(url: str) -> Iterator[IO[bytes]]:
    """A binary stream of the object (or old local file) at `url`; FileNotFoundError if gone."""
    fs, path = _split(url)
    try:
        handle = fs.open(path, "rb", block_size=CHUNK_BYTES)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise failure(url, exc, "read") from exc
    with handle:
        yield handle


def iter_chunks(url: str) -> Iterator[bytes]:
    with open_object(url) as handle:
        while chunk := handle.read(CHUNK_BYTES):
            yield chunk


async def aiter_chunks(url: str) -> AsyncIterator[bytes]:
    """The object's bytes as they arrive, for a server on an event loop (the download route).

    From a bucket: one GET, read on the caller's event loop by a client of its own (the
    process's shared client runs on fsspec's I/O thread) and handed on chunk by chunk, rather
    than `iter_chunks`'s ranged reads through that thread and fsspec's block cache, which copy
    each byte twice more and cross two threads per chunk. A local file is read in a worker
    thread."""
    parsed = urlparse(url)
    if parsed.scheme != "gs":
        chunks = iter_chunks(url)
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
            yield chunk
        return
    import gcsfs
    from gcsfs.retry import validate_response

    client = gcsfs.GCSFileSystem(
        asynchronous=True, loop=asyncio.get_running_loop(), skip_instance_cache=True
    )
    try:
        await client._set_session()
        async with client.session.get(
            url=client.url(f"{parsed.netloc}{parsed.path}"),
            params=client._get_params({}),
            headers=client._get_headers(None),
            timeout=client.requests_timeout,
        ) as response:
            if response.status >= 400:
                validate_response(response.status, await response.read(), url)
            async for chunk in response.content.iter_chunked(CHUNK_BYTES):
                yield chunk
    finally:
        if client._session is not None:
            await client._session.close()


def read_bytes(url: str) -> bytes:
    with open_object(url) as handle:
        return handle.read()


def get_file(url: str, local: Path) -> Path:
    """Download the object to `local` (through a temporary file beside it: whole or absent)."""
    local.parent.mkdir(parents=True, exist_ok=True)
    temporary = local.with_name(f".{local.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open_object(url) as source, open(temporary, "wb") as target:
            shutil.copyfileobj(source, target, CHUNK_BYTES)
        os.replace(temporary, local)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise failure(url, exc, "download") from exc
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
    return local


# --- removing -------------------------------------------------------------------------------


def delete(url: str) -> None:
    fs, path = _split(url)
    try:
        fs.rm(path)
    except FileNotFoundError:
        return
    except Exception as exc:
        raise failure(url, exc, "delete") from exc


def delete_prefix(key: str) -> None:
    """Every object under `key/` (a job's, say); nothing when there is none."""
    url = url_for(key)
    fs, path = _split(url)
    try:
        fs.invalidate_cache()
        if fs.exists(path):
            fs.rm(path, recursive=True)
    except FileNotFoundError:
        return
    except Exception as exc:
        raise failure(url, exc, "delete") from exc


def list_keys(prefix: str) -> list[str]:
    """Keys under `prefix/`, sorted."""
    url = url_for(prefix)
    fs, path = _split(url)
    try:
        fs.invalidate_cache()
        if not fs.exists(path):
            return []
        found = fs.find(path)
    except Exception as exc:
        raise failure(url, exc, "list") from exc
    root = _split(url_for(""))[1].rstrip("/")
    return sorted(str(name)[len(root) + 1 :] for name in found)


def check_reachable() -> None:
    """At start-up: StoreError (one line) when the configured store cannot be used."""
    url = store_url()
    if not is_shared():
        _local_root().mkdir(parents=True, exist_ok=True)
        return
    fs, path = _split(url)
    bucket = path.split("/", 1)[0]
    try:
        fs.invalidate_cache()
        fs.ls(bucket, detail=False)
    except Exception as exc:
        raise failure(url, exc, "reach") from exc

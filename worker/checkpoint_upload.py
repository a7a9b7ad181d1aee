"""Checkpoints in the store, so that a job resumes on any worker after its VM is gone.

Each epoch's checkpoint is written on this machine first (`worker.checkpoint`), then uploaded
by a thread of its own while training goes on. Only after an upload is whole does the job's
pointer object (`latest.json`) name it, so the pointer never names a broken checkpoint. A
failed upload is retried with back-off and reported in the job's log; it never fails the job.
When a newer checkpoint is waiting, the older one is given up. The last `kept` checkpoints
of the job stay in the store; after success they go, unless asked to keep them.

On resume, `newest_checkpoint` takes whichever is newer: this machine's copy (a job resumed
where it ran) or the store's (a job resumed on another worker).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import store
from common.errors import first_line
from db.engine import retry_with_backoff
from worker import checkpoint
from worker.failpoints import CHECKPOINT_UPLOAD_RETRYING, CHECKPOINT_UPLOADED, failpoint

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0
CLOSE_TIMEOUT_S = 10.0
# (level, message) into the job's log
Report = Callable[[str, str], None]


@dataclass(frozen=True)
class _Upload:
    local: Path  # a hard link to the epoch's checkpoint file, so the next write cannot change it
    epoch: int


class CheckpointUploader:
    def __init__(self, job_id: int, job_dir: Path, report: Report, kept: int = 2):
        self.job_id = job_id
        self.job_dir = job_dir
        self.report = report
        self.kept = kept
        self.uploaded_epoch: int | None = None
        self._waiting: _Upload | None = None
        self._busy = False
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="checkpoint-upload", daemon=True)
        self._thread.start()

    def submit(self, path: Path, epoch: int) -> None:
        """Upload the checkpoint of `epoch` (0-based) now at `path`; replaces one still waiting."""
        link = path.with_name(f".upload-epoch-{epoch}.{os.getpid()}.pth")
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        os.link(path, link)
        with self._changed:
            if self._waiting is not None:
                self._waiting.local.unlink(missing_ok=True)
            self._waiting = _Upload(link, epoch)
            self._changed.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Until every submitted checkpoint is uploaded or given up; False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._waiting is None and not self._busy, timeout=timeout
            )

    def close(self) -> None:
        with self._changed:
            self._closed = True
            if self._waiting is not None:
                self._waiting.local.unlink(missing_ok=True)
                self._waiting = None
            self._changed.notify_all()
        # An upload in flight is abandoned after a short while: a stopping job must not wait
        # out a back-off; the pointer still names the last whole checkpoint.
        self._thread.join(timeout=CLOSE_TIMEOUT_S)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._waiting is not None or self._closed)
                if self._closed:
                    return
                upload, self._waiting, self._busy = self._waiting, None, True
            try:
                self._upload(upload)
            finally:
                upload.local.unlink(missing_ok=True)
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()

    def _superseded(self) -> bool:
        with self._changed:
            return self._closed or self._waiting is not None

    def _on_retry(self, epoch: int) -> Callable[[BaseException, float], None]:
        def report(exc: BaseException, delay: float) -> None:
            self.report(
                "warning",
                f"the checkpoint of epoch {epoch + 1} is not in the store yet: {first_line(exc)}; "
                f"retrying in {delay:g} s (training goes on)",
            )
            failpoint(CHECKPOINT_UPLOAD_RETRYING)

        return report

    def _upload(self, upload: _Upload) -> None:
        key = store.checkpoint_key(self.job_id, upload.epoch)
        try:
            stored = retry_with_backoff(
                lambda: store.put_file(upload.local, key),
                f"upload the checkpoint of epoch {upload.epoch + 1}",
                retryable=lambda exc: isinstance(exc, OSError),
                give_up=self._superseded,
                max_backoff_s=MAX_BACKOFF_S,
                on_retry=self._on_retry(upload.epoch),
            )
            pointer = {"epoch": upload.epoch, "url": stored.url, "sha256": stored.sha256}
            store.put_json(store.checkpoint_pointer_key(self.job_id), pointer)
        except Exception as exc:
            self.report(
                "warning",
                f"gave up uploading the checkpoint of epoch {upload.epoch + 1}: {first_line(exc)}",
            )
            return
        self.uploaded_epoch = upload.epoch
        log.info("checkpoint of epoch %d uploaded to %s", upload.epoch + 1, stored.url)
        self._prune()
        failpoint(CHECKPOINT_UPLOADED)

    def _prune(self) -> None:
        """Keep the newest `kept` checkpoints of the job in the store."""
        with contextlib.suppress(store.StoreError):
            prefix = store.job_prefix(self.job_id) + "/checkpoints"
            objects = [key for key in store.list_keys(prefix) if key.endswith(".pth")]
            for key in objects[: -self.kept]:
                store.delete(store.url_for(key))


class CheckpointUnavailable(RuntimeError):
    """The store's checkpoint, which every host of a multi-host job must resume from, cannot
    be read: no host may start from another one."""


def remove_uploaded(job_id: int) -> None:
    """The job's checkpoints in the store (after success, unless they are to be kept)."""
    store.delete_prefix(store.job_prefix(job_id) + "/checkpoints")


def newest_checkpoint(
    job_dir: Path, job_id: int, report: Report, store_only: bool = False
) -> tuple[Any, str] | None:
    """The newest checkpoint of the job and where it came from, or None when there is none.

    `store_only`: the store's alone, never this machine's copy, which may be newer than the
    store's or older: every host of a multi-host job must resume from the same one."""
    local = None if store_only else checkpoint.load_checkpoint(job_dir)
    try:
        pointer = store.read_json(store.checkpoint_pointer_key(job_id))
    except store.StoreError as exc:
        if store_only:
            raise CheckpointUnavailable(
                f"cannot look for a checkpoint in the store: {exc}"
            ) from None
        report("warning", f"cannot look for a checkpoint in the store: {exc}")
        pointer = None
    if pointer is not None and (local is None or local["epoch"] < pointer["epoch"]):
        fetched = _fetch(job_dir, pointer, report)
        if fetched is not None:
            return fetched, pointer["url"]
        if store_only:
            raise CheckpointUnavailable(
                f"cannot fetch the store's checkpoint {pointer.get('url')}, from which every "
                "host resumes"
            )
    if local is None:
        return None
    return local, f"this machine's copy ({checkpoint.checkpoint_path(job_dir)})"


def _fetch(job_dir: Path, pointer: dict[str, Any], report: Report) -> Any | None:
    target = checkpoint.checkpoint_path(job_dir)
    try:
        job_dir.mkdir(parents=True, exist_ok=True)
        temporary = store.get_file(pointer["url"], target.with_name(".fetched-checkpoint.pth"))
        if store.sha256_file(temporary) != pointer["sha256"]:
            temporary.unlink(missing_ok=True)
            report("warning", f"the checkpoint {pointer['url']} is not the one uploaded; ignored")
            return None
        os.replace(temporary, target)
    except (OSError, KeyError) as exc:
        report("warning", f"cannot fetch the checkpoint {pointer.get('url')}: {first_line(exc)}")
        return None
    return checkpoint.load_checkpoint(job_dir)

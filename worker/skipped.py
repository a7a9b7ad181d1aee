"""Images that stop decoding during training: skipped, counted and reported in the job's log.

A job does not decode its images before training: registration decoded each once, and the
manifest lists those that decode (`datasets.manifest`). A file that cannot be decoded when a
batch reads it (damaged, replaced or removed since) is left out by fastai's SkipItemException:
its batch is filled from the next images, so a training batch keeps its size. The DataLoader may
read in worker processes, so each skip is one line appended to a file in the job's folder (one
`write` each, in append mode: lines from several processes never mix); the training process
reads the new lines after every epoch and reports them in the job's log.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from fastai.callback.core import Callback
from fastai.data.load import SkipItemException
from fasttransform.transform import Transform

from datasets.images import ImageSource, open_image
from datasets.validation import counted

log = logging.getLogger(__name__)

RECORD_NAME = "skipped-files.jsonl"
MAX_REASON_CHARS = 300
NAMED_IN_LOG = 5


class SkipRecord:
    """The files skipped in one job's process and its DataLoader workers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.files: dict[str, str] = {}  # every file skipped so far → why
        self._read_bytes = 0

    def add(self, source: Any, exc: BaseException) -> None:
        reason = (str(exc).replace(str(source), "the file") or type(exc).__name__)[
            :MAX_REASON_CHARS
        ]
        line = json.dumps([str(source), reason], ensure_ascii=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as record:
            record.write(line)

    def new(self) -> dict[str, str]:
        """Files skipped since the last call (each once, however often it was read)."""
        try:
            with open(self.path, "rb") as record:
                record.seek(self._read_bytes)
                data = record.read()
        except FileNotFoundError:
            return {}
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written waits
        self._read_bytes += len(whole)
        found: dict[str, str] = {}
        for line in whole.decode("utf-8").splitlines():
            name, reason = json.loads(line)
            if name not in self.files:
                self.files[name] = found[name] = reason
        return found


class OpenOrSkip(Transform):
    """`datasets.images.open_image` for training: a file that does not decode is recorded and
    skipped. Pickled (in the export) it is `open_image` itself, as in a model trained before."""

    def __init__(self, record: SkipRecord) -> None:
        super().__init__()
        self.record = record
        # What fastai records for inference (`TfmdLists.infer_idx`) from a transform made of a
        # typed function: here those of `open_image`, so the pipeline's types are unchanged.
        self.input_types = Transform(open_image).input_types

    def encodes(self, source: ImageSource) -> Any:
        try:
            return open_image(source)
        except Exception as exc:
            self.record.add(source, exc)
            raise SkipItemException() from None

    def __reduce__(self) -> tuple[Any, ...]:
        return (Transform, (open_image,))

    def __copy__(self) -> OpenOrSkip:
        return OpenOrSkip(self.record)

    def __deepcopy__(self, memo: dict[int, Any]) -> OpenOrSkip:
        return OpenOrSkip(self.record)  # one record, wherever the transform is copied


class SkippedFilesCallback(Callback):
    """Reports the files skipped in each epoch in the job's log, and the count so far."""

    def __init__(self, record: SkipRecord) -> None:
        self.record = record

    def after_epoch(self) -> None:
        report(self.record)

    def after_fit(self) -> None:
        report(self.record)


def report(record: SkipRecord) -> None:
    new = record.new()
    if not new:
        return
    shown = "; ".join(f"{name} ({reason})" for name, reason in list(new.items())[:NAMED_IN_LOG])
    more = len(new) - NAMED_IN_LOG
    log.warning(
        "skipped %s that could not be decoded when read: %s%s (%s skipped in this job so far)",
        counted(len(new), "file"),
        shown,
        f"; and {more} more" if more > 0 else "",
        f"{len(record.files):,}",
    )


def skipped_files(dl: Any) -> set[str]:
    """Every file known to have been skipped by the DataLoader `dl` (or one made from it by
    `new`: they share their type transforms), after reporting the newest."""
    for part in getattr(dl.dataset, "tls", []):
        for step in part.tfms.fs:
            if isinstance(step, OpenOrSkip):
                report(step.record)
                return set(step.record.files)
    return set()

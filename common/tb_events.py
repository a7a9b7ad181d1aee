"""TensorBoard event files, written with the tensorboard package alone (no TensorFlow, no torch).

A run is a folder holding one event file (`events.out.tfevents.…`): scalars (tag, step, value,
wall time) as the Scalars dashboard reads them, and hyper-parameters as the HParams dashboard
reads them (a session start info; the dashboard works out the experiment from the runs).
`tensorboard --logdir DIR` shows each folder under DIR as a run.

Records are written synchronously through tensorboard's own `RecordWriter` (the framing and
CRCs TensorBoard checks), so a run is whole when `RunWriter.close` returns. `write_runs` puts
runs under a folder only once every one of them is whole: they are written in a hidden
temporary folder beside them first, then each is renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.summary.writer.record_writer import RecordWriter

FILE_VERSION = "brain.Event:2"
WRITER_NAME = "traindeck"
# A scalar point: (step, value, wall time in seconds since the epoch).
Point = tuple[int, float, float]


class RunWriter:
    """One run's event file in `folder` (made if missing)."""

    def __init__(self, folder: Path, wall_time: float | None = None):
        folder.mkdir(parents=True, exist_ok=True)
        stamp = time.time() if wall_time is None else wall_time
        name = f"events.out.tfevents.{int(stamp):010d}.{socket.gethostname()}.{WRITER_NAME}"
        self.path = folder / name
        self._writer = RecordWriter(open(self.path, "wb"))  # noqa: SIM115 (closed in close())
        self._event(
            event_pb2.Event(
                wall_time=stamp,
                file_version=FILE_VERSION,
                source_metadata=event_pb2.SourceMetadata(writer=WRITER_NAME),
            )
        )

    def _event(self, event: event_pb2.Event) -> None:
        self._writer.write(event.SerializeToString())

    def scalars(self, tag: str, points: Iterable[Point]) -> int:
        """Write each (step, value, wall time) of `tag`; returns how many."""
        count = 0
        for step, value, wall_time in points:
            summary = summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]
            )
            self._event(event_pb2.Event(wall_time=wall_time, step=step, summary=summary))
            count += 1
        return count

    def hparams(self, values: Mapping[str, Any], wall_time: float, trial_id: str) -> None:
        """The run's hyper-parameters (`hparam_values` makes any mapping fit)."""
        summary = hparams_summary.hparams_pb(
            hparam_values(values), trial_id=trial_id, start_time_secs=wall_time
        )
        self._event(event_pb2.Event(wall_time=wall_time, step=0, summary=summary))

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def hparam_values(values: Mapping[str, Any]) -> dict[str, bool | float | str]:
    """`values` as the HParams dashboard takes them: booleans, numbers and text; anything else
    (None, a list, a mapping) as its JSON text."""
    result: dict[str, bool | float | str] = {}
    for name, value in values.items():
        if isinstance(value, bool | str):
            result[name] = value
        elif isinstance(value, int | float):
            result[name] = float(value)
        else:
            result[name] = json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    return result


# A run to write: its folder's name, and what fills its RunWriter.
Run = tuple[str, Callable[[RunWriter], None]]


def write_runs(target: Path, runs: Sequence[Run]) -> list[Path]:
    """Write each run into `target/NAME`, replacing a run of that name already there. Nothing
    appears under `target` until every run is written; an OSError leaves `target` as it was
    (but for a folder `target` itself, made if it was missing)."""
    target.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".traindeck-export-", dir=target))
    try:
        for name, fill in runs:
            with RunWriter(staging / name) as writer:
                fill(writer)
        placed = []
        for name, _ in runs:
            final = target / name
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging / name, final)
            placed.append(final)
        return placed
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def zip_runs(out: BinaryIO, runs: Sequence[Run]) -> None:
    """The runs as a zip written to `out`: one folder per run, as `write_runs` lays them out."""
    with tempfile.TemporaryDirectory(prefix="traindeck-export-") as folder:
        written = write_runs(Path(folder), runs)
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for run in written:
                for path in sorted(run.rglob("*")):
                    if path.is_file():
                        archive.write(path, path.relative_to(folder).as_posix())

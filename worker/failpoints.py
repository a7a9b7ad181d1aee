"""Named points in the job process where a fault test can stop it, for tests only.

A test that cancels a job "during the export" must hit that moment on every machine. Sampling
a running process for it misses: on a fast machine the export came and went between two
samples. So, like FoundationDB's and TiKV's failpoints, the code names its moments and a test
arms the ones it needs: the job process reads TRAINDECK_FAILPOINTS (names separated by commas,
each optionally `NAME@N` for its Nth passage) once, and the first time (or the Nth) it reaches
an armed failpoint it stops itself with SIGSTOP. The test sees it stopped there, does its
checks, and resumes it with SIGCONT (or kills it).

Nothing sets the variable outside the tests; an unarmed failpoint is one set lookup.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Mapping

ENV_VAR = "TRAINDECK_FAILPOINTS"

# In lr_find, at its first batch: fastai has saved the weights it restores afterwards
# (<job>/models/<tmp>/_tmp.pth).
LR_FIND_TMP_SAVED = "lr_find.tmp_saved"
# At the first validation batch: the epoch has trained, its batch points are with the
# telemetry writer, and no epoch metric or checkpoint exists yet.
VALIDATION_STARTED = "validation.started"
# The exported model is written (and fsynced) under its temporary name, not yet renamed.
EXPORT_TMP_WRITTEN = "export.tmp_written"
# An epoch's checkpoint is whole in the store and the job's pointer names it.
CHECKPOINT_UPLOADED = "checkpoint.uploaded"
# An upload of a checkpoint failed and its retry is reported in the job's log (which reaches
# the database before the process stops, as at every failpoint).
CHECKPOINT_UPLOAD_RETRYING = "checkpoint.upload_retrying"

NAMES = frozenset(
    {
        LR_FIND_TMP_SAVED,
        VALIDATION_STARTED,
        EXPORT_TMP_WRITTEN,
        CHECKPOINT_UPLOADED,
        CHECKPOINT_UPLOAD_RETRYING,
    }
)


def armed_from(environ: Mapping[str, str]) -> dict[str, int]:
    """The failpoints `environ` arms, each with the passage it stops at (1 = the first). An
    unknown name is refused, so a typo in a test fails the job at once instead of letting the
    test wait for a moment that never comes."""
    armed = {}
    for entry in environ.get(ENV_VAR, "").split(","):
        name, _, nth = entry.strip().partition("@")
        if name:
            if not (nth or "1").isdigit() or int(nth or "1") < 1:
                raise ValueError(f"{ENV_VAR}: {entry.strip()!r} is not NAME or NAME@N (N ≥ 1)")
            armed[name] = int(nth or "1")
    unknown = set(armed) - NAMES
    if unknown:
        raise ValueError(
            f"{ENV_VAR}: unknown failpoint(s) {sorted(unknown)}; known: {sorted(NAMES)}"
        )
    return armed


_armed = armed_from(os.environ)
# Locks held while this process writes to the database (the telemetry writer's): taken before
# stopping, so the stopped process holds no SQLite write lock that the test would wait on.
_quiet_first: list[threading.Lock] = []
# Called before stopping (the telemetry writer's flush), so that what the job reported until
# the failpoint is in the database while the process is stopped: a test reads it there.
_flush_first: list[Callable[[], object]] = []


def wait_for_before_stopping(lock: threading.Lock) -> None:
    if _armed:
        _quiet_first.append(lock)


def flush_before_stopping(flush: Callable[[], object]) -> None:
    if _armed:
        _flush_first.append(flush)


def any_armed() -> bool:
    return bool(_armed)


def failpoint(name: str) -> None:
    """Stop this process here (SIGSTOP) at the armed passage of `name`, once only, so that a
    resumed process runs on to its end."""
    if name not in _armed:
        return
    _armed[name] -= 1
    if _armed[name] > 0:
        return
    del _armed[name]
    for flush in _flush_first:
        flush()
    for lock in _quiet_first:
        lock.acquire()
    try:
        os.kill(os.getpid(), signal.SIGSTOP)
    finally:
        for lock in _quiet_first:
            lock.release()

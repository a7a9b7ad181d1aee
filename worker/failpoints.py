"""Named points in the job process where a fault test can stop it, for tests only.

A test that cancels a job "during the export" must hit that moment on every machine. Sampling
a running process for it misses: on a fast machine the export came and went between two
samples. So, like FoundationDB's and TiKV's failpoints, the code names its moments and a test
arms the ones it needs: the job process reads TRAINDECK_FAILPOINTS (names separated by commas)
once, and the first time it reaches an armed failpoint it stops itself with SIGSTOP. The test
sees it stopped there, does its checks, and resumes it with SIGCONT.

Nothing sets the variable outside the tests; an unarmed failpoint is one set lookup.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

ENV_VAR = "TRAINDECK_FAILPOINTS"

# In lr_find, at its first batch: fastai has saved the weights it restores afterwards
# (<job>/models/<tmp>/_tmp.pth).
LR_FIND_TMP_SAVED = "lr_find.tmp_saved"
# At the first validation batch: the epoch has trained, its batch points are with the
# telemetry writer, and no epoch metric or checkpoint exists yet.
VALIDATION_STARTED = "validation.started"
# The exported model is written (and fsynced) under its temporary name, not yet renamed.
EXPORT_TMP_WRITTEN = "export.tmp_written"

NAMES = frozenset({LR_FIND_TMP_SAVED, VALIDATION_STARTED, EXPORT_TMP_WRITTEN})


def armed_from(environ: Mapping[str, str]) -> set[str]:
    """The failpoints `environ` arms; an unknown name is refused, so a typo in a test fails
    the job at once instead of letting the test wait for a moment that never comes."""
    names = {name.strip() for name in environ.get(ENV_VAR, "").split(",") if name.strip()}
    unknown = names - NAMES
    if unknown:
        raise ValueError(
            f"{ENV_VAR}: unknown failpoint(s) {sorted(unknown)}; known: {sorted(NAMES)}"
        )
    return names


_armed = armed_from(os.environ)


def any_armed() -> bool:
    return bool(_armed)


def failpoint(name: str) -> None:
    """Stop this process here (SIGSTOP) if `name` is armed, the first time only, so that a
    resumed process runs on to its end."""
    if name in _armed:
        _armed.discard(name)
        os.kill(os.getpid(), signal.SIGSTOP)

"""Recording a file on this machine as a job's artifact, as rows from before the store did
(their `path` is a local path; the readers still accept one)."""

from __future__ import annotations

from pathlib import Path

from common.store import sha256_file
from db.artifacts import record_artifact
from db.engine import Engine
from db.models import Artifact


def record_local_file(engine: Engine, job_id: int, kind: str, path: Path) -> Artifact:
    return record_artifact(engine, job_id, kind, str(path), path.stat().st_size, sha256_file(path))

"""A job's recorded files, read back only as the bytes the worker recorded.

An exported `.pkl` is a pickle: unpickling it runs whatever code the file names. So a reader
takes the file's bytes once, hashes those very bytes, and hands them on only when the hash is
the SHA-256 recorded in `artifacts` when the worker wrote the file. Checking the file and then
opening it again by path would leave a moment in which the file could be swapped.

Both the dashboard and `python -m worker predict` load exports through here.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import Engine

from common import store
from db.artifacts import get_artifact
from db.models import Artifact
from db.queue import JobNotFound, get_job

ARTIFACT_WORDS = {"export": "exported model", "model_card": "model card"}


class ArtifactUnavailable(ValueError):
    """The file cannot be used; the message says why, in words a person can act on."""


class ArtifactTampered(ArtifactUnavailable):
    """The file on disk is not the one the worker recorded."""


def _words(kind: str) -> str:
    return ARTIFACT_WORDS.get(kind, kind)


def recorded_artifact(engine: Engine, job_id: int, kind: str = "export") -> Artifact:
    """The job's recorded artifact of `kind`, or ArtifactUnavailable saying why there is none."""
    try:
        job = get_job(engine, job_id)
    except JobNotFound:
        raise ArtifactUnavailable(f"there is no job #{job_id}") from None
    artifact = get_artifact(engine, job_id, kind)
    if artifact is not None:
        return artifact
    if job.status != "succeeded":
        raise ArtifactUnavailable(
            f"job #{job_id} has no {_words(kind)}: it is {job.status}, and only a job that "
            "succeeds gets one"
        )
    raise ArtifactUnavailable(f"job #{job_id} has no {_words(kind)} recorded")


def gone_message(artifact: Artifact) -> str:
    where = "in the store" if store.is_store_url(artifact.path) else "on this machine"
    return (
        f"the {_words(artifact.kind)} of job #{artifact.job_id} ({artifact.path}) is not "
        f"{where} any more"
    )


def read_verified(artifact: Artifact) -> bytes:
    """The file's bytes, read once, if their SHA-256 is the recorded one; else refuse."""
    try:
        data = store.read_bytes(artifact.path)
    except FileNotFoundError:
        raise ArtifactUnavailable(gone_message(artifact)) from None
    except store.StoreError as exc:
        raise ArtifactUnavailable(str(exc)) from None
    except OSError as exc:
        raise ArtifactUnavailable(f"cannot read {artifact.path}: {exc.strerror}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != artifact.sha256:
        refusal = (
            "refusing to load it: an export is a pickle, and a changed one could run any code"
            if artifact.kind == "export"
            else "refusing to use it"
        )
        raise ArtifactTampered(
            f"the {_words(artifact.kind)} of job #{artifact.job_id} ({artifact.path}) is not the "
            f"file the worker recorded: its SHA-256 is {digest[:16]}…, the recorded one "
            f"{artifact.sha256[:16]}…; {refusal}"
        )
    return data

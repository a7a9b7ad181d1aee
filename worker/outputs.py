"""A job's finished files (the export, the model card) put in the store, named by their
SHA-256, and recorded by their store URL, so that the dashboard and `predict` on any machine
read them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from common import store
from db.artifacts import record_artifact
from db.engine import retry_with_backoff
from db.models import Artifact

if TYPE_CHECKING:
    from worker.training import TrainingContext

MAX_BACKOFF_S = 10.0
ATTEMPTS = 5


def publish(ctx: TrainingContext, kind: str, local: Path) -> Artifact:
    """Upload `local` (tried again with back-off a few times) and record it as the job's `kind`.

    A store that stays unusable raises StoreError: one line naming the bucket and the cause."""
    job_id = ctx.lease.job_id
    digest = store.sha256_file(local)
    key = store.job_output_key(job_id, local.name, digest)
    attempts = iter(range(ATTEMPTS - 1))
    stored = retry_with_backoff(
        lambda: store.put_file(local, key, digest),
        f"put the {kind} in the store",
        retryable=lambda exc: isinstance(exc, OSError),
        give_up=lambda: ctx.stop.is_set() or next(attempts, None) is None,
        max_backoff_s=MAX_BACKOFF_S,
    )
    return ctx.db(
        lambda: record_artifact(ctx.engine, job_id, kind, stored.url, stored.bytes, digest),
        f"record the {kind}",
    )

"""Files a job produced (its exported model, model card, checkpoint), recorded by their store
URL (`common.store`) with their size and SHA-256. Rows from before the store hold a local path."""

from __future__ import annotations

from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.orm import Session

from db.engine import read_tx, write_tx
from db.models import Artifact, utcnow


def record_artifact(
    engine: Engine, job_id: int, kind: str, url: str, size: int, digest: str
) -> Artifact:
    """Record (or replace) the job's artifact of `kind`: the stored object at `url`."""
    with write_tx(engine) as connection:
        connection.execute(delete(Artifact).where(Artifact.job_id == job_id, Artifact.kind == kind))
        connection.execute(
            insert(Artifact).values(
                job_id=job_id,
                kind=kind,
                path=url,
                bytes=size,
                sha256=digest,
                created_at=utcnow(),
            )
        )
    return Artifact(job_id=job_id, kind=kind, path=url, bytes=size, sha256=digest)


def list_artifacts(engine: Engine, job_id: int) -> list[Artifact]:
    with read_tx(engine) as connection, Session(bind=connection) as session:
        artifacts = list(
            session.scalars(select(Artifact).where(Artifact.job_id == job_id).order_by(Artifact.id))
        )
        session.expunge_all()
        return artifacts


def get_artifact(engine: Engine, job_id: int, kind: str) -> Artifact | None:
    return next((a for a in list_artifacts(engine, job_id) if a.kind == kind), None)

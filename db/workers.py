"""The `workers` table: each worker process registers, beats, and says what it is doing."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.orm import Session

from db.engine import read_tx, write_tx
from db.models import Worker, utcnow


def register_worker(engine: Engine, worker_id: str, host: str, pid: int, device: str) -> None:
    now = utcnow()
    with write_tx(engine) as connection:
        connection.execute(delete(Worker).where(Worker.id == worker_id))
        connection.execute(
            insert(Worker).values(
                id=worker_id,
                host=host,
                pid=pid,
                device=device,
                state="idle",
                started_at=now,
                heartbeat_at=now,
                current_job_id=None,
                jobs_done=0,
            )
        )


def worker_heartbeat(
    engine: Engine, worker_id: str, state: str, current_job_id: int | None
) -> None:
    with write_tx(engine) as connection:
        connection.execute(
            update(Worker)
            .where(Worker.id == worker_id)
            .values(heartbeat_at=utcnow(), state=state, current_job_id=current_job_id)
        )


def worker_job_done(engine: Engine, worker_id: str) -> None:
    with write_tx(engine) as connection:
        connection.execute(
            update(Worker)
            .where(Worker.id == worker_id)
            .values(jobs_done=Worker.jobs_done + 1, current_job_id=None, state="idle")
        )


def worker_stopped(engine: Engine, worker_id: str) -> None:
    with write_tx(engine) as connection:
        connection.execute(
            update(Worker)
            .where(Worker.id == worker_id)
            .values(state="stopped", current_job_id=None, heartbeat_at=utcnow())
        )


def list_workers(engine: Engine) -> list[Worker]:
    with read_tx(engine) as connection, Session(bind=connection) as session:
        workers = list(session.scalars(select(Worker).order_by(Worker.started_at.desc())))
        session.expunge_all()
        return workers


def is_stale(worker: Worker, timeout_s: float) -> bool:
    return worker.heartbeat_at < utcnow() - timedelta(seconds=timeout_s)

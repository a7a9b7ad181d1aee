"""A finished job's results on its validation set: the `results` table.

The worker computes them once, at the end of training (`worker.results`), and the job page
reads them (`dashboard.results_view`); nothing recomputes them at a page view.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.orm import Session

from db.engine import read_tx, write_tx
from db.models import Result, utcnow


def save_results(
    engine: Engine,
    job_id: int,
    *,
    classes: list[str],
    confusion: list[list[int]],
    per_class: list[dict[str, Any]],
    top_losses: list[dict[str, Any]],
    predictions: list[list[str]],
    accuracy: float,
    valid_loss: float,
) -> None:
    """Store (or replace, for a job trained again after a resume) the results of one job."""
    size = len(classes)
    if len(confusion) != size or any(len(row) != size for row in confusion):
        raise ValueError(f"the confusion matrix must be {size}×{size}, one row per class")
    if len(per_class) != size:
        raise ValueError(f"per_class must hold one row per class ({size}), not {len(per_class)}")
    with write_tx(engine) as connection:
        connection.execute(delete(Result).where(Result.job_id == job_id))
        connection.execute(
            insert(Result).values(
                job_id=job_id,
                created_at=utcnow(),
                classes=classes,
                confusion=confusion,
                per_class=per_class,
                top_losses=top_losses,
                predictions=predictions,
                accuracy=accuracy,
                valid_loss=valid_loss,
            )
        )


def get_results(engine: Engine, job_id: int) -> Result | None:
    with read_tx(engine) as connection, Session(bind=connection) as session:
        result = session.scalar(select(Result).where(Result.job_id == job_id))
        if result is not None:
            session.expunge(result)
        return result

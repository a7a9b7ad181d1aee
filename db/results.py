"""A finished job's results on its validation set: the `results` table.

The worker computes them once, at the end of training (`worker.results`), and the job page
reads them (`dashboard.results_view`); nothing recomputes them at a page view.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Engine, delete, func, insert, select, text
from sqlalchemy.orm import Session, defer

from db.engine import is_sqlite, read_tx, write_tx
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


def get_results(engine: Engine, job_id: int, *, predictions: bool = True) -> Result | None:
    """A job's results; without `predictions` (one row per validation image, read in pages by
    `prediction_page`) that column is not read, and must not be touched."""
    statement = select(Result).where(Result.job_id == job_id)
    if not predictions:
        statement = statement.options(defer(Result.predictions, raiseload=True))
    with read_tx(engine) as connection, Session(bind=connection) as session:
        result = session.scalar(statement)
        if result is not None:
            session.expunge(result)
        return result


def prediction_count(engine: Engine, job_id: int) -> int:
    """How many validation predictions a job's results hold (0 when there are none)."""
    statement = select(func.json_array_length(Result.predictions)).where(Result.job_id == job_id)
    with read_tx(engine) as connection:
        return int(connection.execute(statement).scalar() or 0)


# The elements of the predictions array in their order, a page of them: only that page leaves
# the database (SQLite's json_each, Postgres's json_array_elements).
_PAGE_SQL = {
    True: "SELECT e.value FROM results, json_each(results.predictions) AS e "
    "WHERE results.job_id = :job_id ORDER BY e.key LIMIT :limit OFFSET :offset",
    False: "SELECT e.value FROM results, json_array_elements(results.predictions) "
    "WITH ORDINALITY AS e(value, n) WHERE results.job_id = :job_id ORDER BY e.n "
    "LIMIT :limit OFFSET :offset",
}


def prediction_page(engine: Engine, job_id: int, offset: int, limit: int) -> list[list[str]]:
    """Rows [path, actual, predicted] `offset` … `offset + limit - 1` of a job's predictions."""
    statement = text(_PAGE_SQL[is_sqlite(engine)])
    arguments = {"job_id": job_id, "limit": int(limit), "offset": int(offset)}
    with read_tx(engine) as connection:
        values = connection.execute(statement, arguments).scalars()
        # SQLite hands an element back as JSON text, psycopg as the parsed list.
        return [json.loads(value) if isinstance(value, str) else value for value in values]

"""A job's tags and note: set at submit (`db.queue.enqueue`), edited later, read for lists.

Tags are rows of `job_tags` (one per tag), so that a list filtered by tag (`db.joblist`) is a
range of the (tag, job_id) index; the note is a column of `jobs`. Both follow the rules of the
spec's `tags` and `note` fields (`db.spec.parse_labels`), whoever sets them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, insert, select, update

from db.engine import read_tx, write_tx
from db.ids import one_of
from db.models import Job, JobTag
from db.queue import JobNotFound
from db.spec import Labels, parse_labels


def insert_tags(connection: Connection, job_id: int, tags: Iterable[str]) -> None:
    rows = [{"job_id": job_id, "tag": tag} for tag in tags]
    if rows:
        connection.execute(insert(JobTag), rows)


def tags_of(connection: Connection, job_ids: Iterable[int]) -> dict[int, tuple[str, ...]]:
    """Each job's tags in the order they were given (jobs without tags are left out)."""
    job_ids = list(job_ids)
    if not job_ids:
        return {}
    statement = (
        select(JobTag.job_id, JobTag.tag)
        .where(one_of(connection, JobTag.job_id, job_ids))
        .order_by(JobTag.job_id, JobTag.tag)
    )
    found: dict[int, list[str]] = {}
    for job_id, tag in connection.execute(statement):
        found.setdefault(job_id, []).append(tag)
    return {job_id: tuple(tags) for job_id, tags in found.items()}


def job_labels(engine: Engine, job_id: int) -> Labels:
    with read_tx(engine) as connection:
        note = connection.execute(select(Job.note).where(Job.id == job_id)).scalar_one_or_none()
        if note is None:
            raise JobNotFound(job_id)
        tags = tags_of(connection, [job_id]).get(job_id, ())
    return Labels(tags=tags, note=note)


def set_labels(engine: Engine, job_id: int, changes: dict[str, Any]) -> Labels:
    """Change a job's tags and/or note (`changes` holds either or both); validated as the spec's
    fields are (SpecError naming the field). Returns the labels now stored."""
    if not isinstance(changes, dict):
        return parse_labels(changes)  # raises SpecError: not an object
    labels = parse_labels({**job_labels(engine, job_id).model_dump(), **changes})
    with write_tx(engine) as connection:
        changed = connection.execute(
            update(Job).where(Job.id == job_id).values(note=labels.note)
        ).rowcount
        if not changed:
            raise JobNotFound(job_id)
        connection.execute(delete(JobTag).where(JobTag.job_id == job_id))
        insert_tags(connection, job_id, labels.tags)
    return labels


def all_tags(engine: Engine) -> dict[str, int]:
    """Every tag in use, with how many jobs carry it, in order of the tag."""
    statement = select(JobTag.tag, func.count()).group_by(JobTag.tag).order_by(JobTag.tag)
    with read_tx(engine) as connection:
        return {tag: count for tag, count in connection.execute(statement)}

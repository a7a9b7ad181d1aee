"""The dataset registry: the `datasets` table. (Files on disk: `datasets.items`.)"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from db.engine import read_tx, write_tx
from db.models import Dataset, Job, utcnow
from db.spec import training_images

BUILTIN_DATASETS = ("digits",)
ACTIVE_STATUSES = ("queued", "running")


class DatasetExists(ValueError):
    """A dataset of that name is already registered."""


def training_images_of(dataset: Dataset | None, valid_pct: float) -> int | None:
    """The images a job trains on, when the registry knows: None for a dataset that fixes
    its own split (its split counts are not stored) or that no worker has fetched yet."""
    if dataset is None or not dataset.item_count:
        return None
    rule = dataset.label_rule or {}
    if rule.get("split") or rule.get("type") not in (None, "folder", "regex"):
        return None
    return training_images(dataset.item_count, valid_pct)


def dataset_names(engine: Engine) -> set[str]:
    with read_tx(engine) as connection:
        return set(connection.execute(select(Dataset.name)).scalars())


def list_datasets(engine: Engine) -> list[Dataset]:
    with read_tx(engine) as connection, Session(bind=connection) as session:
        datasets = list(session.scalars(select(Dataset).order_by(Dataset.name)))
        session.expunge_all()
        return datasets


def get_dataset(engine: Engine, name: str) -> Dataset | None:
    with read_tx(engine) as connection, Session(bind=connection) as session:
        dataset = session.get(Dataset, name)
        if dataset is not None:
            session.expunge(dataset)
        return dataset


def save_dataset(
    engine: Engine,
    *,
    name: str,
    kind: str,
    location: str,
    label_rule: dict[str, Any],
    classes: list[str],
    class_counts: dict[str, int],
    bad_files: list[str] | None = None,
    replace: bool = False,
    archive_url: str | None = None,
    archive_sha256: str | None = None,
    manifest_url: str | None = None,
    manifest_sha256: str | None = None,
) -> None:
    """Add the registry row of a dataset: DatasetExists if the name is taken, unless `replace`,
    which swaps the old row for the new one in the same transaction."""
    row = {
        "name": name,
        "kind": kind,
        "location": location,
        "label_rule": label_rule,
        "classes": classes,
        "class_counts": class_counts,
        "item_count": sum(class_counts.values()),
        "bad_files": bad_files or [],
        "created_at": utcnow(),
        "archive_url": archive_url,
        "archive_sha256": archive_sha256,
        "manifest_url": manifest_url,
        "manifest_sha256": manifest_sha256,
    }
    try:
        with write_tx(engine) as connection:
            if replace:
                connection.execute(delete(Dataset).where(Dataset.name == name))
            connection.execute(Dataset.__table__.insert().values(**row))
    except IntegrityError:
        raise DatasetExists(f"a dataset named {name!r} is already registered") from None


def update_dataset_contents(
    engine: Engine,
    name: str,
    *,
    label_rule: dict[str, Any],
    classes: list[str],
    class_counts: dict[str, int],
    bad_files: list[str],
    manifest_url: str | None = None,
    manifest_sha256: str | None = None,
) -> bool:
    """Record what a dataset holds: a `url` dataset once the worker has fetched it, a folder
    registered again because it changed."""
    with write_tx(engine) as connection:
        result = connection.execute(
            update(Dataset)
            .where(Dataset.name == name)
            .values(
                label_rule=label_rule,
                classes=classes,
                class_counts=class_counts,
                item_count=sum(class_counts.values()),
                bad_files=bad_files,
                manifest_url=manifest_url,
                manifest_sha256=manifest_sha256,
            )
        )
        return result.rowcount == 1


def active_jobs_using(engine: Engine, name: str) -> list[int]:
    """Ids of the queued and running jobs that train on dataset `name`."""
    with read_tx(engine) as connection:
        rows = connection.execute(
            select(Job.id, Job.spec).where(Job.status.in_(ACTIVE_STATUSES)).order_by(Job.id)
        )
        return [job_id for job_id, spec in rows if (spec or {}).get("dataset") == name]


def remove_dataset(engine: Engine, name: str) -> bool:
    with write_tx(engine) as connection:
        return connection.execute(delete(Dataset).where(Dataset.name == name)).rowcount == 1


def archive_in_use(engine: Engine, sha256: str) -> bool:
    """Whether a registered dataset still names the archive with this SHA-256 (archives are
    named by their content, so two datasets with the same files share one)."""
    with read_tx(engine) as connection:
        found = connection.execute(
            select(Dataset.name).where(Dataset.archive_sha256 == sha256).limit(1)
        )
        return found.first() is not None


def manifest_in_use(engine: Engine, sha256: str) -> bool:
    """Whether a registered dataset still names the manifest with this SHA-256 (two datasets
    registered from the same unchanged folder share one)."""
    with read_tx(engine) as connection:
        found = connection.execute(
            select(Dataset.name).where(Dataset.manifest_sha256 == sha256).limit(1)
        )
        return found.first() is not None

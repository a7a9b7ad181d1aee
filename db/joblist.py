"""Lists of jobs a page at a time, filtered in SQL, at a cost that follows the page, not the table.

Every list (`traindeck jobs`, the dashboard's Jobs page, the job pickers) goes through `fetch`:
the rows after (or before) a cursor in one of three orders, by keyset, never by OFFSET, so the
last page of 70,000 jobs costs what the first does.

- `newest`: by id, newest first; `oldest`: the reverse. Without a status filter, a range of
  the primary key; with one, a range of `ix_jobs_status_id` per status, merged here (five
  statuses at most), since one `status IN (…) ORDER BY id` query would read every row of
  those statuses to sort them.
- `next`: the queued jobs in the order workers claim them (`db.queue.claim`): highest priority
  first, then the oldest, along `ix_jobs_claim`. After a cursor (p, i) come the rest of
  priority p (id > i), then the lower priorities: two ranges of the index, not one OR that
  the index cannot narrow.

A text filter (`search`, `name`) is a LIKE on the name (and the note): it reads jobs, newest
first, until the page is full, so a rare word costs a scan of the jobs, as do `dataset` and
`arch` (fields of the spec); a tag is an EXISTS on the (tag, job_id) index of `job_tags`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from sqlalchemy import Connection, Select, exists, func, or_, select

from db.models import JOB_STATUSES, Job, JobTag

Order = Literal["newest", "oldest", "next"]
ORDERS: tuple[Order, ...] = ("newest", "oldest", "next")


@dataclass(frozen=True)
class Cursor:
    """Where a page ends: a job's id and priority (the keys of every order)."""

    id: int
    priority: int = 0


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a list shows; every field is a condition in SQL.

    `search`: a job number ("12" or "#12") or a piece of the name or of the note, in any
    case; `name`: a piece of the name only; `dataset`, `arch`: the spec's; `tags`: jobs that
    carry every one of them.
    """

    statuses: tuple[str, ...] = ()
    search: str = ""
    name: str = ""
    dataset: str = ""
    arch: str = ""
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.statuses) - set(JOB_STATUSES)
        if unknown:
            raise ValueError(f"unknown job status {sorted(unknown)}; one of {JOB_STATUSES}")

    def for_order(self, order: Order) -> JobFilter:
        """The `next` order lists the queue: queued jobs only."""
        if order == "next":
            return replace(self, statuses=("queued",))
        return self

    def conditions(self) -> list[Any]:
        """The conditions other than the status (which `fetch` turns into index ranges)."""
        conditions: list[Any] = []
        text = self.search.strip()
        if text:
            number = job_number(text)
            by_text = or_(
                Job.name.icontains(text, autoescape=True), Job.note.icontains(text, autoescape=True)
            )
            conditions.append(by_text if number is None else or_(Job.id == number, by_text))
        if self.name:
            conditions.append(Job.name.icontains(self.name, autoescape=True))
        if self.dataset:
            conditions.append(Job.spec["dataset"].as_string() == self.dataset)
        if self.arch:
            conditions.append(Job.spec["arch"].as_string() == self.arch)
        for tag in dict.fromkeys(self.tags):
            conditions.append(exists().where(JobTag.job_id == Job.id, JobTag.tag == tag))
        return conditions


EVERY_JOB = JobFilter()


def job_number(text: str) -> int | None:
    """The job number in "12" or "#12", else None (also for one too large to be an id)."""
    number = text.strip().removeprefix("#").strip()
    if number.isascii() and number.isdigit() and len(number) <= 18:
        return int(number)
    return None


def _status_groups(filters: JobFilter) -> list[Any]:
    statuses = sorted(set(filters.statuses))
    if not statuses or len(statuses) == len(JOB_STATUSES):
        return [None]
    return [Job.status == status for status in statuses]


def _ranges(order: Order, after: Cursor | None, backward: bool) -> list[tuple[list, list]]:
    """(conditions, ORDER BY) of the index ranges that follow `after`, read in sequence."""
    ascending = (order == "oldest") != backward
    if order != "next":
        by_id = Job.id.asc() if ascending else Job.id.desc()
        if after is None:
            return [([], [by_id])]
        return [([Job.id > after.id if ascending else Job.id < after.id], [by_id])]
    # The queue: priority descending, then id ascending; backward is the mirror.
    if backward:
        rest = [Job.priority.asc(), Job.id.desc()]
        if after is None:
            return [([], rest)]
        same = ([Job.priority == after.priority, Job.id < after.id], [Job.id.desc()])
        return [same, ([Job.priority > after.priority], rest)]
    rest = [Job.priority.desc(), Job.id.asc()]
    if after is None:
        return [([], rest)]
    same = ([Job.priority == after.priority, Job.id > after.id], [Job.id.asc()])
    return [same, ([Job.priority < after.priority], rest)]


def sort_key(order: Order, backward: bool = False) -> Callable[[Any], tuple[int, ...]]:
    """The order of `fetch`'s rows, as a key on rows with `id` and `priority`."""
    sign = -1 if backward else 1
    if order == "next":
        return lambda row: (-sign * row.priority, sign * row.id)
    if order == "oldest":
        return lambda row: (sign * row.id,)
    return lambda row: (-sign * row.id,)


def fetch(
    connection: Connection,
    columns: Sequence[Any],
    filters: JobFilter,
    order: Order,
    after: Cursor | None,
    limit: int,
    *,
    backward: bool = False,
) -> list[Any]:
    """Up to `limit` rows of `columns` (which must include Job.id and Job.priority) that come
    after `after` in `order` (before it when `backward`, then nearest first), in that order."""
    filters = filters.for_order(order)
    conditions = filters.conditions()
    found: list[Any] = []
    for status in _status_groups(filters):
        taken: list[Any] = []
        for where, order_by in _ranges(order, after, backward):
            if len(taken) >= limit:
                break
            statement: Select = select(*columns).where(*conditions, *where)
            if status is not None:
                statement = statement.where(status)
            statement = statement.order_by(*order_by).limit(limit - len(taken))
            taken += connection.execute(statement).all()
        found += taken
    found.sort(key=sort_key(order, backward))
    return found[:limit]


def count(connection: Connection, filters: JobFilter, order: Order = "newest") -> int:
    """How many jobs `filters` admit (an index-only count with a status filter alone)."""
    filters = filters.for_order(order)
    statement = select(func.count()).select_from(Job).where(*filters.conditions())
    if filters.statuses and len(set(filters.statuses)) < len(JOB_STATUSES):
        statement = statement.where(Job.status.in_(sorted(set(filters.statuses))))
    return connection.execute(statement).scalar_one()

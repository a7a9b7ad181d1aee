"""Cost that grows with the work, not with the tables: the claim reads the first entry of an
index in its own order, lists page through 70,000 jobs by keyset, metric reads are ranges of
the index and bind no parameter per job, and a refused statement is not called an outage.
On SQLite and on the real Postgres; bench/scale.py prints the timings."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, literal, select, text
from sqlalchemy.exc import OperationalError

from db import queue
from db.engine import database_problem, is_sqlite, is_unavailable
from db.joblist import Cursor, JobFilter
from db.jobs_table import find_jobs, job_page
from db.jobview import iter_jobs
from db.telemetry import MetricPoint, final_metrics, write_metrics
from tests.support.bulk import analyze, insert_jobs, insert_points
from tests.support.seed import epoch_points
from traindeck.cli import main

MANY = 70_000
STATUSES = ("succeeded", "queued", "failed", "cancelled", "queued", "running", "queued")


@contextmanager
def statements_run(engine: Engine) -> Iterator[list[tuple[str, Any]]]:
    """The (SQL, parameters) the driver receives while the block runs."""
    seen: list[tuple[str, Any]] = []

    def remember(_connection, _cursor, statement, parameters, _context, _executemany):
        seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", remember)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", remember)


def plan(engine: Engine, statement: str, parameters: Any) -> str:
    """The database's plan of a statement the driver received, as text."""
    prefix = "EXPLAIN QUERY PLAN " if is_sqlite(engine) else "EXPLAIN "
    with engine.connect() as connection:
        rows = connection.exec_driver_sql(prefix + statement, parameters).all()
    return "\n".join(str(row[-1]) for row in rows)


def the_one(seen: list[tuple[str, Any]], words: str) -> tuple[str, Any]:
    matching = [(sql, params) for sql, params in seen if words in sql]
    assert len(matching) == 1, [sql for sql, _ in seen]
    return matching[0]


def status_of(job_id: int, first: int) -> str:
    """The status `insert_jobs` gave the job: the i-th (from 1) has STATUSES[i % 7]."""
    return STATUSES[(job_id - first + 1) % len(STATUSES)]


def queue_order(engine: Engine) -> list[int]:
    """The queued jobs in the order workers must take them, by a plain sort here."""
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT id, priority FROM jobs WHERE status = 'queued'"))
        return [job_id for job_id, _ in sorted(rows, key=lambda row: (-row[1], row[0]))]


# --- the claim ------------------------------------------------------------------------------


def test_the_claim_reads_the_claim_index_in_its_order_and_sorts_nothing(engine):
    insert_jobs(engine, 20_000, statuses=STATUSES, priorities=5)
    analyze(engine)
    expected = queue_order(engine)[:3]

    with statements_run(engine) as seen:
        claimed = [queue.claim(engine, "w1") for _ in range(3)]
    assert [job.id for job in claimed] == expected

    sql, params = the_one(seen[: len(seen) // 3], "UPDATE jobs")
    shown = plan(engine, sql, params)
    assert "ix_jobs_claim" in shown, shown
    if is_sqlite(engine):
        assert "TEMP B-TREE" not in shown, shown
    else:
        assert "Sort" not in shown and "Seq Scan on jobs" not in shown, shown


# --- metric reads ---------------------------------------------------------------------------


def test_final_metrics_reads_only_the_epoch_range_of_the_index(engine):
    job_id, other = insert_jobs(engine, 2)
    insert_points(engine, job_id, "batch/train_loss", 20_000)
    insert_points(engine, other, "batch/train_loss", 5_000)
    write_metrics(engine, job_id, [p for epoch in range(3) for p in epoch_points(epoch)])
    write_metrics(engine, other, [MetricPoint("epoch/accuracy", 0, 0.25)])
    # Names on either side of the range: neither is an epoch metric.
    write_metrics(engine, job_id, [MetricPoint("epoch", 9, 1.0), MetricPoint("epoch0", 9, 2.0)])
    analyze(engine)

    with statements_run(engine) as seen:
        finals = final_metrics(engine, [job_id, other])
    assert finals[job_id] == pytest.approx(
        {"train_loss": 1 / 3, "valid_loss": 1.2 / 3, "accuracy": 0.7, "error_rate": 0.3}
    )
    assert finals[other] == {"accuracy": 0.25}
    sql, params = the_one(seen, "FROM metrics")
    assert "LIKE" not in sql.upper()
    shown = plan(engine, sql, params)
    if is_sqlite(engine):
        assert "name>? AND name<?" in shown, shown
        assert "SCAN metrics" not in shown, shown
    else:
        assert "Seq Scan on metrics" not in shown, shown
        assert "name >=" in shown and "name <" in shown, shown


def test_final_metrics_of_70k_jobs_binds_no_parameter_per_job(engine):
    job_id = queue.submit(engine, {"name": "measured"})
    write_metrics(engine, job_id, [MetricPoint("epoch/accuracy", 0, 0.5)])
    ids = [*range(job_id + 1, job_id + MANY), job_id]

    with statements_run(engine) as seen:
        finals = final_metrics(engine, ids)
    assert finals[job_id] == {"accuracy": 0.5}
    assert len(finals) == MANY and finals[job_id + 1] == {}
    for _sql, params in seen:
        assert len(params or ()) <= 4, "a parameter per job"


# --- a refused statement is not an outage ---------------------------------------------------


def refused_statement(engine: Engine) -> Any:
    """A statement the database refuses, though it is up: on Postgres more than 65,535 bound
    parameters (what `final_metrics` of 70,000 jobs used to send); the SQLite of this machine
    allows 250,000, and an unknown function is an OperationalError of its own."""
    if is_sqlite(engine):
        return select(func.no_such_function(1))
    return select(literal(1)).where(literal(1).in_(list(range(MANY))))


@pytest.mark.slow  # on Postgres: building and sending 70,000 parameters takes seconds
def test_a_statement_the_database_refuses_is_not_called_unavailable(engine, capsys, monkeypatch):
    with pytest.raises(Exception) as refused, engine.connect() as connection:
        connection.execute(refused_statement(engine))
    assert not is_unavailable(refused.value)
    assert database_problem(refused.value).startswith("database error: ")

    def refusing(engine, *args, **kwargs):
        with engine.connect() as connection:
            connection.execute(refused_statement(engine))
        yield {}

    monkeypatch.setattr("traindeck.cli.iter_jobs", refusing)
    assert main(["jobs"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: database error: ") and "unavailable" not in err


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        (
            "sending query and params failed: number of parameters must be between 0 and 65535",
            "database error: ",
        ),
        ("no such function: no_such_function", "database error: "),
        ("database is locked", "database unavailable: "),
        ("connection to server at 127.0.0.1 failed: Connection refused", "database unavailable: "),
        ("FATAL: the database system is starting up", "database unavailable: "),
    ],
)
def test_only_an_outage_is_called_unavailable(message, problem):
    error = OperationalError("SELECT 1", {}, Exception(message))
    assert database_problem(error) == problem + message


# --- 70,000 jobs ----------------------------------------------------------------------------


def lines_of(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.strip()]


def ids_in_table(out: str) -> list[int]:
    return [int(line.split()[0]) for line in lines_of(out)[1:] if line.split()[0].isdigit()]


@pytest.mark.slow
def test_the_cli_pages_through_70k_jobs(engine, capsys):
    first, last = insert_jobs(engine, MANY, statuses=STATUSES, priorities=4)
    analyze(engine)

    assert main(["jobs"]) == 0
    out = capsys.readouterr().out
    assert ids_in_table(out) == list(range(last, last - 50, -1))
    hint = lines_of(out)[-1]
    assert hint.startswith("more jobs: traindeck jobs --before") and "--all" in hint
    command = shlex.split(hint.removeprefix("more jobs: ").split(" (or")[0])
    assert main(command[1:]) == 0  # the next page, as the hint says
    assert ids_in_table(capsys.readouterr().out) == list(range(last - 50, last - 100, -1))

    assert main(["jobs", "--order", "oldest", "--limit", "2", "--json"]) == 0
    captured = capsys.readouterr()
    assert [job["id"] for job in json.loads(captured.out)] == [first, first + 1]
    assert f"--order oldest --limit 2 --after {first + 1} --json" in captured.err

    expected = queue_order(engine)
    assert main(["jobs", "--order", "next", "--limit", "5", "--json"]) == 0
    assert [job["id"] for job in json.loads(capsys.readouterr().out)] == expected[:5]
    assert main(["jobs", "--order", "next", "--after", str(expected[4]), "--limit", "3"]) == 0
    assert ids_in_table(capsys.readouterr().out) == expected[5:8]

    assert main(["jobs", "--status", "failed", "--before", str(first + 10), "--json"]) == 0
    failed = [job["id"] for job in json.loads(capsys.readouterr().out)]
    assert failed == [i for i in range(first + 9, first - 1, -1) if status_of(i, first) == "failed"]

    assert main(["jobs", "--all", "--json"]) == 0
    captured = capsys.readouterr()
    listed = json.loads(captured.out)
    assert len(listed) == MANY and captured.err == ""
    assert listed[0]["id"] == last and listed[-1]["id"] == first  # the oldest, reached


@pytest.mark.slow
def test_keyset_pages_reach_every_job_in_each_order(engine):
    first, last = insert_jobs(engine, MANY, statuses=STATUSES, priorities=4)

    page = job_page(engine, to_end=True, limit=50)
    assert page.rows[-1].id == first and page.earlier and not page.later
    back = job_page(engine, before=page.first, limit=50)
    assert [row.id for row in back.rows] == list(range(first + 99, first + 49, -1))

    expected = queue_order(engine)
    walked, after = [], None
    while True:  # the whole queue, 500 at a time, in the order workers take it
        rows = job_page(engine, JobFilter(), "next", after=after, limit=500).rows
        if not rows:
            break
        walked += [row.id for row in rows]
        after = Cursor(rows[-1].id, rows[-1].priority)
    assert walked == expected

    streamed = [job["id"] for job in iter_jobs(engine, JobFilter(("queued", "failed")))]
    assert streamed == sorted(
        (i for i in range(first, last + 1) if status_of(i, first) in ("queued", "failed")),
        reverse=True,
    )


def test_a_search_finds_a_job_older_than_any_list_showed(engine):
    first, _ = insert_jobs(engine, 400, name="bulk")
    queue.submit(engine, {"name": "Needle in 100% haystack"})
    assert find_jobs(engine, f"#{first}")[0].id == first
    assert [row.name for row in find_jobs(engine, "needle IN 100%")] == ["Needle in 100% haystack"]
    assert find_jobs(engine, "100_") == []  # LIKE's wildcards are plain characters here
    assert len(find_jobs(engine, "bulk", limit=20)) == 20

"""Every job can be reached from the dashboard however many there are: the Jobs page pages
through 70,000 jobs by keyset with its filters in SQL (the queue in the order it runs), and
the job picker and Compare search in SQL instead of listing the newest few hundred."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from streamlit.testing.v1 import AppTest

from db import queue
from db.engine import dispose_engines
from tests.support.bulk import analyze, insert_jobs
from tests.support.markdown import shown

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
MANY = 70_000
STATUSES = ("succeeded", "queued", "failed", "cancelled", "queued", "running", "queued")


@pytest.fixture(autouse=True)
def _fresh_engine_cache():
    dispose_engines()
    yield
    dispose_engines()


def run(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_page(page: str, **query: object) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    if page != "pages/jobs.py":
        at.switch_page(page)
    for key, value in query.items():
        at.query_params[key] = str(value)
    return run(at)


def shown_ids(at: AppTest) -> list[int]:
    return [int(link.split("=")[1]) for link in at.dataframe[0].value["job"]]


def pager(at: AppTest, label: str):
    return at.button(key=f"jobs.pager.{label}")


def click(at: AppTest, label: str) -> AppTest:
    pager(at, label).click()
    return run(at)


def queue_order(engine) -> list[int]:
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT id, priority FROM jobs WHERE status = 'queued'"))
        return [job_id for job_id, _ in sorted(rows, key=lambda row: (-row[1], row[0]))]


@pytest.mark.slow
def test_the_jobs_page_pages_through_70k_jobs(engine):
    first, last = insert_jobs(engine, MANY, statuses=STATUSES, priorities=4)
    analyze(engine)

    at = open_page("pages/jobs.py")
    assert shown_ids(at) == list(range(last, last - 50, -1))
    assert pager(at, "Previous").disabled and not pager(at, "Next").disabled
    assert any(f"{MANY:,} jobs" in caption.value for caption in at.caption)

    click(at, "Next")
    assert shown_ids(at) == list(range(last - 50, last - 100, -1))
    click(at, "Last page")
    assert shown_ids(at) == list(range(first + 49, first - 1, -1))  # the oldest, reached
    assert pager(at, "Next").disabled and not pager(at, "Previous").disabled
    click(at, "Previous")
    assert shown_ids(at) == list(range(first + 99, first + 49, -1))
    run(at)  # a refresh keeps the page where it stands
    assert shown_ids(at) == list(range(first + 99, first + 49, -1))

    at.selectbox(key="jobs.order").set_value("next")
    run(at)
    expected = queue_order(engine)
    assert shown_ids(at) == expected[:50]  # the queue, in the order workers take it
    click(at, "Next")
    assert shown_ids(at) == expected[50:100]
    click(at, "Last page")
    assert shown_ids(at) == expected[-50:]
    assert at.dataframe[0].value["status"].unique().tolist() == ["queued"]

    at.selectbox(key="jobs.order").set_value("newest")
    at.multiselect(key="jobs.statuses").set_value(["failed"])
    run(at)
    click(at, "Last page")
    failed = [job_id for job_id in range(first, first + 400) if (job_id - first + 1) % 7 == 2]
    assert shown_ids(at) == failed[:50][::-1]

    at.multiselect(key="jobs.statuses").set_value([])
    at.text_input(key="jobs.search").input(f"#{first}")
    run(at)
    assert shown_ids(at) == [first]  # by its number
    at.text_input(key="jobs.search").input("ULK 1234")
    run(at)
    named = [1234, *range(12340, 12350)]  # "bulk 1234", "bulk 12340" … in any case
    assert shown_ids(at) == [first + i - 1 for i in reversed(named)]


def test_the_job_picker_finds_a_job_older_than_it_lists(engine):
    first, _ = insert_jobs(engine, 400, name="bulk")
    queue.submit(engine, {"name": "the newest"})

    at = open_page("pages/job.py")
    assert at.selectbox[0].options[0].startswith(f"#{first + 400} · the newest")
    assert len(at.selectbox[0].options) == 50
    at.text_input(key="job.find").input(str(first))
    run(at)
    assert at.selectbox[0].options[0] == f"#{first + 400} · the newest · queued"  # the one shown
    assert at.selectbox[0].options[1] == f"#{first} · bulk 1 · succeeded"  # by its number
    at.selectbox[0].set_value(first)
    run(at)
    assert shown(at.title[0].value) == f"#{first} · bulk 1"
    assert at.query_params["job"] == str(first)
    at.text_input(key="job.find").input("BULK 399")
    run(at)
    assert at.selectbox[0].options == [f"#{first} · bulk 1 · succeeded",
                                       f"#{first + 398} · bulk 399 · succeeded"]  # fmt: skip

    at.text_input(key="job.find").input("no such job")
    run(at)
    assert at.selectbox[0].options == [f"#{first} · bulk 1 · succeeded"]  # still shown
    assert any("No other job matches." in caption.value for caption in at.caption)


def test_compare_finds_and_keeps_jobs_older_than_it_lists(engine):
    first, last = insert_jobs(engine, 400, name="bulk")

    at = open_page("pages/compare.py", jobs=f"{first},{last}")
    assert at.multiselect(key="compare.jobs").value == [first, last]
    assert at.dataframe[0].value["job"].tolist() == [f"#{first} bulk 1", f"#{last} bulk 400"]

    at.text_input(key="compare.find").input("BULK 39")
    run(at)
    offered = at.multiselect(key="compare.jobs").options
    assert len(offered) == 2 + 11  # the chosen ones stay on offer, with bulk 39 and 390-399
    assert f"#{first + 38} · bulk 39 · succeeded" in offered
    at.text_input(key="compare.find").input(f"#{first + 1}")
    run(at)
    offered = at.multiselect(key="compare.jobs").options
    assert offered[2] == f"#{first + 1} · bulk 2 · succeeded"  # found in SQL, however old
    at.multiselect(key="compare.jobs").select(first + 1)
    run(at)
    assert at.multiselect(key="compare.jobs").value == [first, last, first + 1]
    assert at.query_params["jobs"] == f"{first},{last},{first + 1}"

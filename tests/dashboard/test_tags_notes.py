"""Tags and notes on the dashboard (issue 18): set on the New job form, edited on the job page,
shown as plain text, and the Jobs and Compare pages filtered by them from the address."""

from __future__ import annotations

from db import queue
from db.jobview import describe_job
from db.labels import job_labels
from tests.dashboard.test_job_lists import _fresh_engine_cache, open_page, run, shown_ids
from tests.support.markdown import links_and_images, shown

__all__ = ["_fresh_engine_cache"]  # the autouse fixture, shared


def button(at, label: str):
    return next(b for b in at.button if b.label == label)


def test_the_form_queues_a_job_with_its_tags_and_note(sqlite_engine):
    at = open_page("pages/new_job.py")
    at.text_input(key="spec.tags").input("baseline, small ,baseline")
    at.text_area(key="spec.note").input("Why: *compare* with [x](https://example.com)")
    button(at, "Queue job").click()
    run(at)
    job = describe_job(sqlite_engine, queue.list_jobs(sqlite_engine)[0].id)
    assert job["tags"] == ["baseline", "small"]
    assert job["note"] == "Why: *compare* with [x](https://example.com)"

    at.text_input(key="spec.tags").input("ok, " + "x" * 51)
    button(at, "Queue job").click()
    run(at)
    assert len(queue.list_jobs(sqlite_engine)) == 1
    assert any(shown(e.value).startswith("a tag must be at most 50") for e in at.error)


def test_the_job_page_shows_the_note_as_text_and_edits_tags_and_note(sqlite_engine):
    note = "**bold** <b>html</b> ![img](https://example.com/x.png) [link](javascript:alert(1))"
    job_id = queue.submit(sqlite_engine, {"tags": ["a"], "note": note})
    at = open_page("pages/job.py", job=str(job_id))
    sources = [m.value for m in at.markdown]
    assert note in [shown(source) for source in sources]  # exactly the text typed
    assert not [found for source in sources for found in links_and_images(source)]
    assert any(shown(c.value) == "Tags: a" for c in at.caption)

    at.text_input(key=f"job.tags.{job_id}").input("a, b")
    at.text_area(key=f"job.note.{job_id}").input("second")
    button(at, "Save tags and note").click()
    run(at)
    assert job_labels(sqlite_engine, job_id).model_dump() == {"tags": ("a", "b"), "note": "second"}
    assert "Saved the tags and the note." in [shown(s.value) for s in at.success]

    at.text_area(key=f"job.note.{job_id}").input("bad\x00")
    button(at, "Save tags and note").click()
    run(at)
    assert job_labels(sqlite_engine, job_id).note == "second"
    assert any(shown(e.value).startswith("must not contain control") for e in at.error)


def test_a_filter_in_the_address_reproduces_the_list_and_the_widgets_write_it(engine):
    kept = queue.submit(engine, {"name": "kept", "tags": ["x", "y"], "arch": "resnet34"})
    queue.submit(engine, {"name": "other arch", "tags": ["x", "y"]})
    queue.submit(engine, {"name": "one tag", "tags": ["x"], "arch": "resnet34"})
    noted = queue.submit(engine, {"name": "n", "tags": ["x"], "note": "needle here"})
    queue.cancel(engine, noted)

    at = open_page("pages/jobs.py", tag="x,y", arch="resnet34", dataset="digits")
    assert shown_ids(at) == [kept]
    assert at.multiselect(key="jobs.tags").value == ["x", "y"]

    at = open_page("pages/jobs.py", q="NEEDLE", status="cancelled,unknown")
    assert shown_ids(at) == [noted]
    at.multiselect(key="jobs.statuses").set_value([])
    at.text_input(key="jobs.search").input("")
    at.multiselect(key="jobs.tags").set_value(["y"])
    at.selectbox(key="jobs.arch").set_value("resnet34")
    run(at)
    assert shown_ids(at) == [kept]
    assert dict(at.query_params) == {"tag": "y", "arch": "resnet34"}
    assert shown_ids(open_page("pages/jobs.py", tag="y", arch="resnet34")) == [kept]


def test_compare_offers_the_jobs_the_filters_in_the_address_admit(engine):
    tagged = [queue.submit(engine, {"name": f"t{i}", "tags": ["sweep"]}) for i in range(2)]
    untagged = queue.submit(engine, {"name": "plain"})
    at = open_page("pages/compare.py", tag="sweep", jobs=str(tagged[0]))
    assert at.multiselect(key="compare.jobs").value == [tagged[0]]
    offered = at.multiselect(key="compare.jobs").options
    assert {f"#{job_id}" for job_id in tagged} <= {o.split(" ")[0] for o in offered}
    assert f"#{untagged}" not in {o.split(" ")[0] for o in offered}
    assert at.query_params["tag"] == "sweep"

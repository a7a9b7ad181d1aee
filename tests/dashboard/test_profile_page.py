"""The job page's profile capture: the action on a running job, the captures, the trace's link
and how to open it."""

from __future__ import annotations

from db import queue
from db.profiles import captures, finish_capture, request_profile, take_request
from tests.dashboard.test_pages import (  # noqa: F401
    _fresh_engine_cache,
    button,
    open_page,
    show_tab,
    texts,
)
from tests.support import seed
from tests.support.artifacts import record_local_file
from tests.support.markdown import shown


def test_a_running_job_can_be_asked_for_a_profile(sqlite_engine):
    live = seed.running_job(sqlite_engine)
    at = show_tab(open_page("pages/job.py", job=live.id), "Diagnostics")
    at.number_input(key=f"job.profile_steps.{live.id}").set_value(5).run()
    ask = button(at, "Capture a profile of the next 5 steps")
    assert not ask.disabled
    ask.click().run()
    [capture] = captures(sqlite_engine, live.id)
    assert (capture.steps, capture.status) == (5, "requested")
    assert any(f"Capture #{capture.id} asked for" in shown(i.value) for i in at.info)
    assert f"#{capture.id} · 5 steps · requested" in [shown(c.value) for c in at.caption]

    button(at, "Capture a profile of the next 5 steps").click().run()  # one open at a time
    assert any("already has a capture of 5 steps" in shown(e.value) for e in at.error)
    assert len(captures(sqlite_engine, live.id)) == 1


def test_a_stored_profile_is_offered_with_how_to_open_it(sqlite_engine, tmp_path):
    live = seed.running_job(sqlite_engine)
    trace = tmp_path / "job1-profile-1.zip"
    trace.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip
    from traindeck.cli import main

    assert main(["profile", str(live.id), "--steps", "3"]) == 0
    taken = take_request(sqlite_engine, live.id)
    record_local_file(sqlite_engine, live.id, "profile", trace)
    finish_capture(sqlite_engine, taken.id, "stored", "steps 31–33 recorded with torch.profiler",
                   first_step=30, last_step=32, tool="torch.profiler")  # fmt: skip

    at = show_tab(open_page("pages/job.py", job=live.id), "Diagnostics")
    links = {shown(b.proto.label): b.proto.url for b in at.get("link_button")}
    assert links["Download the latest profile (job1-profile-1.zip)"].startswith("/downloads/")
    page = texts(at)
    assert "tensorboard-plugin-profile" in page and "Perfetto" in page
    assert f"#{taken.id} · 3 steps · stored · steps 31–33 recorded with torch.profiler" in page


def test_a_finished_job_cannot_be_profiled(sqlite_engine):
    done_id, _ = seed.finished_job(sqlite_engine)
    at = show_tab(open_page("pages/job.py", job=done_id), "Diagnostics")
    assert button(at, "Capture a profile of the next 10 steps").disabled


def test_a_request_the_job_never_took_says_so_once_the_job_is_over(sqlite_engine):
    live = seed.running_job(sqlite_engine)
    capture = request_profile(sqlite_engine, live.id, 7)
    queue.cancel(sqlite_engine, live.id)
    assert queue.finish(sqlite_engine, live.lease, "cancelled")  # its process was killed
    at = show_tab(open_page("pages/job.py", job=live.id), "Diagnostics")
    captions = [shown(c.value) for c in at.caption]
    assert f"#{capture} · 7 steps · requested · not recorded: the job is cancelled" in captions

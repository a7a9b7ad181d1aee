"""`traindeck profile JOB --steps N`: a request only a running job can take, one at a time,
and mistakes in one line."""

from __future__ import annotations

import json

import pytest

from db import queue
from db.profiles import captures, fail_open_captures, fail_orphaned_recordings, take_request
from traindeck.cli import main


def test_a_capture_is_refused_in_one_line_when_it_cannot_be_taken(engine, capsys):
    queued = queue.submit(engine, {"name": "waiting"})
    assert main(["profile", str(queued), "--steps", "5"]) == 2
    assert capsys.readouterr().err == (
        f"error: job {queued} is queued: a profile records the steps of a running job\n"
    )
    running = queue.submit(engine, {"name": "running"})
    queue.claim(engine, "w1")
    queue.claim(engine, "w2")
    assert main(["profile", str(running), "--steps", "5", "--json"]) == 0
    capture = json.loads(capsys.readouterr().out)["capture"]
    assert main(["profile", str(running)]) == 2
    assert capsys.readouterr().err == (
        f"error: job {running} already has a capture of 5 steps requested (#{capture}); "
        "ask again when it is done\n"
    )
    assert main(["profile", "999", "--steps", "5"]) == 2
    assert capsys.readouterr().err == "error: no job with id 999\n"
    with pytest.raises(SystemExit) as refused:
        main(["profile", str(running), "--steps", "0"])
    assert refused.value.code == 2
    assert capsys.readouterr().err.startswith("error: argument --steps: the value is at least 1")


def test_a_request_is_taken_once_and_closed_when_the_job_ends(engine):
    queue.submit(engine, {"name": "running"})
    job_id = queue.claim(engine, "w1").id
    assert main(["profile", str(job_id), "--steps", "3"]) == 0
    taken = take_request(engine, job_id)
    assert taken is not None and (taken.steps, taken.status) == (3, "recording")
    assert take_request(engine, job_id) is None
    assert fail_open_captures(engine, job_id, "not recorded: the job ended first") == 1
    [capture] = captures(engine, job_id)
    assert (capture.status, capture.message) == ("failed", "not recorded: the job ended first")


def test_a_recording_left_by_a_gone_process_is_closed_and_a_new_request_accepted(engine):
    queue.submit(engine, {"name": "preempted"})
    job_id = queue.claim(engine, "w1").id
    assert main(["profile", str(job_id), "--steps", "3"]) == 0
    assert take_request(engine, job_id) is not None  # the process then died while recording
    assert main(["profile", str(job_id), "--steps", "3"]) == 2  # still open: refused
    assert fail_orphaned_recordings(engine, job_id) == 1  # the next attempt's process
    assert captures(engine, job_id)[0].message == (
        "not stored: the job's process that was recording it ended"
    )
    assert main(["profile", str(job_id), "--steps", "3"]) == 0

"""worker.failpoints: where fault tests stop the job process. Fast: no training, no database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.support.workers import REPO, wait_until_stopped_at
from worker import failpoints

STOPS_TWICE = """
from worker.failpoints import EXPORT_TMP_WRITTEN, failpoint
print("before", flush=True)
failpoint(EXPORT_TMP_WRITTEN)
print("after", flush=True)
failpoint(EXPORT_TMP_WRITTEN)
print("again", flush=True)
"""


def test_an_unarmed_failpoint_does_nothing(monkeypatch):
    monkeypatch.setattr(failpoints, "_armed", {})
    monkeypatch.setattr(os, "kill", lambda *_: pytest.fail("an unarmed failpoint sent a signal"))
    failpoints.failpoint(failpoints.EXPORT_TMP_WRITTEN)
    assert not failpoints.any_armed()


def test_the_environment_arms_known_failpoints_and_refuses_unknown_ones():
    env = {failpoints.ENV_VAR: f" {failpoints.EXPORT_TMP_WRITTEN},{failpoints.LR_FIND_TMP_SAVED},"}
    armed = failpoints.armed_from(env)
    assert armed == {failpoints.EXPORT_TMP_WRITTEN: 1, failpoints.LR_FIND_TMP_SAVED: 1}
    assert failpoints.armed_from({}) == {}
    with pytest.raises(ValueError, match=r"unknown failpoint.*export\.tmp_writen"):
        failpoints.armed_from({failpoints.ENV_VAR: "export.tmp_writen"})
    nth = failpoints.armed_from({failpoints.ENV_VAR: "checkpoint.uploaded@2"})
    assert nth == {failpoints.CHECKPOINT_UPLOADED: 2}
    with pytest.raises(ValueError, match="NAME@N"):
        failpoints.armed_from({failpoints.ENV_VAR: "checkpoint.uploaded@0"})


def test_a_failpoint_armed_for_its_second_passage_lets_the_first_pass(monkeypatch):
    stops = []
    monkeypatch.setattr(failpoints, "_armed", {failpoints.CHECKPOINT_UPLOADED: 2})
    monkeypatch.setattr(os, "kill", lambda *args: stops.append(args))
    failpoints.failpoint(failpoints.CHECKPOINT_UPLOADED)
    assert stops == []
    failpoints.failpoint(failpoints.CHECKPOINT_UPLOADED)
    failpoints.failpoint(failpoints.CHECKPOINT_UPLOADED)
    assert len(stops) == 1, "once only"


def test_what_the_job_reported_is_flushed_before_the_process_stops(monkeypatch):
    """A test reads the job's log in the database while the process is stopped."""
    happened = []
    monkeypatch.setattr(failpoints, "_armed", {failpoints.CHECKPOINT_UPLOAD_RETRYING: 1})
    monkeypatch.setattr(failpoints, "_flush_first", [])
    monkeypatch.setattr(failpoints, "_quiet_first", [])
    monkeypatch.setattr(os, "kill", lambda *args: happened.append("stopped"))
    failpoints.flush_before_stopping(lambda: happened.append("flushed"))
    failpoints.failpoint(failpoints.CHECKPOINT_UPLOAD_RETRYING)
    assert happened == ["flushed", "stopped"]


def test_an_armed_failpoint_stops_the_process_there_the_first_time_only():
    process = subprocess.Popen(
        [sys.executable, "-c", STOPS_TWICE],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), failpoints.ENV_VAR: "export.tmp_written"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout.readline() == "before\n"
        wait_until_stopped_at(
            process.pid, failpoints.EXPORT_TMP_WRITTEN, lambda: process.communicate()[0], 60
        )
        os.kill(process.pid, signal.SIGCONT)
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, output
    assert output == "after\nagain\n"


def test_a_process_that_ends_before_its_failpoint_fails_the_wait_with_its_output():
    process = subprocess.Popen(
        [sys.executable, "-c", "print('finished without stopping')"],
        stdout=subprocess.PIPE,
        text=True,
    )
    output = process.communicate(timeout=60)[0]
    with pytest.raises(AssertionError, match=r"(?s)exited before reaching failpoint x:.*finished"):
        wait_until_stopped_at(process.pid, "x", lambda: output, 60)

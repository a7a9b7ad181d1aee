"""What the supervisor and a kept job process say to each other, and which jobs share graphs."""

from __future__ import annotations

import io
import os

import pytest

from db.spec import JobSpec
from worker.job_channel import GRAPH_FIELDS, Assignment, graph_key, next_assignment, read_done


def _spec(**fields) -> dict:
    return JobSpec.model_validate({"device": "xla", **fields}).model_dump(mode="json")


def test_jobs_that_differ_only_in_numbers_share_their_graphs_and_others_do_not():
    base = graph_key(_spec(), "xla")
    assert base is not None
    assert graph_key(_spec(epochs=7, lr=0.05, seed=3, name="other", dataset="x"), "xla") == base
    changed = {"cores": 2, "arch": "resnet34", "img_size": 32, "bs": 16,
               "mixed_precision": "bf16", "augment": True, "schedule": "fine_tune"}  # fmt: skip
    assert set(changed) == set(GRAPH_FIELDS)
    for field, value in changed.items():
        assert graph_key(_spec(**{field: value}), "xla") != base, field


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_only_xla_job_processes_are_kept(device):
    assert graph_key(_spec(), device) is None


def test_an_assignment_and_a_done_line_survive_the_trip():
    assignment = Assignment(12, 3, "/data/jobs/12/.error-3.txt")
    assert Assignment.from_line(assignment.to_line()) == assignment
    read, write = os.pipe()
    try:
        following = next_assignment(write, 11, io.StringIO(assignment.to_line()))
        assert following == assignment
        assert read_done(os.read(read, 100).decode()) == 11
        assert next_assignment(write, 12, io.StringIO("")) is None  # input closed: exit
    finally:
        os.close(read)
        os.close(write)


def test_lines_that_are_not_a_done_report_are_ignored():
    for line in ("", "not json", "[1]", '{"done": "3"}', '{"other": 3}'):
        assert read_done(line) is None

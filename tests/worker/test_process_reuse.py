"""A worker keeps a job process whose XLA job succeeded for the next job with the same graphs,
so XLA's in-memory cache spares that job its compiles; a failed job's process is never kept
(the real supervisor and job processes, XLA on the CPU)."""

from __future__ import annotations

import re
import shutil

import pytest

from db import queue, telemetry
from db.datasets import get_dataset
from tests.support.workers import run_worker

pytestmark = [pytest.mark.slow, pytest.mark.xla]

PROCESS_LINE = re.compile(r"job process (\d+)(?:, which trained job (\d+) before)?")
JOB = {"epochs": 1, "img_size": 16, "bs": 16, "device": "xla", "cores": 1, "lr": 1e-3}


def _process(engine, job_id: int) -> tuple[int, int | None]:
    """The pid of the process that trained the job, and the job it trained before (if any)."""
    for event in telemetry.events_since(engine, job_id):
        found = PROCESS_LINE.fullmatch(event.message)
        if found:
            return int(found[1]), int(found[2]) if found[2] else None
    raise AssertionError(f"job {job_id} logged no job process line")


def test_the_next_identical_job_reuses_the_graphs_and_a_failed_jobs_process_is_not_kept(
    sqlite_engine, small_digits
):
    dataset = small_digits(per_class=12)
    vanished = small_digits(per_class=13, name="vanished")  # a folder of its own
    first = queue.submit(sqlite_engine, {**JOB, "dataset": dataset, "name": "first"})
    second = queue.submit(sqlite_engine, {**JOB, "dataset": dataset, "name": "second"})
    failing = queue.submit(sqlite_engine, {**JOB, "dataset": vanished, "name": "failing"})
    after = queue.submit(sqlite_engine, {**JOB, "dataset": dataset, "name": "after"})
    shutil.rmtree(get_dataset(sqlite_engine, vanished).location)  # the failing job's images

    result = run_worker("--max-jobs", "4", PJRT_DEVICE="CPU", timeout=1500)

    assert result.returncode == 0, result.stderr[-3000:]
    statuses = [queue.get_job(sqlite_engine, job).status for job in (first, second, failing, after)]
    assert statuses == ["succeeded", "succeeded", "failed", "succeeded"]
    first_pid, before_first = _process(sqlite_engine, first)
    assert before_first is None
    assert _process(sqlite_engine, second) == (first_pid, first)
    failing_pid, _ = _process(sqlite_engine, failing)
    assert failing_pid == first_pid  # same graphs: handed to the kept process, and it failed
    after_pid, before_after = _process(sqlite_engine, after)
    assert after_pid != failing_pid and before_after is None, "a failed job's process was kept"

    first_report = telemetry.xla_reports(sqlite_engine, first)[-1].summary
    second_report = telemetry.xla_reports(sqlite_engine, second)[-1].summary
    after_report = telemetry.xla_reports(sqlite_engine, after)[-1].summary
    assert first_report["compile_time_s"] > 0
    assert second_report["compile_time_s"] < 0.1 * first_report["compile_time_s"], (
        second_report["compile_time_s"],
        first_report["compile_time_s"],
    )
    assert second_report["graphs_kept_from_job"] == first
    assert second_report["graphs_kept"] >= first_report["compile_count"]
    assert "graphs_kept" not in first_report and "graphs_kept" not in after_report
    metrics = telemetry.final_metrics(sqlite_engine, [first, second, after])
    numbers = {job: {k: v for k, v in metrics[job].items() if "loss" in k or "acc" in k}
               for job in (first, second, after)}  # fmt: skip
    assert numbers[second] == numbers[first] == numbers[after], "the process changed nothing"

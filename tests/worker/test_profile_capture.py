"""A profile capture asked for while a job runs: the job records exactly the steps asked,
stores a non-empty trace as its `profile` artifact, and its curves go on with no gap or
duplicate. The moment is reached with a failpoint: the job stops at its first validation
batch, the request is made, the job goes on and takes it at the next epoch's start."""

from __future__ import annotations

import gzip
import io
import json
import os
import signal
import zipfile

import pytest

from db import queue
from db.artifacts import get_artifact
from db.exports import read_verified
from db.profiles import captures
from db.telemetry import count_metric_duplicates, metric_series
from tests.support.workers import (
    child_pids,
    output_tail,
    start_worker,
    wait_for,
    wait_until_stopped_at,
)
from traindeck.cli import main
from worker.failpoints import VALIDATION_STARTED

pytestmark = pytest.mark.slow

STEPS_PER_EPOCH = 10  # 20 images × 10 classes, 80% for training, batches of 16
ASKED = 4


def _trace_events(names: list[str], archive: zipfile.ZipFile) -> int:
    events = 0
    for name in names:
        data = archive.read(name)
        if name.endswith(".gz"):
            data = gzip.decompress(data)
        events += len(json.loads(data)["traceEvents"])
    return events


@pytest.mark.parametrize(
    "device", [pytest.param("xla", marks=pytest.mark.xla), pytest.param("cpu")]
)
def test_a_capture_records_the_steps_asked_and_the_curves_go_on(
    sqlite_engine, small_digits, capsys, device
):
    dataset = small_digits(per_class=20)
    job_id = queue.submit(
        sqlite_engine,
        {"dataset": dataset, "arch": "resnet18", "pretrained": False, "epochs": 2,
         "lr": 1e-2, "img_size": 16, "bs": 16, "device": device},
    )  # fmt: skip
    flags = ("--device", "cpu") if device == "cpu" else ()
    worker = start_worker(
        "--once", *flags, TRAINDECK_FAILPOINTS=VALIDATION_STARTED, PJRT_DEVICE="CPU"
    )
    try:
        child = wait_for(lambda: child_pids(worker.pid), 180, "the job's process")[0]
        wait_until_stopped_at(child, VALIDATION_STARTED, lambda: output_tail(worker))
        assert main(["profile", str(job_id), "--steps", str(ASKED)]) == 0
        assert "capture #" in capsys.readouterr().out
        os.kill(child, signal.SIGCONT)
        output, _ = worker.communicate(timeout=600)
    finally:
        worker.kill()
    job = queue.get_job(sqlite_engine, job_id)
    assert job.status == "succeeded", (job.error, output[-3000:])

    [capture] = captures(sqlite_engine, job_id)
    assert capture.status == "stored", capture.message
    # Taken at epoch 2's start: its first ASKED steps, counted from 0 as the curves count.
    assert (capture.first_step, capture.last_step) == (STEPS_PER_EPOCH, STEPS_PER_EPOCH + 3)
    tool = "torch_xla.debug.profiler" if device == "xla" else "torch.profiler"
    assert capture.tool == tool
    assert capture.message == f"steps 11–14 recorded with {tool}"

    artifact = get_artifact(sqlite_engine, job_id, "profile")
    assert artifact is not None and artifact.bytes > 0
    with zipfile.ZipFile(io.BytesIO(read_verified(artifact))) as archive:
        names = archive.namelist()
        if device == "xla":
            assert any(n.startswith("plugins/profile/") and n.endswith(".xplane.pb") for n in names)
            traces = [n for n in names if n.endswith(".trace.json.gz")]
            assert all(archive.getinfo(n).file_size > 0 for n in names), names
        else:
            traces = [n for n in names if n.endswith(".pt.trace.json")]
        assert traces, names
        assert _trace_events(traces, archive) > 0

    steps = [step for step, _ in metric_series(sqlite_engine, job_id, "batch/train_loss")]
    assert steps == list(range(2 * STEPS_PER_EPOCH)), "a point around the capture was lost"
    assert count_metric_duplicates(sqlite_engine, job_id) == 0

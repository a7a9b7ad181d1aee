"""The real PyTorch/XLA path, on the CPU (PJRT_DEVICE=CPU): no TPU needed to catch XLA bugs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from db import queue, telemetry
from db.artifacts import get_artifact
from tests.support.workers import REPO, run_worker, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.xla]


def test_xla_job_learns_reports_every_epoch_and_stops_compiling(sqlite_engine, small_digits):
    dataset = small_digits(per_class=60)
    job_id = queue.submit(
        sqlite_engine,
        {"dataset": dataset, "arch": "resnet18", "epochs": 3, "lr": 1e-2, "img_size": 16,
         "bs": 16, "device": "xla"},
    )  # fmt: skip
    result = run_worker("--once", PJRT_DEVICE="CPU")
    assert result.returncode == 0, result.stderr[-3000:]
    job = queue.get_job(sqlite_engine, job_id)
    assert job.status == "succeeded", job.error
    assert job.device.startswith("xla:CPU")

    # The model was on the device before the optimizer existed: it learns. (Built the other
    # way round, the optimizer updates stale CPU copies and accuracy stays at chance, 10%.)
    accuracy = telemetry.final_metrics(sqlite_engine, [job_id])[job_id]["accuracy"]
    assert accuracy >= 0.5, accuracy

    reports = telemetry.xla_reports(sqlite_engine, job_id)
    assert [report.epoch for report in reports] == [0, 1, 2]
    compiles = [report.summary["compile_count"] for report in reports]
    assert compiles[0] > 0
    assert compiles[-1] == compiles[1], f"compile count grew after the second epoch: {compiles}"
    for report in reports:
        assert report.summary["aten_fallbacks"] == {}, "an op fell back to the CPU"
        assert report.summary["execute_count"] > 0 and report.summary["compile_time_s"] > 0
        assert "CompileTime" in report.raw
    warnings = [
        event.message
        for event in telemetry.events_since(sqlite_engine, job_id)
        if event.level == "warning"
    ]
    assert not any("compiled" in message for message in warnings), warnings
    assert get_artifact(sqlite_engine, job_id, "export") is not None


STEP_AFTER_CYCLIC_GARBAGE = """
import gc
import torch, torch_xla
import torch_xla.debug.metrics as met
from worker.callbacks import XlaStepCallback

gc.disable()  # the cycle collector runs only where the callback runs it
step = torch.ones(4, device=torch_xla.device()) * 3
torch_xla.sync()
compiles = met.metric_data("CompileTime")[0]
# An intermediate with pending work, kept alive only by a reference cycle, as fastai's batch
# transforms leave the batch behind in the tracebacks of fasttransform's dispatch misses.
garbage = [step * 2]
garbage.append(garbage)
del garbage
XlaStepCallback().after_batch()
print(met.metric_data("CompileTime")[0] - compiles)
"""


def test_the_step_sync_leaves_cyclic_garbage_out_of_the_graph():
    """Garbage not yet collected would be an extra output of the step's graph: a different
    graph, compiled again, whenever the collector happened not to run before the sync."""
    result = subprocess.run(
        [sys.executable, "-c", STEP_AFTER_CYCLIC_GARBAGE],
        cwd=REPO,
        env=worker_env(PJRT_DEVICE="CPU"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "0", "the sync compiled a graph for unreachable tensors"

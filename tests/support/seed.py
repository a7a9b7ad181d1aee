"""Jobs in every state, made through `db/` the way the worker makes them."""

from __future__ import annotations

import math
from pathlib import Path

from common.files import job_dir
from db import queue
from db.queue import ClaimedJob
from db.telemetry import MetricPoint, add_events, add_xla_report, write_metrics
from tests.support.artifacts import record_local_file

STEPS_PER_EPOCH = 20


def xla_summary(compiles: int, fallbacks: dict[str, int] | None = None) -> dict:
    return {
        "compile_count": compiles,
        "compile_time_s": 2.5 * compiles,
        "execute_count": 100 * compiles,
        "execute_time_s": 1.5 * compiles,
        "transfer_to_device_time_s": 0.2,
        "transfer_from_device_time_s": 0.1,
        "cached_compile": 0,
        "uncached_compile": compiles,
        "persistent_cache_hits": 0,
        "device_syncs": 40,
        "aten_fallbacks": fallbacks or {},
    }


def batch_points(first_step: int, count: int) -> list[MetricPoint]:
    points = []
    for step in range(first_step, first_step + count):
        epoch = step // STEPS_PER_EPOCH
        loss = 2.0 * math.exp(-step / 30) + 0.1
        points.append(MetricPoint("batch/train_loss", step, loss, epoch))
        points.append(MetricPoint("batch/lr", step, 1e-3 * (1 + step % 7) / 7, epoch))
    return points


def epoch_points(epoch: int) -> list[MetricPoint]:
    return [
        MetricPoint("epoch/train_loss", epoch, 1.0 / (epoch + 1), epoch),
        MetricPoint("epoch/valid_loss", epoch, 1.2 / (epoch + 1), epoch),
        MetricPoint("epoch/accuracy", epoch, 0.5 + 0.1 * epoch, epoch),
        MetricPoint("epoch/error_rate", epoch, 0.5 - 0.1 * epoch, epoch),
    ]


def running_job(engine, name: str = "live run", worker_id: str = "worker-a") -> ClaimedJob:
    """A job in its second epoch: 30 batches, one epoch's metrics, two XLA reports."""
    queue.submit(engine, {"name": name, "epochs": 3, "device": "xla"})
    claimed = queue.claim(engine, worker_id)
    assert claimed is not None
    queue.set_progress(
        engine,
        claimed.lease,
        epoch=1,
        step=30,
        total_epochs=3,
        total_steps=60,
        eta_seconds=95.0,
        device="xla:0 (TPU v4)",
    )
    write_metrics(engine, claimed.id, batch_points(0, 30) + epoch_points(0))
    add_xla_report(
        engine, claimed.id, 0, xla_summary(12), "Metric: CompileTime\n  TotalSamples: 12"
    )
    add_xla_report(
        engine,
        claimed.id,
        1,
        xla_summary(12, {"aten::_local_scalar_dense": 30, "aten::nonzero": 4}),
        "Metric: CompileTime\n  TotalSamples: 12",
    )
    add_events(engine, claimed.id, [("info", "epoch 0 done: valid_loss 1.2"), ("warning", "slow")])
    return claimed


def finished_job(engine, name: str = "done run", **spec) -> tuple[int, Path]:
    """A succeeded job with three epochs of metrics and an exported model on disk."""
    queue.submit(engine, {"name": name, "epochs": 3, **spec})
    claimed = queue.claim(engine, "worker-b")
    assert claimed is not None
    queue.set_progress(
        engine,
        claimed.lease,
        epoch=3,
        step=60,
        total_epochs=3,
        total_steps=60,
        eta_seconds=0.0,
        device="cpu",
    )
    points = batch_points(0, 60)
    for epoch in range(3):
        points += epoch_points(epoch)
    write_metrics(engine, claimed.id, points)
    export = job_dir(claimed.id) / "export.pkl"
    export.parent.mkdir(parents=True, exist_ok=True)
    export.write_bytes(b"a model " * 5000)
    record_local_file(engine, claimed.id, "export", export)
    assert queue.finish(engine, claimed.lease, "succeeded")
    return claimed.id, export


def failed_job(engine) -> int:
    queue.submit(engine, {"name": "broken run"})
    claimed = queue.claim(engine, "worker-c")
    assert claimed is not None
    error = (
        "Traceback (most recent call last):\n"
        '  File "worker/train.py", line 10, in fit\n'
        "RuntimeError: CUDA out of memory"
    )
    assert queue.finish(engine, claimed.lease, "failed", error)
    return claimed.id

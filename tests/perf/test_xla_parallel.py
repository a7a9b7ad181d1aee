"""SPMD data parallelism and the compilation cache on the real XLA path, on the CPU
(PJRT_DEVICE=CPU with CPU_NUM_DEVICES virtual devices)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from db import queue, telemetry
from db.telemetry import metric_series
from tests.support.workers import REPO, run_worker, worker_env
from tests.support.xla_compiles import assert_compiles_stop_after_the_first_epoch

# Each test starts a real XLA process (PJRT_DEVICE=CPU, several devices): seconds each.
pytestmark = [pytest.mark.xla, pytest.mark.slow]

TWO_CPU_DEVICES = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}


def _probe(name: str, **env: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "tests.perf.xla_probe", name],
        cwd=REPO,
        env=worker_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_batch_is_split_over_the_mesh_one_slice_per_device(data_dir):
    placed = _probe("place", **TWO_CPU_DEVICES)

    assert placed["label"] == "xla:CPU (2 devices, SPMD data parallel)"
    assert placed["devices"] == 2
    assert placed["device"] == "xla:0", "one virtual device for the whole mesh"
    assert placed["types"] == ["TensorImage", "TensorCategory"], "fastai's types are kept"
    assert placed["image_shards"] == [[16, 3, 8, 8], [16, 3, 8, 8]]
    assert placed["label_shards"] == [[16], [16]]
    assert placed["round_trip"]


def test_a_second_process_finds_every_graph_of_the_first_in_the_data_folders_cache(data_dir):
    first = _probe("compile", PJRT_DEVICE="CPU")
    second = _probe("compile", PJRT_DEVICE="CPU")

    cache = data_dir / "xla_cache"
    assert first["persistent_cache_misses"] == first["compile_count"] >= 1
    assert len(list(cache.iterdir())) == first["persistent_cache_misses"]
    assert second["persistent_cache_misses"] == 0
    # torch_xla 2.9 loads no cached executable back (on a TPU neither: pytorch/xla#9094). XLA's
    # CPU client answers UNIMPLEMENTED, so the lookup is counted as a load failure.
    found = second["persistent_cache_hits"] + second["persistent_cache_load_failures"]
    assert found == first["persistent_cache_misses"]
    assert second["loss"] == first["loss"]


def test_two_devices_train_like_one_to_the_same_accuracy(data_dir):
    """SPMD's partitioned step computes what one device computes (batch norm's statistics
    too, all-reduced over the whole batch), up to the order of floating-point sums."""
    one = _probe("train", PJRT_DEVICE="CPU", CPU_NUM_DEVICES="1")
    two = _probe("train", **TWO_CPU_DEVICES)

    assert one["label"] == "xla:CPU (1 device)"
    assert two["label"] == "xla:CPU (2 devices, SPMD data parallel)"
    assert len(one["losses"]) == len(two["losses"]) == 4 * 22
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-3)
    assert one["valid_images"] == 359
    assert one["accuracy"] >= 0.8, "it learns"
    assert abs(one["accuracy"] - two["accuracy"]) <= 0.01


def test_a_job_trains_over_every_device_with_the_batch_split(sqlite_engine, small_digits):
    dataset = small_digits(per_class=40)  # 320 training images: 10 batches of 32
    job_id = queue.submit(
        sqlite_engine,
        {"dataset": dataset, "arch": "resnet18", "epochs": 3, "lr": 3e-3, "img_size": 16,
         "bs": 32, "device": "xla"},
    )  # fmt: skip
    result = run_worker("--once", **TWO_CPU_DEVICES)
    assert result.returncode == 0, result.stderr[-3000:]

    job = queue.get_job(sqlite_engine, job_id)
    assert job.status == "succeeded", job.error
    assert job.device == "xla:CPU (2 devices, SPMD data parallel)"
    log = "\n".join(event.message for event in telemetry.events_since(sqlite_engine, job_id))
    assert "data parallel over 2 XLA devices (SPMD): each computes 16 of the 32 images" in log
    assert len(metric_series(sqlite_engine, job_id, "batch/train_loss")) == 3 * 10
    assert telemetry.final_metrics(sqlite_engine, [job_id])[job_id]["accuracy"] >= 0.5

    reports = telemetry.xla_reports(sqlite_engine, job_id)
    compiles = [report.summary["compile_count"] for report in reports]
    warnings = [event.message for event in telemetry.events_since(sqlite_engine, job_id)]
    assert_compiles_stop_after_the_first_epoch(compiles, warnings)
    for report in reports:
        assert report.summary["aten_fallbacks"] == {}, "an op fell back to the CPU"
        assert report.summary["execute_count"] > 0, "SPMD's replicated executions are counted"
        assert report.summary["device_syncs"] == report.summary["execute_count"]


def test_a_report_read_right_after_a_step_counts_every_sync_as_an_execution(data_dir):
    """A report counts an execution's dispatch and its completion at two moments; read between
    them it would show one sync more than executions. `read_summary` waits for the device."""
    probed = _probe("reports", **TWO_CPU_DEVICES)

    assert probed["label"] == "xla:CPU (2 devices, SPMD data parallel)"
    assert probed["reads"] == 1000
    assert probed["mismatched"] == []


def test_a_batch_that_does_not_split_evenly_fails_the_job_with_the_reason(
    sqlite_engine, small_digits
):
    dataset = small_digits(per_class=10)
    job_id = queue.submit(
        sqlite_engine, {"dataset": dataset, "bs": 15, "img_size": 8, "device": "xla"}
    )
    result = run_worker("--once", **TWO_CPU_DEVICES)
    assert result.returncode == 0, result.stderr[-3000:]

    job = queue.get_job(sqlite_engine, job_id)
    assert job.status == "failed"
    assert job.error == (
        "batch size 15 cannot be split evenly over 2 XLA devices: the global batch is divided "
        "among them, so use a multiple of 2 (e.g. 14 or 16)"
    )


def test_a_job_asking_for_more_devices_than_the_worker_has_fails_with_the_count(
    sqlite_engine, small_digits
):
    dataset = small_digits(per_class=10)
    job_id = queue.submit(
        sqlite_engine, {"dataset": dataset, "cores": 4, "img_size": 8, "device": "xla"}
    )
    result = run_worker("--once", **TWO_CPU_DEVICES)
    assert result.returncode == 0, result.stderr[-3000:]

    job = queue.get_job(sqlite_engine, job_id)
    assert job.status == "failed"
    assert job.error == (
        "cores 4: this worker has 2 XLA CPU devices; leave cores empty to use them all"
    )

"""A running job's system metrics (worker.system_metrics): the host's figures, each TPU chip's
duty cycle and HBM from a fake of libtpu's runtime metrics service read through the real
tpu-info client, stored as `sys/` points by the job's telemetry writer; no device sync on XLA.
"""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
import time

import pytest
from tpu_info.device import TpuChip

from db import queue, telemetry
from db.telemetry import metric_series
from tests.support.fake_tpu_metrics import GIB, FakeChip, free_address, serve_tpu_metrics
from tests.support.workers import REPO, run_worker, worker_env
from worker import system_metrics
from worker.reporter import TelemetryWriter
from worker.system_metrics import CudaSource, HostSource, SystemSampler, TpuSource

HOST_NAMES = {"cpu_pct", "process_cpu_pct", "loader_cpu_pct", "rss_mb"}
TWO_V4_CHIPS = [
    FakeChip(87.5, [(12 * GIB, 32 * GIB)]),
    FakeChip(41.0, [(3 * GIB, 32 * GIB)]),
]


class Collected:
    """A writer that keeps the points in memory."""

    def __init__(self) -> None:
        self.points: list = []

    def add_points(self, points: list) -> None:
        self.points.extend(points)


def steered_sampler(writer, sources, times: list[float], origin: float = 1000.0):
    """A sampler whose clock reads `times` one after the other and whose waits return at
    once, stopping after len(times) samples; the intervals it asked to wait are recorded."""
    clock = iter(times)
    waited: list[float] = []

    def wait(seconds: float) -> bool:
        waited.append(seconds)
        return len(waited) > len(times)

    sampler = SystemSampler(writer, origin, sources, 3.0, clock=lambda: next(clock), wait=wait)
    return sampler, waited


def test_tpu_duty_cycle_and_hbm_from_the_metrics_service_are_stored_per_chip(sqlite_engine):
    job_id = queue.submit(sqlite_engine, {"name": "on a tpu", "device": "xla"})
    lease = queue.claim(sqlite_engine, "tpu-vm:1").lease
    writer = TelemetryWriter(sqlite_engine, lease, flush_interval_s=0.05)
    try:
        with serve_tpu_metrics(TWO_V4_CHIPS) as fake:
            tpu = TpuSource(fake.address, TpuChip.V4, ready=lambda: True)
            sampler, waited = steered_sampler(writer, [HostSource(), tpu], [1010.2, 1013.4])
            sampler.run()
    finally:
        assert writer.flush(timeout_s=30)
        writer.close()

    assert waited == [3.0, 3.0, 3.0], "one interval before each sample"
    assert metric_series(sqlite_engine, job_id, "sys/tpu0/duty_cycle_pct") == [
        (10, 87.5),
        (13, 87.5),
    ]
    assert metric_series(sqlite_engine, job_id, "sys/tpu1/duty_cycle_pct") == [
        (10, 41.0),
        (13, 41.0),
    ]
    assert metric_series(sqlite_engine, job_id, "sys/tpu0/hbm_used_gib") == [(10, 12.0), (13, 12.0)]
    assert metric_series(sqlite_engine, job_id, "sys/tpu1/hbm_total_gib") == [
        (10, 32.0),
        (13, 32.0),
    ]
    for name in HOST_NAMES:
        assert [step for step, _ in metric_series(sqlite_engine, job_id, "sys/" + name)] == [
            10,
            13,
        ]
    rss = metric_series(sqlite_engine, job_id, "sys/rss_mb")
    assert all(value > 10 for _, value in rss), "this process holds more than 10 MiB"
    assert fake.requests.count("tpu.runtime.tensorcore.dutycycle.percent") == 2


def test_a_chips_two_devices_add_up_their_hbm_under_one_duty_cycle():
    """v2 and v3 chips have two TensorCores, each with its HBM; libtpu reports the duty cycle
    per chip, tpu-info repeats it per device, the sampler stores one chip."""
    chips = [
        FakeChip(60.0, [(4 * GIB, 16 * GIB), (2 * GIB, 16 * GIB)]),
        FakeChip(20.0, [(GIB, 16 * GIB), (GIB, 16 * GIB)]),
    ]
    with serve_tpu_metrics(chips) as fake:
        values = dict(TpuSource(fake.address, TpuChip.V3, ready=lambda: True).read())
    assert values == {
        "tpu0/duty_cycle_pct": 60.0,
        "tpu0/hbm_used_gib": 6.0,
        "tpu0/hbm_total_gib": 32.0,
        "tpu1/duty_cycle_pct": 20.0,
        "tpu1/hbm_used_gib": 2.0,
        "tpu1/hbm_total_gib": 32.0,
    }


def test_without_a_metrics_service_no_tpu_point_is_stored_and_the_log_says_so_once(caplog):
    caplog.set_level(logging.INFO, logger="worker.system_metrics")
    address = free_address()
    writer = Collected()
    tpu = TpuSource(address, TpuChip.V4, ready=lambda: True)
    sampler = SystemSampler(writer, 0.0, [HostSource(), tpu], 5.0)
    for _ in range(3):
        sampler.sample()

    names = {point.name for point in writer.points}
    assert names == {"sys/" + name for name in HOST_NAMES | {"disk_read_mb_s"}} or names == {
        "sys/" + name for name in HOST_NAMES
    }, names
    said = [record for record in caplog.records if "metrics service" in record.getMessage()]
    assert len(said) == 1, [record.getMessage() for record in said]
    assert said[0].levelname == "WARNING" and said[0].exc_info is None
    assert (
        said[0]
        .getMessage()
        .startswith(
            f"system metrics: libtpu's runtime metrics service at {address} does not answer "
            "(UNAVAILABLE: failed to connect"
        )
    )

    port = int(address.rsplit(":", 1)[1])
    with serve_tpu_metrics(TWO_V4_CHIPS, port=port):
        sampler.sample()
        sampler.sample()
    tpu_points = [point for point in writer.points if point.name.startswith("sys/tpu")]
    assert len(tpu_points) == 2 * 6
    said = [r.getMessage() for r in caplog.records if "metrics service" in r.getMessage()]
    assert said[1:] == [
        f"system metrics: libtpu's runtime metrics service at {address} answers now"
    ]


def test_nothing_is_asked_of_the_service_before_the_xla_runtime_starts():
    with serve_tpu_metrics(TWO_V4_CHIPS) as fake:
        started = False
        tpu = TpuSource(fake.address, TpuChip.V4, ready=lambda: started)
        assert tpu.read() == []
        assert fake.requests == []
        started = True
        assert len(tpu.read()) == 6


def test_two_samples_in_one_second_get_steps_a_second_apart():
    writer = Collected()
    sampler, _ = steered_sampler(writer, [HostSource()], [1010.2, 1010.9, 1011.1, 1020.0])
    sampler.run()
    steps = sorted({point.step for point in writer.points})
    assert steps == [10, 11, 12, 20]
    assert all(point.epoch is None for point in writer.points)
    assert {point.wall_time for point in writer.points} == {1010.2, 1010.9, 1011.1, 1020.0}


def test_the_cpu_of_child_processes_is_counted_from_their_second_sample():
    source = HostSource()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        first = dict(source.read())
        assert child.pid in source._children, "a child is followed from the sample it appears in"
        assert first["loader_cpu_pct"] == 0.0, "its CPU counts from its first sample on"
        second = dict(source.read())
        assert second["loader_cpu_pct"] >= 0.0
    finally:
        child.kill()
        child.wait()
    source.read()
    assert child.pid not in source._children, "an ended child is forgotten"


def test_a_failing_source_is_said_once_and_the_others_go_on(caplog):
    class Broken:
        def read(self):
            raise OSError("no /proc here")

    writer = Collected()
    sampler = SystemSampler(writer, 0.0, [Broken(), HostSource()], 5.0)
    sampler.sample()
    sampler.sample()
    assert {point.name for point in writer.points} >= {"sys/" + name for name in HOST_NAMES}
    said = [r.getMessage() for r in caplog.records if "reading Broken failed" in r.getMessage()]
    assert said == ["system metrics: reading Broken failed: no /proc here"]


def test_cuda_is_read_only_once_the_training_has_initialised_it(caplog):
    """No GPU here: the allocator's and NVML's answers are given, CUDA itself is not faked."""
    assert CudaSource().read() == [], "CUDA not initialised in this process: nothing is read"

    def no_nvml(index: int) -> int:
        raise RuntimeError("pynvml could not find libnvidia-ml.so")

    source = CudaSource(
        initialized=lambda: True,
        device=lambda: 0,
        allocated=lambda index: 512 * 2**20,
        reserved=lambda index: 1024 * 2**20,
        utilization=no_nvml,
    )
    assert source.read() == [("cuda0/allocated_mb", 512.0), ("cuda0/reserved_mb", 1024.0)]
    assert source.read() == [("cuda0/allocated_mb", 512.0), ("cuda0/reserved_mb", 1024.0)]
    said = [r.getMessage() for r in caplog.records if "NVML" in r.getMessage()]
    assert said == [
        "system metrics: no GPU utilisation from NVML (pynvml could not find libnvidia-ml.so)"
    ]
    busy = CudaSource(initialized=lambda: True, device=lambda: 1, allocated=lambda i: 0,
                      reserved=lambda i: 0, utilization=lambda i: 73)  # fmt: skip
    assert ("cuda1/util_pct", 73.0) in busy.read()


def test_what_each_device_samples_and_the_setting_that_turns_it_off(monkeypatch):
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
    kinds = {
        kind: [type(source).__name__ for source in system_metrics.sources_for(kind)]
        for kind in ("cpu", "xla", "cuda")
    }
    assert kinds == {
        "cpu": ["HostSource"],
        "xla": ["HostSource"],  # XLA on the CPU: no TPU on this machine
        "cuda": ["HostSource", "CudaSource"],
    }
    monkeypatch.setenv("TRAINDECK_SYSTEM_METRICS_INTERVAL", "0")
    from datetime import UTC, datetime

    assert system_metrics.start_for_job(Collected(), datetime.now(UTC), "cpu") is None


def test_a_started_sampler_stops_when_asked():
    writer = Collected()
    sampler = SystemSampler(writer, time.time(), [HostSource()], 3600.0).start()
    started = time.monotonic()
    sampler.stop()
    assert time.monotonic() - started < 5
    assert not sampler._thread.is_alive()
    assert writer.points == [], "no sample before the first interval has passed"


def test_the_newest_system_values_of_running_jobs(engine):
    from db.telemetry import MetricPoint, write_metrics

    first = queue.submit(engine, {"name": "a"})
    second = queue.submit(engine, {"name": "b"})
    write_metrics(
        engine,
        first,
        [MetricPoint("sys/cpu_pct", step, 10.0 * step, None, 100.0 + step) for step in range(3)]
        + [MetricPoint("sys/tpu0/duty_cycle_pct", 2, 88.0, None, 102.0)]
        + [MetricPoint("epoch/accuracy", 0, 0.9, 0, 50.0)],
    )
    assert telemetry.latest_system_values(engine, [first, second]) == {
        first: (102.0, {"cpu_pct": 20.0, "tpu0/duty_cycle_pct": 88.0})
    }


# --- the job process ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_cpu_job_stores_host_metrics_at_the_configured_interval(sqlite_engine, small_digits):
    dataset = small_digits(per_class=20)
    job_id = queue.submit(
        sqlite_engine,
        {"dataset": dataset, "arch": "resnet18", "epochs": 2, "img_size": 16, "bs": 16,
         "pretrained": False, "device": "cpu"},
    )  # fmt: skip
    result = run_worker("--once", TRAINDECK_SYSTEM_METRICS_INTERVAL="1")
    assert result.returncode == 0, result.stderr[-3000:]
    job = queue.get_job(sqlite_engine, job_id)
    assert job.status == "succeeded", job.error

    rows = telemetry.metrics_since(sqlite_engine, job_id)
    rows = [row for row in rows if row.name.startswith("sys/")]
    by_name: dict[str, list] = {}
    for row in rows:
        by_name.setdefault(row.name.removeprefix("sys/"), []).append(row)
    assert set(by_name) >= HOST_NAMES
    assert not any(name.startswith(("tpu", "cuda")) for name in by_name)
    started = job.created_at.timestamp()
    for name in HOST_NAMES:
        samples = sorted(by_name[name], key=lambda row: row.step)
        assert len(samples) >= 1, name  # the job runs far longer than one interval
        for earlier, later in itertools.pairwise(samples):
            assert later.step > earlier.step
            assert later.wall_time - earlier.wall_time >= 0.99, "one interval apart at least"
        for sample in samples:  # whole seconds since the job was submitted
            assert sample.step >= int(sample.wall_time - started) >= 0
            assert sample.epoch is None
    log = "\n".join(event.message for event in telemetry.events_since(sqlite_engine, job_id))
    assert "system metrics" not in log, "nothing went wrong, nothing is said"


@pytest.mark.slow
@pytest.mark.xla
def test_sampling_adds_no_device_sync_on_xla(data_dir):
    result = subprocess.run(
        [sys.executable, "-m", "tests.worker.system_metrics_probe"],
        cwd=REPO,
        env=worker_env(PJRT_DEVICE="CPU"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    probe = json.loads(result.stdout.strip().splitlines()[-1])

    assert probe["after"] == probe["before"], "sampling made the device execute or transfer"
    assert probe["samples"] == 5
    assert probe["tpu_points"] == 5 * 3, "the TPU source read the fake service all along"
    assert probe["synced"]["execute_count"] > probe["after"]["execute_count"], (
        "a traced graph was pending while sampling, and the counters see it run at the sync"
    )

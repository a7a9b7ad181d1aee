"""The System tab of the job page and the Workers page's system columns (Streamlit's AppTest),
fed by the real sampler (worker.system_metrics) reading a fake of libtpu's metrics service
through tpu-info's client and writing through the job's telemetry writer."""

from __future__ import annotations

import pandas as pd
import pytest
from tpu_info.device import TpuChip

from db import telemetry
from db.engine import dispose_engines
from db.queue import get_job
from db.telemetry import MetricPoint, write_metrics
from db.workers import register_worker, worker_heartbeat
from tests.dashboard.test_pages import figures, open_page, show_tab, texts, values
from tests.support import seed
from tests.support.fake_tpu_metrics import GIB, FakeChip, serve_tpu_metrics
from worker.reporter import TelemetryWriter
from worker.system_metrics import HostSource, SystemSampler, TpuSource


@pytest.fixture(autouse=True)
def _fresh_engine_cache():
    dispose_engines()
    yield
    dispose_engines()


def sample_a_tpu_job(engine, claimed, samples: int = 3) -> None:
    """What the job's process stores: `samples` samples of the host and of two v4 chips, 5 s
    apart from 60 s after the job was submitted."""
    chips = [FakeChip(87.5, [(12 * GIB, 32 * GIB)]), FakeChip(41.0, [(3 * GIB, 32 * GIB)])]
    origin = get_job(engine, claimed.id).created_at.timestamp()
    clock = iter(origin + 60 + 5 * n for n in range(samples))
    writer = TelemetryWriter(engine, claimed.lease, flush_interval_s=0.05)
    try:
        with serve_tpu_metrics(chips) as fake:
            tpu = TpuSource(fake.address, TpuChip.V4, ready=lambda: True)
            sampler = SystemSampler(
                writer, origin, [HostSource(), tpu], 5.0, clock=lambda: next(clock)
            )
            for _ in range(samples):
                sampler.sample()
    finally:
        assert writer.flush(timeout_s=30)
        writer.close()


def test_the_tpu_metrics_services_duty_cycle_and_hbm_arrive_on_the_system_tab(sqlite_engine):
    live = seed.running_job(sqlite_engine)
    sample_a_tpu_job(sqlite_engine, live)
    stored = telemetry.metric_series(sqlite_engine, live.id, "sys/tpu0/duty_cycle_pct")
    assert stored == [(60, 87.5), (65, 87.5), (70, 87.5)]

    at = show_tab(open_page("pages/job.py", job=live.id), "System")

    tiles = {metric.label: metric.value for metric in at.metric}
    assert tiles["TPU 0 duty cycle"] == "87.5%"
    assert tiles["TPU 1 duty cycle"] == "41.0%"
    assert tiles["TPU 0 HBM"] == "12.0 / 32.0 GiB"
    assert tiles["TPU 1 HBM"] == "3.0 / 32.0 GiB"
    assert tiles["Host CPU"].endswith("%") and tiles["Job memory (RSS)"].endswith(" MiB")
    drawn = {figure["layout"]["title"]["text"]: figure for figure in figures(at)}
    duty = drawn["TPU TensorCore duty cycle"]
    assert [trace["name"] for trace in duty["data"]] == ["chip 0", "chip 1"]
    assert values(duty["data"][0]["y"]).tolist() == [87.5, 87.5, 87.5]
    assert values(duty["data"][1]["y"]).tolist() == [41.0, 41.0, 41.0]
    submitted = pd.Timestamp(get_job(sqlite_engine, live.id).created_at)
    first_sample = pd.Timestamp(duty["data"][0]["x"][0])
    assert first_sample - submitted == pd.Timedelta(seconds=60), "drawn at its time (UTC)"
    hbm = drawn["TPU HBM used (of 32.0 GiB a chip)"]
    assert values(hbm["data"][0]["y"]).tolist() == [12.0, 12.0, 12.0]
    assert {"Host CPU", "CPU of the job's processes", "Job memory (resident)"} <= set(drawn)

    # The System tab follows the sys/ series on its own; the other tabs' LiveJob never reads
    # them, and the curves draw none of them.
    assert at.session_state["job.live"].names("sys/") == []
    write_metrics(sqlite_engine, live.id, [MetricPoint("sys/tpu0/duty_cycle_pct", 75, 90.0)])
    at.run()
    drawn = {figure["layout"]["title"]["text"]: figure for figure in figures(at)}
    duty = drawn["TPU TensorCore duty cycle"]["data"][0]
    assert values(duty["y"]).tolist() == [87.5, 87.5, 87.5, 90.0], "new samples are appended"
    curves = {f["layout"]["title"]["text"] for f in figures(show_tab(at, "Curves"))}
    assert not any("TPU" in title or "CPU" in title for title in curves)


def test_views_of_the_curves_read_no_system_series(sqlite_engine):
    from db.series import snapshot

    live = seed.running_job(sqlite_engine)
    sample_a_tpu_job(sqlite_engine, live, samples=1)
    names = set(snapshot(sqlite_engine, live.id).series)
    assert "sys/tpu0/duty_cycle_pct" in names and "batch/train_loss" in names
    assert set(snapshot(sqlite_engine, live.id, skip=("sys/",)).series) == {
        name for name in names if not name.startswith("sys/")
    }
    assert set(snapshot(sqlite_engine, live.id, only=("sys/",)).series) == {
        name for name in names if name.startswith("sys/")
    }
    compare = open_page("pages/compare.py", jobs=str(live.id))
    titles = {figure["layout"]["title"]["text"] for figure in figures(compare)}
    assert "Train loss per batch (smoothed)" in titles
    assert not any("sys" in title or "cpu" in title for title in titles)


def test_a_job_without_system_metrics_says_why(sqlite_engine):
    live = seed.running_job(sqlite_engine)
    at = show_tab(open_page("pages/job.py", job=live.id), "System")
    assert "No system metrics yet" in texts(at)
    assert not figures(at)


def test_the_workers_page_shows_the_newest_system_values_of_each_running_job(sqlite_engine):
    register_worker(sqlite_engine, "tpu-vm-1:100", "tpu-vm-1", 100, "TPU v4-8")
    register_worker(sqlite_engine, "cpu-box:7", "cpu-box", 7, "CPU 2 cores (x86_64)")
    live = seed.running_job(sqlite_engine, worker_id="tpu-vm-1:100")
    worker_heartbeat(sqlite_engine, "tpu-vm-1:100", "busy", live.id)
    sample_a_tpu_job(sqlite_engine, live, samples=2)
    newest = [
        MetricPoint("sys/cpu_pct", 100, 55.0, None, 2e9),
        MetricPoint("sys/rss_mb", 100, 2048.0, None, 2e9),
    ]
    write_metrics(sqlite_engine, live.id, newest)

    at = open_page("pages/workers.py")

    frame = at.dataframe[0].value.set_index("worker")
    busy = frame.loc["tpu-vm-1:100"]
    assert busy["host CPU %"] == 55.0 and busy["job RSS MiB"] == 2048.0
    assert busy["TPU duty %"] == "88 · 41"
    assert busy["TPU HBM GiB"] == "15.0 / 64.0"
    assert pd.isna(frame.loc["cpu-box:7", "host CPU %"])
    assert "GPU" not in frame.columns, "no column that no worker fills"

"""What a running job's process samples about the machine (`sys/` metrics, written by
worker.system_metrics; db/telemetry.py lists the names): the job page's System tab, and the
newest values of each busy worker's job on the Workers page."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import plotly.graph_objects as go
import streamlit as st

from dashboard import charts
from dashboard.live import LiveJob
from db.engine import Engine
from db.models import FINISHED_STATUSES, Job
from db.series import Buckets
from db.telemetry import SYS

LIVE_KEY = "job.system_live"
_PER_DEVICE = re.compile(r"^(tpu|cuda)(\d+)/(.+)$")
NO_POINTS_YET = (
    "No system metrics yet: the job's process samples the host (and the TPU or GPU) every "
    "TRAINDECK_SYSTEM_METRICS_INTERVAL seconds of the worker's settings; 0 turns them off."
)


@dataclass
class SystemSeries:
    """A job's `sys/` series, by what they measure: the host's, and each TPU chip's and GPU's
    (index → name without the device → series)."""

    host: dict[str, Buckets]
    tpu: dict[int, dict[str, Buckets]]
    cuda: dict[int, dict[str, Buckets]]

    @classmethod
    def of(cls, series: Mapping[str, Buckets]) -> SystemSeries:
        result = cls({}, {}, {})
        for name, buckets in series.items():
            if not name.startswith(SYS) or not len(buckets):
                continue
            short = name.removeprefix(SYS)
            match = _PER_DEVICE.match(short)
            if match is None:
                result.host[short] = buckets
            else:
                kind, index, what = match.group(1), int(match.group(2)), match.group(3)
                getattr(result, kind).setdefault(index, {})[what] = buckets
        return result

    def __bool__(self) -> bool:
        return bool(self.host or self.tpu or self.cuda)


def _last(series: Buckets | None) -> float | None:
    """The newest point of a series (of its newest bucket: the bucket's mean)."""
    if series is None or not len(series):
        return None
    return float(series.mean[-1])


def latest_tiles(system: SystemSeries) -> list[tuple[str, str]]:
    """(label, value) of the newest sample: the host, then each TPU chip and GPU."""
    tiles = []
    cpu, rss = _last(system.host.get("cpu_pct")), _last(system.host.get("rss_mb"))
    if cpu is not None:
        tiles.append(("Host CPU", f"{cpu:.0f}%"))
    loader = _last(system.host.get("loader_cpu_pct"))
    if loader is not None:
        tiles.append(("DataLoader workers CPU", f"{loader:.0f}% of a core"))
    if rss is not None:
        tiles.append(("Job memory (RSS)", f"{rss:,.0f} MiB"))
    for index, chip in sorted(system.tpu.items()):
        duty = _last(chip.get("duty_cycle_pct"))
        used, total = _last(chip.get("hbm_used_gib")), _last(chip.get("hbm_total_gib"))
        if duty is not None:
            tiles.append((f"TPU {index} duty cycle", f"{duty:.1f}%"))
        if used is not None and total is not None:
            tiles.append((f"TPU {index} HBM", f"{used:.1f} / {total:.1f} GiB"))
    for index, gpu in sorted(system.cuda.items()):
        util = _last(gpu.get("util_pct"))
        allocated = _last(gpu.get("allocated_mb"))
        if util is not None:
            tiles.append((f"GPU {index} utilisation", f"{util:.0f}%"))
        if allocated is not None:
            tiles.append((f"GPU {index} memory allocated", f"{allocated:,.0f} MiB"))
    return tiles


def system_figures(system: SystemSeries, job: Job) -> list[tuple[str, go.Figure]]:
    """(key, figure) of the job's system series against the clock."""
    origin = job.created_at
    figures = []

    def add(key: str, lines: dict[str, Buckets | None], title: str, y_title: str) -> None:
        present = {label: series for label, series in lines.items() if series is not None}
        if present:
            figures.append((key, charts.time_figure(present, origin, title, y_title)))

    host = system.host
    add("host_cpu", {"host": host.get("cpu_pct")}, "Host CPU", "% of all cores")
    add(
        "job_cpu",
        {"job process": host.get("process_cpu_pct"),
         "DataLoader workers": host.get("loader_cpu_pct")},
        "CPU of the job's processes",
        "% of one core",
    )  # fmt: skip
    add("rss", {"job process": host.get("rss_mb")}, "Job memory (resident)", "MiB")
    add("disk", {"host": host.get("disk_read_mb_s")}, "Disk reads", "MiB/s")
    chips = sorted(system.tpu.items())
    add(
        "tpu_duty",
        {f"chip {i}": chip.get("duty_cycle_pct") for i, chip in chips},
        "TPU TensorCore duty cycle",
        "%",
    )
    totals = {_last(chip.get("hbm_total_gib")) for _, chip in chips} - {None}
    of = f" (of {totals.pop():.1f} GiB a chip)" if len(totals) == 1 else ""
    add("tpu_hbm", {f"chip {i}": chip.get("hbm_used_gib") for i, chip in chips},
        f"TPU HBM used{of}", "GiB")  # fmt: skip
    gpus = sorted(system.cuda.items())
    add("gpu_util", {f"GPU {i}": gpu.get("util_pct") for i, gpu in gpus}, "GPU utilisation", "%")
    memory: dict[str, Buckets | None] = {}
    for i, gpu in gpus:
        memory[f"GPU {i} allocated"] = gpu.get("allocated_mb")
        memory[f"GPU {i} reserved"] = gpu.get("reserved_mb")
    add("gpu_memory", memory, "GPU memory (PyTorch's allocator)", "MiB")
    return figures


def system_live(engine: Engine, job_id: int) -> LiveJob:
    """The job's `sys/` series, followed (refreshed with only the new rows) while the System
    tab is open: the other tabs' LiveJob leaves them out, so a long job's samples cost the
    job page nothing until someone looks at them."""
    state = st.session_state.get(LIVE_KEY)
    if not isinstance(state, LiveJob) or state.job_id != job_id:
        state = st.session_state[LIVE_KEY] = LiveJob(job_id, only=(SYS,), xla_reports=False)
    state.refresh(engine)
    return state


def system_tab(engine: Engine, job: Job, _live: LiveJob) -> None:
    live = system_live(engine, job.id)
    system = SystemSeries.of({name: live.get(name) for name in live.names(SYS)})
    if not system:
        if job.status in FINISHED_STATUSES:
            st.caption("This job stored no system metrics.")
        else:
            st.info(NO_POINTS_YET)
        return
    tiles = latest_tiles(system)
    if tiles:
        ended = " (the job has ended)" if job.status in FINISHED_STATUSES else ""
        st.caption(f"The newest sample{ended}")
        for start in range(0, len(tiles), 4):
            for column, (label, value) in zip(
                st.columns(4), tiles[start : start + 4], strict=False
            ):
                column.metric(label, value)
    if (
        not system.tpu
        and "xla" in (job.device or "").lower()
        and "tpu" in (job.device or "").lower()
    ):
        st.caption(
            "No TPU duty cycle or HBM: libtpu's metrics service did not answer the job's "
            "process (its log says why)."
        )
    figures = system_figures(system, job)
    for start in range(0, len(figures), 2):
        for column, (key, figure) in zip(st.columns(2), figures[start : start + 2], strict=False):
            column.plotly_chart(figure, key=f"chart.sys.{key}")


# --- the Workers page -----------------------------------------------------------------------


def worker_columns(latest: Mapping[str, float]) -> dict[str, float | str | None]:
    """The Workers page's columns for one job's newest `sys/` values (keys without `sys/`)."""
    devices = [match.groups() for match in map(_PER_DEVICE.match, latest) if match]
    chips = sorted({int(index) for kind, index, _ in devices if kind == "tpu"})
    gpus = sorted({int(index) for kind, index, _ in devices if kind == "cuda"})
    columns: dict[str, float | str | None] = {
        "host CPU %": latest.get("cpu_pct"),
        "job RSS MiB": latest.get("rss_mb"),
        "loader CPU %": latest.get("loader_cpu_pct"),
        "disk read MiB/s": latest.get("disk_read_mb_s"),
        "TPU duty %": None,
        "TPU HBM GiB": None,
        "GPU": None,
    }
    if chips:
        duty = [latest.get(f"tpu{i}/duty_cycle_pct") for i in chips]
        columns["TPU duty %"] = " · ".join("–" if d is None else f"{d:.0f}" for d in duty)
        used = sum(latest.get(f"tpu{i}/hbm_used_gib", 0.0) for i in chips)
        total = sum(latest.get(f"tpu{i}/hbm_total_gib", 0.0) for i in chips)
        columns["TPU HBM GiB"] = f"{used:.1f} / {total:.1f}"
    if gpus:
        parts = []
        for i in gpus:
            util, allocated = latest.get(f"cuda{i}/util_pct"), latest.get(f"cuda{i}/allocated_mb")
            busy = f"{util:.0f}%" if util is not None else "–"
            memory = f"{allocated:,.0f} MiB" if allocated is not None else "–"
            parts.append(f"{i}: {busy}, {memory}")
        columns["GPU"] = " · ".join(parts)
    return columns

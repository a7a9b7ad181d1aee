"""Workers: each worker process with its host, device, state by heartbeat, and current job,
with the newest system metrics its running job's process sampled (`dashboard.system_view`)."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from common.config import DEFAULT_HEARTBEAT_TIMEOUT_S, heartbeat_timeout_s
from dashboard.format import duration, plain, since
from dashboard.state import get_engine
from dashboard.system_view import worker_columns
from db.models import Worker
from db.telemetry import latest_system_values
from db.workers import is_stale, list_workers

REFRESH_S = 5


def worker_state(worker: Worker, timeout_s: float) -> str:
    """`stopped`, `stale` (no heartbeat within the timeout), or alive and idle/busy."""
    if worker.state == "stopped":
        return "stopped"
    if is_stale(worker, timeout_s):
        return "stale"
    return f"alive ({worker.state})"


def stale_after_s() -> float:
    try:
        return heartbeat_timeout_s()
    except ValueError as exc:
        st.warning(f"{plain(exc)}; using {DEFAULT_HEARTBEAT_TIMEOUT_S:g} s.")
        return DEFAULT_HEARTBEAT_TIMEOUT_S


@st.fragment(run_every=REFRESH_S)
def workers_view() -> None:
    timeout_s = stale_after_s()
    workers = list_workers(get_engine())
    if not workers:
        st.info("No worker has registered yet. Start one with `python -m worker`.")
        return
    states = [worker_state(worker, timeout_s) for worker in workers]
    stale = [worker.id for worker, state in zip(workers, states, strict=True) if state == "stale"]
    if stale:
        st.warning(
            f"No heartbeat for over {duration(timeout_s)} from: {plain(', '.join(stale))}. "
            "Their running jobs go back to the queue (or fail when out of attempts).",
            icon=":material/heart_broken:",
        )
    busy = [w.current_job_id for w in workers if w.current_job_id is not None and w.state == "busy"]
    latest = latest_system_values(get_engine(), busy)
    now = time.time()
    system = []
    for worker in workers:
        sampled = latest.get(worker.current_job_id) if worker.state == "busy" else None
        columns = worker_columns(sampled[1] if sampled else {})
        columns["sampled"] = f"{duration(max(0.0, now - sampled[0]))} ago" if sampled else None
        system.append(columns)
    frame = pd.DataFrame(
        {
            "worker": [worker.id for worker in workers],
            "host": [worker.host for worker in workers],
            "pid": [worker.pid for worker in workers],
            "device": [worker.device for worker in workers],
            "state": states,
            "last heartbeat": [f"{duration(since(w.heartbeat_at))} ago" for w in workers],
            "current job": [
                f"job?job={w.current_job_id}" if w.current_job_id is not None else None
                for w in workers
            ],
            "jobs done": [worker.jobs_done for worker in workers],
            "up for": [duration(since(worker.started_at)) for worker in workers],
        }
    )
    for name in system[0]:
        shown = [columns[name] for columns in system]
        if any(value is not None for value in shown):  # no empty TPU column on a CPU fleet
            frame[name] = shown
    st.dataframe(
        frame.style.apply(
            lambda column: ["color: #d33" if value == "stale" else "" for value in column],
            subset=["state"],
        ),
        column_config={
            "current job": st.column_config.LinkColumn(display_text=r"job\?job=(\d+)"),
        },
        hide_index=True,
        width="stretch",
    )
    st.caption(f"A worker is stale after {duration(timeout_s)} without a heartbeat.")


st.title("Workers")
workers_view()

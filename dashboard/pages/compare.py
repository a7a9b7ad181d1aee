"""Compare: several jobs' curves overlaid, with their hyper-parameters and final metrics.

The jobs on offer follow the filters (`dashboard.job_filters`: status, tags, dataset,
architecture, words of the name or note), kept in the address with the jobs chosen (?jobs=).
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import streamlit as st

from dashboard import charts
from dashboard.format import chart_text
from dashboard.job_filters import filter_widgets
from dashboard.state import get_engine
from db.engine import Engine
from db.joblist import EVERY_JOB, JobFilter, job_number
from db.jobs_table import JobRow, find_jobs, job_page, jobs_by_id
from db.models import JOB_STATUSES
from db.series import Buckets, snapshot
from db.telemetry import BATCH, EPOCH, final_metrics

MAX_BUCKETS = 600
DEFAULT_COUNT = 3
PICKER_ROWS = 50  # the newest jobs a search finds; typing more finds any other
MAX_NAMED = 50  # jobs taken from ?jobs=


def default_selection(engine: Engine, filters: JobFilter) -> list[int]:
    """Jobs named in the address (?jobs=3,5), else the newest few that have started and that
    the filters admit."""
    raw = st.query_params.get("jobs", "")
    named = [number for part in raw.split(",") if (number := job_number(part)) is not None]
    if named:
        return [row.id for row in jobs_by_id(engine, named[:MAX_NAMED])]
    started = tuple(s for s in JOB_STATUSES if s != "queued")
    newest = replace(filters, statuses=filters.statuses or started, search="")
    return [row.id for row in job_page(engine, newest, limit=DEFAULT_COUNT).rows]


def job_options(engine: Engine, default: list[int], filters: JobFilter) -> list[JobRow]:
    """The jobs offered: those chosen (however old), then those the filters find in SQL."""
    picked = [*st.session_state.get("compare.jobs", []), *default]
    found = find_jobs(engine, filters.search, PICKER_ROWS, filters)
    rows = jobs_by_id(engine, picked) + found
    return list({row.id: row for row in rows}.values())


def parameters_table(rows: list[JobRow], show_all: bool) -> pd.DataFrame:
    finals = final_metrics(get_engine(), [row.id for row in rows])
    specs = pd.DataFrame([row.spec for row in rows]).astype(str)
    if not show_all and len(rows) > 1:
        specs = specs.loc[:, specs.nunique() > 1]
    frame = pd.DataFrame(
        {"job": [f"#{row.id} {row.name}" for row in rows], "status": [r.status for r in rows]}
    )
    metrics = pd.DataFrame([finals[row.id] for row in rows]).add_prefix("final ")
    return pd.concat([frame, specs, metrics], axis=1)


st.title("Compare jobs")
st.caption("Jobs to add: filter them here, then pick them below.")
filters = filter_widgets(get_engine(), "compare", search_key="compare.find")
default = default_selection(get_engine(), filters)
rows = job_options(get_engine(), default, filters)
if not rows:
    st.info("No job matches." if filters != EVERY_JOB else "No jobs yet.")
    st.stop()
by_id = {row.id: row for row in rows}
chosen = st.multiselect(
    "Jobs",
    list(by_id),
    default=default,
    format_func=lambda i: f"#{i} · {by_id[i].name} · {by_id[i].status}",
    key="compare.jobs",
)
st.query_params["jobs"] = ",".join(str(job_id) for job_id in chosen)
if not chosen:
    st.info("Pick the jobs to compare.")
    st.stop()

selected = [by_id[job_id] for job_id in chosen]
show_all = st.toggle("Show every spec field (not only those that differ)", key="compare.all")
st.dataframe(parameters_table(selected, show_all), hide_index=True, width="stretch")

series = {  # legend names: plotly renders some HTML in them
    f"#{row.id} {chart_text(row.name)}": snapshot(
        get_engine(), row.id, MAX_BUCKETS, only=(BATCH, EPOCH)
    ).series
    for row in selected
}
losses = {label: s["batch/train_loss"] for label, s in series.items() if "batch/train_loss" in s}
if losses:
    st.plotly_chart(
        charts.smoothed_lines_figure(losses, "Train loss per batch (smoothed)"),
        key="compare.batch_loss",
    )
epoch_names = sorted({name for s in series.values() for name in s if name.startswith("epoch/")})
if not losses and not epoch_names:
    st.info("None of these jobs has written metrics yet.")
for start in range(0, len(epoch_names), 2):
    columns = st.columns(2)
    for column, name in zip(columns, epoch_names[start : start + 2], strict=False):
        lines: dict[str, Buckets] = {label: s[name] for label, s in series.items() if name in s}
        short = name.removeprefix("epoch/")
        column.plotly_chart(
            charts.epoch_figure(lines, f"{short} per epoch", short), key=f"compare.{name}"
        )

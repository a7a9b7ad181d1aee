"""Jobs: every job with its progress and latest metrics, by status, and what to do with one."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import actions
from dashboard.format import between, duration, since
from dashboard.nav import JOB_PAGE, NEW_JOB_PAGE
from dashboard.state import get_engine
from db.jobs_table import JobRow, job_rows
from db.models import JOB_STATUSES
from db.queue import count_by_status

REFRESH_S = 5
MAX_ROWS = 500


def status_text(row: JobRow) -> str:
    if row.status == "running" and row.cancel_requested:
        return "running (cancelling)"
    return row.status


def table(rows: list[JobRow]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "job": [f"job?job={row.id}" for row in rows],
            "name": [row.name for row in rows],
            "status": [status_text(row) for row in rows],
            "progress": [row.progress for row in rows],
            "epoch": [f"{row.epoch}/{row.total_epochs}" for row in rows],
            "train loss": [row.train_loss for row in rows],
            "valid loss": [row.valid_loss for row in rows],
            "accuracy": [row.accuracy for row in rows],
            "dataset": [row.spec.get("dataset", "") for row in rows],
            "arch": [row.spec.get("arch", "") for row in rows],
            "device": [row.device or "" for row in rows],
            "worker": [row.worker_id or "" for row in rows],
            "age": [duration(since(row.created_at)) for row in rows],
            "duration": [duration(between(row.started_at, row.finished_at)) for row in rows],
        }
    )


COLUMNS = {
    "job": st.column_config.LinkColumn("#", display_text=r"job\?job=(\d+)", width="small"),
    "progress": st.column_config.ProgressColumn(
        "progress", min_value=0.0, max_value=1.0, format="percent"
    ),
    "train loss": st.column_config.NumberColumn(format="%.4f"),
    "valid loss": st.column_config.NumberColumn(format="%.4f"),
    "accuracy": st.column_config.NumberColumn(format="percent"),
}


def job_label(row: JobRow) -> str:
    return f"#{row.id} · {row.name} · {status_text(row)}"


@st.fragment(run_every=REFRESH_S)
def jobs_view(statuses: list[str]) -> None:
    engine = get_engine()
    rows = job_rows(engine, statuses or None, limit=MAX_ROWS)
    if not rows:
        st.info("No jobs" + (" with that status." if statuses else " yet."))
        st.page_link(NEW_JOB_PAGE, label="Configure a job", icon=":material/add_circle:")
        return
    if len(rows) == MAX_ROWS:
        st.caption(f"The newest {MAX_ROWS} jobs; filter by status to see others.")
    st.dataframe(table(rows), column_config=COLUMNS, hide_index=True, width="stretch")

    st.subheader("Act on a job")
    by_id = {row.id: row for row in rows}
    if st.session_state.get("jobs.selected") not in by_id:
        st.session_state["jobs.selected"] = rows[0].id
    job_id = st.selectbox(
        "Job", list(by_id), format_func=lambda i: job_label(by_id[i]), key="jobs.selected"
    )
    row = by_id[job_id]
    actions.show_flashes()
    if st.button("Open its page", icon=":material/monitoring:", key="jobs.open"):
        st.switch_page(JOB_PAGE, query_params={"job": job_id})
    actions.render_buttons(engine, job_id, row.status, row.spec, key="jobs")


st.title("Jobs")
counts = count_by_status(get_engine())
chosen = st.multiselect(
    "Status",
    JOB_STATUSES,
    format_func=lambda status: f"{status} ({counts.get(status, 0)})",
    placeholder="All statuses",
    key="jobs.statuses",
)
jobs_view(chosen)

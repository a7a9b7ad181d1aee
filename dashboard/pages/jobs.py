"""Jobs: every job with its progress and latest metrics, a page at a time, and what to do
with one.

Filters (status, tags, dataset, architecture, a number or words of the name or note;
`dashboard.job_filters`, kept in the page's address) and the order are applied in SQL, and the
pages are keyset pages (`db.jobs_table.job_page`): the first, the previous, the next and the
last page each cost a few index ranges, so every job can be reached however many there are.
"Next to run" lists the queue in the order workers take it. A page stays anchored where it is
while the table refreshes: new jobs show on the first page without pushing the others along.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import actions
from dashboard.format import between, duration, since
from dashboard.job_filters import filter_widgets
from dashboard.nav import JOB_PAGE, NEW_JOB_PAGE
from dashboard.state import get_engine
from db.joblist import EVERY_JOB, ORDERS, Cursor, JobFilter, Order
from db.jobs_table import JobPage, JobRow, count_jobs, job_page

REFRESH_S = 5
PAGE_SIZES = (25, 50, 100, 200)
PAGE_KEY = "jobs.page"
ORDER_LABELS = {
    "newest": "Newest first",
    "oldest": "Oldest first",
    "next": "Next to run (the queue)",
}


def status_text(row: JobRow) -> str:
    if row.status == "running" and row.cancel_requested:
        return "running (cancelling)"
    return row.status


def table(rows: list[JobRow]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "job": [f"job?job={row.id}" for row in rows],
            "name": [row.name for row in rows],
            "tags": [", ".join(row.tags) for row in rows],
            "status": [status_text(row) for row in rows],
            "priority": [row.priority for row in rows],
            "progress": [row.progress for row in rows],
            "epoch": [f"{row.epoch}/{row.total_epochs}" for row in rows],
            "train loss": [row.train_loss for row in rows],
            "valid loss": [row.valid_loss for row in rows],
            "accuracy": [row.accuracy for row in rows],
            "waits for data": [row.input_wait for row in rows],
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
    "waits for data": st.column_config.NumberColumn(
        format="percent",
        help="The share of each training step spent waiting for the next batch (latest "
        "epoch); past half, the job is input-bound.",
    ),
}


def job_label(row: JobRow) -> str:
    return f"#{row.id} · {row.name} · {status_text(row)}"


def _anchor(signature: tuple) -> tuple:
    """Where the page stands: ("first",), ("after", id, priority), ("before", id, priority)
    or ("last",); back to the first page when the filters, the order or the size change."""
    state = st.session_state.get(PAGE_KEY)
    if not isinstance(state, dict) or state.get("for") != signature:
        state = st.session_state[PAGE_KEY] = {"for": signature, "at": ("first",)}
    return state["at"]


def _go(signature: tuple, at: tuple) -> None:
    st.session_state[PAGE_KEY] = {"for": signature, "at": at}


def _read_page(filters: JobFilter, order: Order, size: int, at: tuple) -> JobPage:
    engine = get_engine()
    if at[0] == "after":
        return job_page(engine, filters, order, after=Cursor(at[1], at[2]), limit=size)
    if at[0] == "before":
        return job_page(engine, filters, order, before=Cursor(at[1], at[2]), limit=size)
    return job_page(engine, filters, order, to_end=at[0] == "last", limit=size)


def _pager(page: JobPage, signature: tuple) -> None:
    first, last = page.first, page.last
    columns = st.columns(4)
    buttons: list[tuple[str, str, tuple | None, bool]] = [
        ("First page", ":material/first_page:", ("first",), page.earlier),
        ("Previous", ":material/chevron_left:", first and ("before", first.id, first.priority),
         page.earlier),
        ("Next", ":material/chevron_right:", last and ("after", last.id, last.priority),
         page.later),
        ("Last page", ":material/last_page:", ("last",), page.later),
    ]  # fmt: skip
    for column, (label, icon, at, enabled) in zip(columns, buttons, strict=True):
        column.button(
            label,
            icon=icon,
            key=f"jobs.pager.{label}",
            disabled=not enabled or at is None,
            on_click=_go,
            args=(signature, at),
            width="stretch",
        )


@st.fragment(run_every=REFRESH_S)
def jobs_view(filters: JobFilter, order: Order, size: int) -> None:
    engine = get_engine()
    signature = (filters, order, size)
    at = _anchor(signature)
    page = _read_page(filters, order, size, at)
    if not page.rows and at != ("first",):  # the jobs it stood by are gone
        at = ("first",)
        _go(signature, at)
        page = _read_page(filters, order, size, at)
    filtered = filters != EVERY_JOB or order == "next"
    if not page.rows:
        st.info("No jobs" + (" match." if filtered else " yet."))
        st.page_link(NEW_JOB_PAGE, label="Configure a job", icon=":material/add_circle:")
        return
    total = count_jobs(engine, filters, order)
    where = "the queue, in the order workers take it" if order == "next" else "jobs"
    st.caption(
        f"{total:,} {'matching ' if filtered and order != 'next' else ''}{where}; "
        f"this page: {len(page.rows)}, from #{page.rows[0].id} to #{page.rows[-1].id}."
    )
    st.dataframe(table(page.rows), column_config=COLUMNS, hide_index=True, width="stretch")
    _pager(page, signature)

    st.subheader("Act on a job")
    by_id = {row.id: row for row in page.rows}
    if st.session_state.get("jobs.selected") not in by_id:
        st.session_state["jobs.selected"] = page.rows[0].id
    job_id = st.selectbox(
        "Job", list(by_id), format_func=lambda i: job_label(by_id[i]), key="jobs.selected"
    )
    row = by_id[job_id]
    actions.show_flashes()
    if st.button("Open its page", icon=":material/monitoring:", key="jobs.open"):
        st.switch_page(JOB_PAGE, query_params={"job": job_id})
    actions.render_buttons(engine, job_id, row.status, row.spec, key="jobs")


st.title("Jobs")
filters = filter_widgets(get_engine(), "jobs")
order_column, size_column, _ = st.columns([3, 1, 6])
order = order_column.selectbox(
    "Order", ORDERS, format_func=ORDER_LABELS.__getitem__, key="jobs.order"
)
size = size_column.selectbox("Per page", PAGE_SIZES, index=1, key="jobs.size")
if order == "next" and filters.statuses and filters.statuses != ("queued",):
    st.caption("The queue holds queued jobs only: the status filter does not apply to it.")
jobs_view(filters, order, size)

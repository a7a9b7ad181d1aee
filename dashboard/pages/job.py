"""Job: one job live — progress, curves, XLA diagnostics, log, spec and artifacts.

While the job is queued or running, the live part redraws every REFRESH_S seconds
(`st.fragment(run_every=…)`) and fetches only the rows newer than those it drew
(`dashboard.live.LiveJob`). The tabs are listed in JOB_TABS: another view of a job (say, its
results on the validation set) is one more (title, render function) entry there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from common import store
from dashboard import actions, charts, diagnostics_view, labels_view, xla
from dashboard.downloads import link_for
from dashboard.format import between, duration, plain, since, size
from dashboard.labels_view import LabelsOwner
from dashboard.live import LiveJob
from dashboard.nav import SWEEPS_PAGE
from dashboard.results_view import render_results
from dashboard.state import get_engine
from dashboard.system_view import system_tab
from db.artifacts import list_artifacts
from db.engine import Engine
from db.gang import members
from db.joblist import job_number
from db.jobs_table import find_jobs, jobs_by_id, progress_fraction
from db.labels import job_labels, set_labels
from db.models import FINISHED_STATUSES, Job
from db.queue import JobNotFound, get_job
from db.telemetry import SYS, log_line_count, log_page

REFRESH_S = 2
LIVE_KEY = "job.live"
TAB_KEY = "job.tab"
DRAWN_STATUS_KEY = "job.drawn_status"
LOG_LINES_SHOWN = 300
LOG_PAGE_KEY = "job.log_page"  # (job id, the id the page shown ends below: None for the newest)
PICKER_ROWS = 50
PICKED_KEY = "job.picked"  # the job the picker put in the address


def chosen_job_id() -> int | None:
    """The job in the address (?job=N), else one picked here.

    The picker searches in SQL (a job number or a piece of the name), so any job can be
    picked however many there are. It puts the job it picked in the address, and stays on the
    page while that is the job shown, so that a person can search and pick again.
    """
    raw = st.query_params.get("job")
    if raw is not None and raw != st.session_state.get(PICKED_KEY):
        try:
            return int(raw)
        except ValueError:
            st.warning(f"{plain(repr(raw))} is not a job number.")
    search = st.text_input(
        "Find a job", placeholder="a job number or a piece of its name", key="job.find"
    )
    rows = find_jobs(get_engine(), search, limit=PICKER_ROWS)  # searched in SQL
    if len(rows) == PICKER_ROWS:
        st.caption(f"The newest {PICKER_ROWS} that match: type more to find others.")
    picked = job_number(raw) if raw is not None else None
    by_id = {row.id: row for row in rows}
    if picked is not None and picked not in by_id:  # keep the job shown on offer
        by_id = {row.id: row for row in jobs_by_id(get_engine(), [picked])} | by_id
    if not by_id:
        st.info("No job matches." if search.strip() else "No jobs yet.")
        return None
    if not rows:
        st.caption("No other job matches.")
    ids = list(by_id)
    job_id = st.selectbox(
        "Job",
        ids,
        index=ids.index(picked) if picked in by_id else 0,
        format_func=lambda i: f"#{i} · {by_id[i].name} · {by_id[i].status}",
    )
    st.session_state[PICKED_KEY] = st.query_params["job"] = str(job_id)
    return job_id


def live_state(job_id: int) -> LiveJob:
    state = st.session_state.get(LIVE_KEY)
    if not isinstance(state, LiveJob) or state.job_id != job_id:
        # The System tab follows the `sys/` series itself (dashboard.system_view).
        state = st.session_state[LIVE_KEY] = LiveJob(job_id, skip=(SYS,))
    return state


# --- progress and failure ------------------------------------------------------------------


def show_progress(job: Job) -> None:
    columns = st.columns(5)
    columns[0].metric("Status", job.status + (" (cancelling)" if job.cancel_requested else ""))
    columns[1].metric("Epoch", f"{job.epoch} / {job.total_epochs}")
    columns[2].metric("Step", f"{job.step:,} / {job.total_steps:,}" if job.total_steps else "–")
    if job.status == "running":
        columns[3].metric("ETA", duration(job.eta_seconds) or "–")
    else:
        columns[3].metric("Duration", duration(between(job.started_at, job.finished_at)) or "–")
    columns[4].metric("Attempt", f"{job.attempts} / {job.max_attempts}")
    fraction = progress_fraction(job.status, job.epoch, job.step, job.total_epochs, job.total_steps)
    st.progress(fraction, text=f"{fraction:.0%}")
    where = []
    if job.device:
        where.append(f"device {plain(job.device)}")
    if job.worker_id:
        where.append(f"worker {plain(job.worker_id)}")
    if where:
        st.caption(", ".join(where))


def show_failure(job: Job) -> None:
    if job.status == "cancelled" and job.error:
        st.info(f"Cancelled: {plain(job.error)}")
    if job.status != "failed" or not job.error:
        return
    lines = job.error.strip().splitlines()
    st.error(f"The job failed: {plain(lines[-1])}", icon=":material/error:")
    if len(lines) > 1:
        with st.expander("Traceback", expanded=True):
            st.code(job.error, language="python")


def hosts_table(engine: Engine, job: Job) -> pd.DataFrame:
    """The hosts of the job's latest attempt (db.gang), by host number. The ages are in whole
    seconds; a host whose process has not reached the start barrier has no progress time."""
    rows = members(engine, job.id, job.lease)

    def age(moment):
        seconds = since(moment)
        return None if seconds is None else max(0, round(seconds))

    return pd.DataFrame(
        {
            "host": [row.host for row in rows],
            "worker": [row.worker_id for row in rows],
            "state": [row.state for row in rows],
            "s since heartbeat": pd.array([age(row.heartbeat_at) for row in rows], "Int64"),
            "s since progress": pd.array([age(row.progress_at) for row in rows], "Int64"),
        }
    )


def show_hosts(engine: Engine, job: Job) -> None:
    """A multi-host job's hosts: who joined its latest attempt, their state, and how long
    ago each last beat and trained a step (what host 0's supervisor judges them by)."""
    if job.hosts <= 1:
        return
    table = hosts_table(engine, job)
    if not len(table):
        st.caption(f"Hosts: none of the {job.hosts} has joined an attempt yet.")
        return
    st.markdown(f"**Hosts** · {len(table)} of {job.hosts} joined the latest attempt")
    # A dataframe shows the worker ids and states as text.
    st.dataframe(table, hide_index=True, width="stretch")


# --- tags and note --------------------------------------------------------------------------


def labels_part(engine: Engine, job_id: int) -> None:
    owner = LabelsOwner(
        "job",
        job_id,
        save=lambda changes: set_labels(engine, job_id, dict(changes)),
        gone=f"Job #{job_id} no longer exists.",
        saved="Saved the tags and the note.",
    )
    labels_view.labels_part(owner, job_labels(engine, job_id))


# --- tabs --------------------------------------------------------------------------------


def curves_tab(engine: Engine, job: Job, live: LiveJob) -> None:
    if not live.series:
        st.info("No metrics yet: the worker writes the first points after its first batches.")
        return
    loss = live.get("batch/train_loss")
    if len(loss):
        beta = st.columns(3)[0].slider(
            "Smoothing",
            0.0,
            0.999,
            charts.DEFAULT_SMOOTHING,
            0.001,
            key="job.smoothing",
            help="Weight of the exponential moving average (fastai's smooth loss uses 0.98).",
        )
        st.plotly_chart(charts.batch_loss_figure(loss, beta), key="chart.batch_loss")
    panels = small_figures(live)
    for start in range(0, len(panels), 2):
        columns = st.columns(2)
        for column, (key, figure) in zip(columns, panels[start : start + 2], strict=False):
            column.plotly_chart(figure, key=f"chart.{key}")


def small_figures(live: LiveJob) -> list[tuple[str, go.Figure]]:
    """(key, figure) of the per-epoch curves, the lr schedule and the lr finder, in order."""
    figures = []
    epoch_losses = {
        label: live.get(f"epoch/{label}_loss")
        for label in ("train", "valid")
        if len(live.get(f"epoch/{label}_loss"))
    }
    if epoch_losses:
        figures.append(
            ("epoch_losses", charts.epoch_figure(epoch_losses, "Loss per epoch", "loss"))
        )
    for name in live.names("epoch/"):
        if name not in ("epoch/train_loss", "epoch/valid_loss"):
            short = name.removeprefix("epoch/")
            figures.append((name, charts.epoch_figure({short: live.get(name)}, short, short)))
    if len(live.get("batch/lr")):
        figures.append(("batch/lr", charts.lr_schedule_figure(live.get("batch/lr"))))
    if len(live.get("lr_find/loss")):
        suggestion = live.get("lr_find/suggestion")
        figure = charts.lr_find_figure(
            live.get("lr_find/lr"),
            live.get("lr_find/loss"),
            float(suggestion.mean[-1]) if len(suggestion) else None,
        )
        figures.append(("lr_find", figure))
    return figures


def xla_table(epochs: list[xla.XlaEpoch]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "epoch": [row.epoch + 1 for row in epochs],
            "compiles": [row.compiles for row in epochs],
            "compile s": [row.compile_s for row in epochs],
            "executions": [row.executes for row in epochs],
            "execute s": [row.execute_s for row in epochs],
            "to device s": [row.to_device_s for row in epochs],
            "from device s": [row.from_device_s for row in epochs],
            "device syncs": [row.device_syncs for row in epochs],
            "CPU fallback calls": [row.fallback_calls for row in epochs],
            "cache hits": [row.cache_hits for row in epochs],
            "cache misses": [row.cache_misses for row in epochs],
        }
    )


def diagnostics_tab(engine: Engine, job: Job, live: LiveJob) -> None:
    device = plain(job.device) if job.device else "not known yet (the worker reports it at start)"
    st.markdown(f"**Device:** {device}")
    diagnostics_view.input_wait_part(live)
    diagnostics_view.profile_part(engine, job)
    memory = live.get("epoch/cuda_max_memory_mb")
    if len(memory):
        st.metric("CUDA peak memory (latest epoch)", f"{memory.high[-1]:,.0f} MB")
    if not live.xla:
        if "xla" in (job.device or "").lower() or job.spec.get("device") == "xla":
            st.info("No XLA metrics report yet: the worker stores one every epoch.")
        else:
            st.caption("XLA diagnostics appear here for jobs that run on an XLA device.")
        return
    epochs = xla.per_epoch(live.xla)
    warning = xla.recompile_warning(epochs, job.spec.get("schedule"))
    if warning:
        st.warning(warning, icon=":material/warning:")
    else:
        st.success("No new XLA graphs after the warm-up epochs.")
    numbers = [row.epoch + 1 for row in epochs]  # counted from 1, as in the log
    left, right = st.columns(2)
    left.plotly_chart(
        charts.compile_figure(
            numbers, [row.compiles for row in epochs], [row.compile_s for row in epochs]
        ),
        key="chart.xla_compiles",
    )
    right.plotly_chart(
        charts.times_figure(
            numbers,
            {
                "execute": [row.execute_s for row in epochs],
                "compile": [row.compile_s for row in epochs],
                "to device": [row.to_device_s for row in epochs],
                "from device": [row.from_device_s for row in epochs],
            },
        ),
        key="chart.xla_times",
    )
    st.dataframe(xla_table(epochs), hide_index=True, width="stretch")
    cache = xla.cache_summary(epochs)
    if cache:
        st.caption(cache)
    kept = xla.kept_graphs_summary(live.xla)
    if kept:
        st.caption(kept)
    st.markdown("**Ops that fell back to the CPU** (each call leaves the XLA device)")
    fallbacks = xla.fallback_rows(live.xla)
    if fallbacks:
        st.dataframe(pd.DataFrame(fallbacks), hide_index=True, width="stretch")
    else:
        st.caption("None: every op ran on the XLA device.")
    with st.expander("Latest raw XLA metrics report"):
        st.code(live.latest_xla_raw or "(empty)", language=None)


def _log_position(job_id: int) -> int | None:
    """The id the log page shown ends below, or None for the newest lines (it follows the job)."""
    saved = st.session_state.get(LOG_PAGE_KEY)
    return saved[1] if saved and saved[0] == job_id else None


def _show_log_from(job_id: int, before_id: int | None) -> None:
    st.session_state[LOG_PAGE_KEY] = (job_id, before_id)


def _show_newer_log(engine: Engine, job_id: int, last_id: int, query: str) -> None:
    newer = log_page(engine, job_id, LOG_LINES_SHOWN, after_id=last_id, query=query)
    last_page = len(newer) < LOG_LINES_SHOWN
    _show_log_from(job_id, None if last_page else newer[-1].id + 1)


def log_tab(engine: Engine, job: Job, live: LiveJob) -> None:
    """The job's log, a page at a time, read from the database at each refresh: the newest
    page follows a running job; Older and Newer step through the rest, searched in SQL."""
    query = st.text_input(
        "Search the log",
        key="job.log_search",
        placeholder="text to find",
        on_change=_show_log_from,
        args=(job.id, None),
    )
    before_id = _log_position(job.id)
    rows = log_page(engine, job.id, LOG_LINES_SHOWN, before_id=before_id, query=query)
    if not rows:
        st.caption("No matching lines." if query else "The log is empty so far.")
        return
    total = log_line_count(engine, job.id, query)
    earlier = log_line_count(engine, job.id, query, before_id=rows[0].id)
    matching = f" matching {plain(repr(query))}" if query else ""
    st.caption(f"lines {earlier + 1:,}–{earlier + len(rows):,} of {total:,}{matching}")
    older, newer, newest = st.columns([1, 1, 4])
    older.button(
        "Older",
        key="job.log_older",
        disabled=earlier == 0,
        on_click=_show_log_from,
        args=(job.id, rows[0].id),
    )
    at_end = earlier + len(rows) == total
    newer.button(
        "Newer",
        key="job.log_newer",
        disabled=at_end,
        on_click=_show_newer_log,
        args=(engine, job.id, rows[-1].id, query),
    )
    newest.button(
        "Newest",
        key="job.log_newest",
        disabled=before_id is None,
        on_click=_show_log_from,
        args=(job.id, None),
    )
    lines = [
        f"{event.time:%Y-%m-%d %H:%M:%S} {event.level.upper():7} {event.message}" for event in rows
    ]
    st.code("\n".join(lines), language=None)


def spec_tab(engine: Engine, job: Job, live: LiveJob) -> None:
    if job.cloned_from is not None:
        st.caption(f"Cloned from job #{job.cloned_from}")
    if job.sweep_id is not None:
        st.page_link(
            SWEEPS_PAGE,
            query_params={"sweep": job.sweep_id},
            label=f"Trial {job.trial_number} of sweep #{job.sweep_id}",
            icon=":material/tune:",
        )
    st.json(job.spec)


def artifacts_tab(engine: Engine, job: Job, live: LiveJob) -> None:
    artifacts = list_artifacts(engine, job.id)
    if not artifacts:
        st.caption(
            "No files yet: the exported model appears here when the job succeeds."
            if job.status not in FINISHED_STATUSES
            else "This job left no files."
        )
    for artifact in artifacts:
        name = store.display_name(artifact.path)
        with st.container(border=True):
            st.markdown(f"**{plain(artifact.kind)}** · {plain(name)} · {size(artifact.bytes)}")
            st.markdown(f"SHA-256 {plain(artifact.sha256)}")
            # A local path (a row from before the store) may be another machine's file.
            if store.is_store_url(artifact.path) or Path(artifact.path).is_file():
                st.link_button(
                    f"Download {plain(name)}",
                    link_for(artifact.path, f"job{job.id}-{name}", artifact.sha256),
                    icon=":material/download:",
                )
            else:
                st.warning(f"The file {plain(artifact.path)} is not on this machine.")
    diagnostics_view.tensorboard_part(engine, job)


# (title, render(engine, job, live)): the job page's tabs, in order.
JOB_TABS: list[tuple[str, Callable[[Engine, Job, LiveJob], None]]] = [
    ("Curves", curves_tab),
    ("Results", lambda engine, job, _live: render_results(engine, job.id)),
    ("Diagnostics", diagnostics_tab),
    ("System", system_tab),
    ("Log", log_tab),
    ("Spec", spec_tab),
    ("Artifacts", artifacts_tab),
]


def live_part(job_id: int) -> None:
    engine = get_engine()
    try:
        job = get_job(engine, job_id)
    except JobNotFound:
        st.warning(f"Job #{job_id} no longer exists.")
        return
    live = live_state(job_id)
    live.refresh(engine)
    if st.session_state.get(DRAWN_STATUS_KEY) != (job_id, job.status):
        st.rerun(scope="app")  # the buttons and the refresh timer depend on the status
    show_progress(job)
    show_failure(job)
    show_hosts(engine, job)
    # Lazy tabs: only the open one runs. Every live refresh would otherwise rebuild every
    # tab's figures and tables, which is what limits how many people can watch at once.
    tabs = st.tabs([title for title, _ in JOB_TABS], key=TAB_KEY, on_change="rerun")
    for tab, (_, render) in zip(tabs, JOB_TABS, strict=True):
        if tab.open:
            with tab:
                render(engine, job, live)


engine = get_engine()
job_id = chosen_job_id()
if job_id is not None:
    try:
        job = get_job(engine, job_id)
    except JobNotFound:
        st.warning(f"There is no job #{job_id}.")
        st.stop()
    st.session_state[DRAWN_STATUS_KEY] = (job.id, job.status)
    st.title(f"#{job.id} · {plain(job.name)}")
    actions.show_flashes()
    labels_part(engine, job.id)
    actions.render_buttons(engine, job.id, job.status, job.spec, key="job")
    refresh = None if job.status in FINISHED_STATUSES else REFRESH_S
    st.fragment(run_every=refresh)(live_part)(job.id)

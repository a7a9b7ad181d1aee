"""Sweeps: every sweep, and for one (?sweep=ID) its trials with their values, state and
objective, the best trial, a parallel-coordinates plot of values → objective, the objective
by trial and against each field, and Optuna's parameter importances; redrawn while the sweep
runs. A sweep is started with the New sweep form (`dashboard.sweep_form`), `python -m db sweep
submit FILE` or the API."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import actions, charts, labels_view, sweep_form
from dashboard.format import number, plain
from dashboard.labels_view import LabelsOwner
from dashboard.nav import COMPARE_PAGE, JOB_PAGE
from dashboard.state import get_engine
from db import sweeps
from db.engine import Engine
from db.spec import Labels

REFRESH_S = 5


def chosen_sweep(listed: list) -> int:
    """The sweep named in the address (?sweep=ID) when listed, else the newest."""
    ids = [sweep.id for sweep in listed]
    named = st.query_params.get("sweep", "")
    default = int(named) if named.isdigit() and int(named) in ids else ids[0]
    by_id = {sweep.id: sweep for sweep in listed}
    chosen = st.selectbox(
        "Sweep",
        ids,
        index=ids.index(default),
        format_func=lambda i: f"#{i} · {by_id[i].name} · {by_id[i].status}",
    )
    st.query_params["sweep"] = str(chosen)
    return chosen


def shown(value: object) -> str:
    """A trial's value as the table shows it: floats to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def trials_table(summary: sweeps.SweepSummary) -> None:
    metric = summary.spec.metric
    frame = pd.DataFrame(
        {
            "trial": [row.number for row in summary.trials],
            "job": [f"job?job={row.job_id}" for row in summary.trials],
            "status": [row.status for row in summary.trials],
            metric: [row.objective for row in summary.trials],
            "epochs reported": [row.epochs_reported for row in summary.trials],
        }
    )
    values = pd.DataFrame(
        [{field: shown(value) for field, value in row.params.items()} for row in summary.trials]
    )
    st.dataframe(
        pd.concat([frame, values], axis=1),
        column_config={"job": st.column_config.LinkColumn(display_text=r"job\?job=(\d+)")},
        hide_index=True,
        width="stretch",
    )
    st.caption(f"{metric}: a finished trial's objective; for the others, the newest epoch's value.")


def charts_of(summary: sweeps.SweepSummary) -> None:
    rows = [row for row in summary.trials if row.objective is not None]
    if not rows:
        st.caption("The charts appear once a trial has reported its first epoch.")
        return
    metric = summary.spec.metric
    params = {p.field: [row.params[p.field] for row in rows] for p in summary.spec.space}
    log_fields = {p.field for p in summary.spec.space if p.kind == "log_uniform" or p.log}
    objective = [float(row.objective) for row in rows]  # type: ignore[arg-type]
    left, right = st.columns(2)
    left.plotly_chart(
        charts.parallel_coordinates_figure(params, log_fields, objective, metric),
        key="sweep.parallel",
    )
    right.plotly_chart(
        charts.objective_by_trial_figure(
            [row.number for row in rows], objective, [row.status for row in rows], metric
        ),
        key="sweep.by_trial",
    )
    left, right = st.columns(2)
    field = left.selectbox("Objective against", list(params), key="sweep.field")
    left.plotly_chart(
        charts.objective_by_value_figure(
            field, params[field], objective, field in log_fields, metric
        ),
        key="sweep.by_value",
    )
    database = get_engine().url.render_as_string(hide_password=True)
    importances = cached_importances(database, summary.sweep.id, finished_trials(summary))
    if importances:
        right.plotly_chart(charts.importance_figure(importances), key="sweep.importance")
    else:
        right.caption("Parameter importances appear once two trials with different values "
                      "have finished.")  # fmt: skip


def finished_trials(summary: sweeps.SweepSummary) -> int:
    return sum(row.final for row in summary.trials)


@st.cache_data(max_entries=64, show_spinner=False)
def cached_importances(database: str, sweep_id: int, finished: int) -> dict[str, float]:
    """Optuna's importances, computed again only when another trial has finished (the
    arguments are the cache's key)."""
    return sweeps.importances(get_engine(), sweep_id)


def sweep_view(sweep_id: int) -> None:
    summary = sweeps.summary(get_engine(), sweep_id)
    spec, sweep = summary.spec, summary.sweep
    done = sum(row.status not in sweeps.ACTIVE_STATUSES for row in summary.trials)
    best = summary.best
    pruned = sum(row.status == "pruned" for row in summary.trials)
    columns = st.columns(4)
    columns[0].metric("Status", sweep.status)
    columns[1].metric("Trials ended", f"{done} of {spec.trials}")
    columns[2].metric("Pruned", pruned)
    columns[3].metric(f"Best {spec.metric}", number(best.objective) if best else "–")
    st.caption(
        f"{spec.direction.capitalize()} {spec.metric}, {spec.sampler} sampler, "
        f"{spec.pruner} pruner, at most {spec.max_concurrent} trial(s) at once. Each trial is "
        "a job; a pruned trial keeps its curves and last checkpoint."
    )
    if best is not None:
        st.page_link(
            JOB_PAGE,
            query_params={"job": best.job_id},
            label=f"Best: trial {best.number} (job #{best.job_id}), {spec.metric} "
            f"{number(best.objective)}",
            icon=":material/emoji_events:",
        )
    if summary.trials:
        st.page_link(
            COMPARE_PAGE,
            query_params={"jobs": ",".join(str(row.job_id) for row in summary.trials[:50])},
            label="Compare the trials side by side",
            icon=":material/compare_arrows:",
        )
    trials_table(summary)
    charts_of(summary)


def labels_part(engine: Engine, sweep_id: int) -> None:
    sweep = sweeps.get_sweep(engine, sweep_id)
    owner = LabelsOwner(
        "sweep",
        sweep_id,
        save=lambda changes: sweeps.set_labels(engine, sweep_id, changes),
        gone=f"Sweep #{sweep_id} no longer exists.",
        saved="Saved the sweep's tags and note.",
        edit_label="Edit the sweep's tags and note",
    )
    labels_view.labels_part(owner, Labels(tags=sweep.tags, note=sweep.note))


st.title("Sweeps")
actions.show_flashes()
listed = sweeps.list_sweeps(get_engine())
opened = not listed or bool(st.session_state.get(sweep_form.PROBLEMS_KEY))
with st.expander("New sweep", icon=":material/add:", expanded=opened):
    sweep_form.new_sweep_form(get_engine())
if not listed:
    st.info(
        "No sweeps yet. Start one with the form above, or write a definition (base spec, "
        "space, objective, trials) and submit it with `python -m db sweep submit FILE` "
        "(YAML or JSON)."
    )
    st.stop()
sweep_id = chosen_sweep(listed)
chosen = next(sweep for sweep in listed if sweep.id == sweep_id)
# Redrawn while trials run, a cancelled sweep's too until its last trial has stopped.
running = chosen.status == "running" or chosen.finished_at is None
st.markdown(f"**{plain(chosen.name)}**")
labels_part(get_engine(), sweep_id)
st.fragment(run_every=REFRESH_S if running else None)(sweep_view)(sweep_id)

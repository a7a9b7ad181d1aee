"""Plotly figures for the job and compare pages, built from `db.series.Buckets`.

A bucket of many points is drawn as its min/max envelope (two points per bucket), so a spike
stays visible however many points were merged; a bucket of one is drawn as its point.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.format import chart_text
from db.series import Buckets

DEFAULT_SMOOTHING = 0.9
RAW_COLOR = "rgba(99, 110, 250, 0.45)"
SMOOTH_COLOR = "rgb(99, 110, 250)"
HEIGHT = 320


def envelope(series: Buckets) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of a line through every bucket's min and max, in step order.

    Neighbouring buckets alternate min-then-max and max-then-min, so the line goes up and
    down once per bucket instead of jumping back across it.
    """
    n = len(series)
    if n == 0:
        return np.empty(0), np.empty(0)
    rising = np.arange(n) % 2 == 0
    x = np.column_stack([series.first_step, series.last_step]).ravel()
    first_y = np.where(rising, series.low, series.high)
    second_y = np.where(rising, series.high, series.low)
    y = np.column_stack([first_y, second_y]).ravel()
    keep = np.ones(2 * n, dtype=bool)
    keep[1::2] = series.count > 1  # a single point is drawn once
    return x[keep], y[keep]


def smoothed(series: Buckets, beta: float = DEFAULT_SMOOTHING) -> np.ndarray:
    """The debiased exponential moving average fastai shows as its smooth loss.

    A bucket of `count` points enters with its mean and the weight `count` steps would have,
    so the curve is exact for points and close to exact for buckets.
    """
    means = series.mean
    decay = beta ** series.count.astype(np.float64)
    result = np.empty(len(series))
    average = 0.0
    weight = 0.0
    for index, (mean, keep) in enumerate(zip(means, decay, strict=True)):
        average = keep * average + (1.0 - keep) * mean
        weight = keep * weight + (1.0 - keep)
        result[index] = average / weight if weight > 0 else mean
    return result


def _centres(series: Buckets) -> np.ndarray:
    return (series.first_step + series.last_step) / 2.0


def _layout(title: str, x_title: str, y_title: str, **extra: Any) -> dict[str, Any]:
    """The layout every chart shares, as one dict for the Figure constructor: plotly validates
    it once there, where update_layout/update_xaxes cost about 10 ms a figure, which adds up
    with several charts per page refreshed every 2 s for every person watching."""
    layout = {
        "title": {"text": title, "font": {"size": 14}},
        "height": HEIGHT,
        "margin": {"l": 10, "r": 10, "t": 40, "b": 10},
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 1, "xanchor": "right"},
        "hovermode": "x unified",
        "uirevision": "keep",  # keep the person's zoom when the figure is redrawn with new points
        "xaxis": {"title": {"text": x_title}},
        "yaxis": {"title": {"text": y_title}},
    }
    layout.update(extra)
    return layout


def describe_drawing(series: Buckets) -> str:
    if series.is_raw:
        return f"{series.point_count:,} points"
    return f"{series.point_count:,} points, drawn as the min/max of {len(series):,} buckets"


def batch_loss_figure(series: Buckets, beta: float = DEFAULT_SMOOTHING) -> go.Figure:
    x, y = envelope(series)
    traces = [go.Scatter(x=x, y=y, mode="lines", name="raw", line={"color": RAW_COLOR, "width": 1})]
    if beta > 0:
        traces.append(
            go.Scatter(
                x=_centres(series),
                y=smoothed(series, beta),
                mode="lines",
                name=f"smoothed ({beta:g})",
                line={"color": SMOOTH_COLOR, "width": 2},
            )
        )
    title = f"Train loss per batch · {describe_drawing(series)}"
    return go.Figure(traces, layout=_layout(title, "step", "loss"))


def epoch_figure(lines: Mapping[str, Buckets], title: str, y_title: str) -> go.Figure:
    """One line per per-epoch series (several jobs, or train and valid of one job).

    Epoch metrics are stored under the epoch's index, counted from 0; the axis counts epochs
    from 1, as the job's progress, its log and the worker's messages do.
    """
    traces = []
    last_epoch = 1
    for label, series in lines.items():
        x, y = envelope(series)
        traces.append(go.Scatter(x=x + 1, y=y, mode="lines+markers", name=label))
        if len(x):
            last_epoch = max(last_epoch, int(x.max()) + 1)
    layout = _layout(title, "epoch", y_title)
    # Whole epochs only, about ten ticks at most (plotly's own ticks would show 0.5, 1.5, ...).
    layout["xaxis"].update(tick0=1, dtick=max(1, math.ceil(last_epoch / 10)))
    return go.Figure(traces, layout=layout)


def smoothed_lines_figure(
    lines: Mapping[str, Buckets], title: str, beta: float = DEFAULT_SMOOTHING
) -> go.Figure:
    """Several jobs' batch losses, each as its smoothed line."""
    traces = [
        go.Scatter(x=_centres(series), y=smoothed(series, beta), mode="lines", name=label)
        for label, series in lines.items()
    ]
    return go.Figure(traces, layout=_layout(title, "step", "loss"))


def lr_schedule_figure(series: Buckets) -> go.Figure:
    x, y = envelope(series)
    trace = go.Scatter(x=x, y=y, mode="lines", name="learning rate")
    return go.Figure(trace, layout=_layout("Learning-rate schedule", "step", "learning rate"))


def lr_find_figure(lrs: Buckets, losses: Buckets, suggestion: float | None) -> go.Figure:
    """Loss against learning rate (log scale), with the suggested rate marked."""
    by_step = dict(zip(lrs.first_step.tolist(), lrs.mean.tolist(), strict=True))
    pairs = [
        (by_step[step], loss)
        for step, loss in zip(losses.first_step.tolist(), losses.mean.tolist(), strict=True)
        if step in by_step and by_step[step] > 0
    ]
    traces = []
    if pairs:
        x, y = zip(*pairs, strict=True)
        traces.append(go.Scatter(x=x, y=y, mode="lines", name="loss"))
    layout = _layout("Learning-rate finder", "learning rate (log)", "loss")
    layout["xaxis"]["type"] = "log"
    figure = go.Figure(traces, layout=layout)
    if suggestion:
        figure.add_vline(
            x=suggestion,
            line_dash="dash",
            line_color="firebrick",
            annotation_text=f"suggestion {suggestion:.2e}",
        )
    return figure


def compile_figure(epochs: Sequence[int], compiles: Sequence[float], seconds: Sequence[float]):
    """XLA compiles (bars) and compile seconds (line) per epoch."""
    traces = [
        go.Bar(x=list(epochs), y=list(compiles), name="compiles"),
        go.Scatter(
            x=list(epochs),
            y=list(seconds),
            name="compile time (s)",
            mode="lines+markers",
            yaxis="y2",
        ),
    ]
    seconds_axis = {"title": {"text": "seconds"}, "overlaying": "y", "side": "right"}
    layout = _layout(
        "XLA compiles per epoch", "epoch", "compiles", hovermode="x", yaxis2=seconds_axis
    )
    return go.Figure(traces, layout=layout)


def times_figure(epochs: Sequence[int], times: Mapping[str, Sequence[float]]) -> go.Figure:
    """Grouped bars of seconds per epoch (execute, compile, transfers)."""
    traces = [go.Bar(x=list(epochs), y=list(values), name=label) for label, values in times.items()]
    layout = _layout("XLA time per epoch", "epoch", "seconds", barmode="group", hovermode="x")
    return go.Figure(traces, layout=layout)


def time_figure(
    lines: Mapping[str, Buckets], origin: datetime, title: str, y_title: str
) -> go.Figure:
    """One line per series whose steps are seconds since `origin` (a job's `sys/` metrics,
    step = seconds since the job was submitted), drawn against the clock (UTC)."""
    traces = []
    for label, series in lines.items():
        x, y = envelope(series)
        when = pd.Timestamp(origin) + pd.to_timedelta(x, unit="s")
        traces.append(go.Scatter(x=when, y=y, mode="lines", name=label))
    return go.Figure(traces, layout=_layout(title, "time (UTC)", y_title))


# --- sweeps ---------------------------------------------------------------------------------


def _dimension(label: str, values: Sequence[Any], log: bool) -> dict[str, Any]:
    """One axis of a parallel-coordinates plot: numbers as they are (log10 on a log range),
    anything else as one tick per distinct value, its text escaped."""
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        if log:
            return {"label": f"log10 {label}", "values": [math.log10(v) for v in values]}
        return {"label": label, "values": list(values)}
    kinds = sorted({str(v) for v in values})
    return {
        "label": label,
        "values": [kinds.index(str(v)) for v in values],
        "tickvals": list(range(len(kinds))),
        "ticktext": [chart_text(kind) for kind in kinds],
    }


def parallel_coordinates_figure(
    params: Mapping[str, Sequence[Any]],
    log_fields: set[str],
    objective: Sequence[float],
    metric: str,
) -> go.Figure:
    """Each trial a line through its values of the varied fields to its objective."""
    dimensions = [_dimension(f, values, f in log_fields) for f, values in params.items()]
    dimensions.append({"label": metric, "values": list(objective)})
    line = {"color": list(objective), "colorscale": "Viridis", "showscale": True}
    layout = _layout(f"{metric} by the values of each trial", "", "", hovermode=False)
    layout["margin"] = {"l": 60, "r": 40, "t": 100, "b": 20}  # room for the axes' names
    return go.Figure(go.Parcoords(dimensions=dimensions, line=line), layout=layout)


def objective_by_trial_figure(
    trials: Sequence[int], objective: Sequence[float], states: Sequence[str], metric: str
) -> go.Figure:
    """The objective of each trial by its number, one marker colour per state."""
    # Whole trial numbers only, about ten ticks at most.
    xaxis = {"title": {"text": "trial"}, "tick0": 0, "dtick": max(1, (max(trials) + 1) // 10)}
    layout = _layout(f"{metric} by trial", "trial", metric, hovermode="closest", xaxis=xaxis)
    figure = go.Figure(layout=layout)
    for state in sorted(set(states)):
        chosen = [i for i, s in enumerate(states) if s == state]
        figure.add_trace(
            go.Scatter(
                x=[trials[i] for i in chosen],
                y=[objective[i] for i in chosen],
                mode="markers",
                name=state,
                marker={"size": 9},
            )
        )
    return figure


def importance_figure(importances: Mapping[str, float]) -> go.Figure:
    """Each varied field's share of the objective's variation (Optuna's importances)."""
    fields = list(importances)[::-1]  # the largest on top
    layout = _layout("Parameter importance", "importance", "", hovermode="closest")
    bars = go.Bar(
        x=[importances[f] for f in fields],
        y=[chart_text(f) for f in fields],
        orientation="h",
    )
    return go.Figure(bars, layout=layout)


def objective_by_value_figure(
    field: str, values: Sequence[Any], objective: Sequence[float], log: bool, metric: str
) -> go.Figure:
    """The objective of each trial against its value of one field."""
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    shown = list(values) if numeric else [chart_text(v) for v in values]
    xaxis = {"title": {"text": chart_text(field)}, "type": "log" if log and numeric else "-"}
    layout = _layout(f"{metric} by {field}", field, metric, hovermode="closest", xaxis=xaxis)
    return go.Figure(go.Scatter(x=shown, y=list(objective), mode="markers"), layout=layout)

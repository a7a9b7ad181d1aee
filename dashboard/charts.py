"""Plotly figures for the job and compare pages, built from `db.series.Buckets`.

A bucket of many points is drawn as its min/max envelope (two points per bucket), so a spike
stays visible however many points were merged; a bucket of one is drawn as its point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

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


def _layout(figure: go.Figure, title: str, x_title: str, y_title: str) -> go.Figure:
    figure.update_layout(
        title={"text": title, "font": {"size": 14}},
        height=HEIGHT,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 1, "xanchor": "right"},
        hovermode="x unified",
        uirevision="keep",  # keep the person's zoom when the figure is redrawn with new points
    )
    figure.update_xaxes(title_text=x_title)
    figure.update_yaxes(title_text=y_title)
    return figure


def describe_drawing(series: Buckets) -> str:
    if series.is_raw:
        return f"{series.point_count:,} points"
    return f"{series.point_count:,} points, drawn as the min/max of {len(series):,} buckets"


def batch_loss_figure(series: Buckets, beta: float = DEFAULT_SMOOTHING) -> go.Figure:
    x, y = envelope(series)
    figure = go.Figure()
    figure.add_trace(
        go.Scatter(x=x, y=y, mode="lines", name="raw", line={"color": RAW_COLOR, "width": 1})
    )
    if beta > 0:
        figure.add_trace(
            go.Scatter(
                x=_centres(series),
                y=smoothed(series, beta),
                mode="lines",
                name=f"smoothed ({beta:g})",
                line={"color": SMOOTH_COLOR, "width": 2},
            )
        )
    return _layout(figure, f"Train loss per batch · {describe_drawing(series)}", "step", "loss")


def line_figure(
    lines: Mapping[str, Buckets], title: str, x_title: str, y_title: str, markers: bool = True
) -> go.Figure:
    """One line per series (several jobs, or train and valid of one job)."""
    figure = go.Figure()
    for label, series in lines.items():
        x, y = envelope(series)
        figure.add_trace(
            go.Scatter(x=x, y=y, mode="lines+markers" if markers else "lines", name=label)
        )
    return _layout(figure, title, x_title, y_title)


def smoothed_lines_figure(
    lines: Mapping[str, Buckets], title: str, beta: float = DEFAULT_SMOOTHING
) -> go.Figure:
    """Several jobs' batch losses, each as its smoothed line."""
    figure = go.Figure()
    for label, series in lines.items():
        figure.add_trace(
            go.Scatter(x=_centres(series), y=smoothed(series, beta), mode="lines", name=label)
        )
    return _layout(figure, title, "step", "loss")


def lr_schedule_figure(series: Buckets) -> go.Figure:
    x, y = envelope(series)
    figure = go.Figure(go.Scatter(x=x, y=y, mode="lines", name="learning rate"))
    return _layout(figure, "Learning-rate schedule", "step", "learning rate")


def lr_find_figure(lrs: Buckets, losses: Buckets, suggestion: float | None) -> go.Figure:
    """Loss against learning rate (log scale), with the suggested rate marked."""
    by_step = dict(zip(lrs.first_step.tolist(), lrs.mean.tolist(), strict=True))
    pairs = [
        (by_step[step], loss)
        for step, loss in zip(losses.first_step.tolist(), losses.mean.tolist(), strict=True)
        if step in by_step and by_step[step] > 0
    ]
    figure = go.Figure()
    if pairs:
        x, y = zip(*pairs, strict=True)
        figure.add_trace(go.Scatter(x=x, y=y, mode="lines", name="loss"))
    if suggestion:
        figure.add_vline(
            x=suggestion,
            line_dash="dash",
            line_color="firebrick",
            annotation_text=f"suggestion {suggestion:.2e}",
        )
    figure.update_xaxes(type="log")
    return _layout(figure, "Learning-rate finder", "learning rate (log)", "loss")


def compile_figure(epochs: Sequence[int], compiles: Sequence[float], seconds: Sequence[float]):
    """XLA compiles (bars) and compile seconds (line) per epoch."""
    figure = make_subplots(specs=[[{"secondary_y": True}]])
    figure.add_trace(go.Bar(x=list(epochs), y=list(compiles), name="compiles"), secondary_y=False)
    figure.add_trace(
        go.Scatter(x=list(epochs), y=list(seconds), name="compile time (s)", mode="lines+markers"),
        secondary_y=True,
    )
    figure.update_yaxes(title_text="compiles", secondary_y=False)
    figure.update_yaxes(title_text="seconds", secondary_y=True)
    _layout(figure, "XLA compiles per epoch", "epoch", "compiles")
    figure.update_layout(hovermode="x")
    return figure


def times_figure(epochs: Sequence[int], times: Mapping[str, Sequence[float]]) -> go.Figure:
    """Grouped bars of seconds per epoch (execute, compile, transfers)."""
    figure = go.Figure()
    for label, values in times.items():
        figure.add_trace(go.Bar(x=list(epochs), y=list(values), name=label))
    figure.update_layout(barmode="group")
    _layout(figure, "XLA time per epoch", "epoch", "seconds")
    figure.update_layout(hovermode="x")
    return figure

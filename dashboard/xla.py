"""Per-epoch XLA figures from a job's reports, whose counters are cumulative.

A worker stores a report every epoch (and on a timer); each holds counters since its process
started (see `db.telemetry`). An epoch's figure is its last report minus the previous epoch's
last report. A counter that went down means a new process (a retried job): it starts from 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

COUNTERS = {
    "compiles": "compile_count",
    "compile_s": "compile_time_s",
    "executes": "execute_count",
    "execute_s": "execute_time_s",
    "to_device_s": "transfer_to_device_time_s",
    "from_device_s": "transfer_from_device_time_s",
    "device_syncs": "device_syncs",
}


@dataclass(frozen=True)
class XlaEpoch:
    epoch: int
    compiles: float
    compile_s: float
    executes: float
    execute_s: float
    to_device_s: float
    from_device_s: float
    device_syncs: float
    fallback_calls: float


def _number(summary: Mapping[str, Any], key: str) -> float:
    value = summary.get(key)
    return float(value) if isinstance(value, int | float) else 0.0


def _fallbacks(summary: Mapping[str, Any]) -> dict[str, float]:
    raw = summary.get("aten_fallbacks")
    if not isinstance(raw, Mapping):
        return {}
    return {str(op): float(count) for op, count in raw.items() if isinstance(count, int | float)}


def _growth(current: float, previous: float) -> float:
    return current - previous if current >= previous else current


def last_report_per_epoch(reports: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[int, Mapping]:
    """epoch → the summary of its last report, from (epoch, summary) pairs in report order."""
    last: dict[int, Mapping[str, Any]] = {}
    for epoch, summary in reports:
        last[epoch] = summary
    return dict(sorted(last.items()))


def per_epoch(reports: Sequence[tuple[int, Mapping[str, Any]]]) -> list[XlaEpoch]:
    rows = []
    previous: Mapping[str, Any] = {}
    for epoch, summary in last_report_per_epoch(reports).items():
        growth = {
            field: _growth(_number(summary, key), _number(previous, key))
            for field, key in COUNTERS.items()
        }
        before = _fallbacks(previous)
        fallback_calls = sum(
            _growth(count, before.get(op, 0.0)) for op, count in _fallbacks(summary).items()
        )
        rows.append(XlaEpoch(epoch=epoch, fallback_calls=fallback_calls, **growth))
        previous = summary
    return rows


def first_stable_epoch(schedule: str | None) -> int:
    """The first epoch that should compile nothing new.

    The first epoch compiles the training and validation graphs; fine_tune trains a frozen
    body for one epoch and then unfreezes it, which is a new graph in its second epoch.
    """
    return 2 if schedule == "fine_tune" else 1


def recompile_warning(epochs: Sequence[XlaEpoch], schedule: str | None) -> str | None:
    """A sentence when graphs keep compiling after the first epoch(s), else None."""
    stable_from = first_stable_epoch(schedule)
    growing = [row for row in epochs if row.epoch >= stable_from and row.compiles > 0]
    if not growing:
        return None
    listed = ", ".join(f"{row.compiles:.0f} in epoch {row.epoch}" for row in growing[:6])
    more = f" and {len(growing) - 6} more epochs" if len(growing) > 6 else ""
    return (
        f"XLA keeps compiling new graphs after the first epoch: {listed}{more}. "
        "Every compile stalls training. Usual causes: tensor shapes that change between batches "
        "(a last partial batch, images of different sizes), Python values that change each "
        "step baked into the graph, or a `.item()`/print forcing a sync mid-step."
    )


def fallback_rows(reports: Sequence[tuple[int, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Ops that fell back to the CPU: total calls, and calls in the latest epoch."""
    last = list(last_report_per_epoch(reports).values())
    if not last:
        return []
    latest = _fallbacks(last[-1])
    before = _fallbacks(last[-2]) if len(last) > 1 else {}
    rows = [
        {"op": op, "calls": count, "calls in latest epoch": _growth(count, before.get(op, 0.0))}
        for op, count in latest.items()
    ]
    return sorted(rows, key=lambda row: (-row["calls"], row["op"]))

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
    "cache_hits": "persistent_cache_hits",
    "cache_misses": "persistent_cache_misses",
    "cache_load_failures": "persistent_cache_load_failures",
}


WARM_UP_EPOCHS = 2


@dataclass(frozen=True)
class XlaEpoch:
    epoch: int  # as stored, counted from 0; shown to people counted from 1
    process_epoch: int  # counted from the first epoch of the process that trained it
    compiles: float
    compile_s: float
    executes: float
    execute_s: float
    to_device_s: float
    from_device_s: float
    device_syncs: float
    fallback_calls: float
    # The persistent compilation cache: graphs loaded instead of compiled, graphs compiled and
    # stored, and graphs found but not loadable (torch_xla 2.8 and 2.9 load none back,
    # pytorch/xla#9094).
    cache_hits: float = 0.0
    cache_misses: float = 0.0
    cache_load_failures: float = 0.0


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
    process_epoch = 0
    for epoch, summary in last_report_per_epoch(reports).items():
        if _number(summary, "compile_count") < _number(previous, "compile_count"):
            process_epoch = 0  # the counters restarted: a new process took the job on
        growth = {
            field: _growth(_number(summary, key), _number(previous, key))
            for field, key in COUNTERS.items()
        }
        before = _fallbacks(previous)
        fallback_calls = sum(
            _growth(count, before.get(op, 0.0)) for op, count in _fallbacks(summary).items()
        )
        rows.append(
            XlaEpoch(
                epoch=epoch, process_epoch=process_epoch, fallback_calls=fallback_calls, **growth
            )
        )
        previous = summary
        process_epoch += 1
    return rows


def is_warm_up(row: XlaEpoch, schedule: str | None) -> bool:
    """Whether new compiles are expected in this epoch.

    A process compiles the step and evaluation graphs in its first epoch, and XLA was seen to
    compile one more evaluation graph in its second (the worker's measurement, see
    `worker/xla_report.py`). fine_tune trains a frozen body in epoch 0 and unfreezes it: new
    graphs in epoch 1, and that phase's extra evaluation graph in epoch 2.
    """
    if row.process_epoch < WARM_UP_EPOCHS:
        return True
    return schedule == "fine_tune" and row.epoch <= WARM_UP_EPOCHS


def recompile_warning(epochs: Sequence[XlaEpoch], schedule: str | None) -> str | None:
    """A sentence when graphs keep compiling after the warm-up epochs, else None."""
    growing = [row for row in epochs if row.compiles > 0 and not is_warm_up(row, schedule)]
    if not growing:
        return None
    listed = ", ".join(f"{row.compiles:.0f} in epoch {row.epoch + 1}" for row in growing[:6])
    more = f" and {len(growing) - 6} more epochs" if len(growing) > 6 else ""
    return (
        f"XLA keeps compiling new graphs after the warm-up epochs: {listed}{more}. "
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


def cache_summary(epochs: Sequence[XlaEpoch]) -> str | None:
    """One sentence on the persistent compilation cache over the job's epochs, or None when
    the reports do not count its lookups (a worker older than these counters)."""
    hits = sum(row.cache_hits for row in epochs)
    misses = sum(row.cache_misses for row in epochs)
    failures = sum(row.cache_load_failures for row in epochs)
    lookups = hits + misses + failures
    if lookups == 0:
        return None
    sentence = (
        f"Compilation cache: {hits:.0f} of {lookups:.0f} graphs loaded from the cache, "
        f"{misses:.0f} compiled and stored in it"
    )
    if failures:
        sentence += (
            f"; {failures:.0f} found in the cache but not loadable by this XLA backend "
            "(torch_xla 2.8 and 2.9 cannot load cached executables: pytorch/xla#9094), so "
            "compiled again"
        )
    return sentence + "."


def kept_graphs_summary(reports: Sequence[tuple[int, Mapping[str, Any]]]) -> str | None:
    """One sentence when the job ran in a worker process that had trained a job with the same
    graphs before it (the latest attempt's reports say so), else None."""
    last = list(last_report_per_epoch(reports).values())
    latest = last[-1] if last else {}
    source = latest.get("graphs_kept_from_job")
    if not isinstance(source, int) or "graphs_kept" not in latest:
        return None
    return (
        f"Graphs kept from job {source}: this job ran in the worker process that trained job "
        f"{source} before it, with {_number(latest, 'graphs_kept'):.0f} compiled graphs in "
        f"memory; this job compiled {_number(latest, 'compile_count'):.0f} of its own."
    )

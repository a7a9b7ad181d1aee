"""Per-epoch figures from a job's XLA reports, whose counters are cumulative.

A worker stores a report every epoch (and on a timer); each holds counters since its process
started (see `db.telemetry`). An epoch's figure is its last report minus the previous epoch's
last report. A counter that went down means a new process (a retried job): it starts from 0.
The dashboard's Diagnostics tab (`dashboard.xla`) and the TensorBoard export read them here.
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


def counter(summary: Mapping[str, Any], key: str) -> float:
    value = summary.get(key)
    return float(value) if isinstance(value, int | float) else 0.0


def fallback_counts(summary: Mapping[str, Any]) -> dict[str, float]:
    raw = summary.get("aten_fallbacks")
    if not isinstance(raw, Mapping):
        return {}
    return {str(op): float(count) for op, count in raw.items() if isinstance(count, int | float)}


def counter_growth(current: float, previous: float) -> float:
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
        if counter(summary, "compile_count") < counter(previous, "compile_count"):
            process_epoch = 0  # the counters restarted: a new process took the job on
        growth = {
            field: counter_growth(counter(summary, key), counter(previous, key))
            for field, key in COUNTERS.items()
        }
        before = fallback_counts(previous)
        fallback_calls = sum(
            counter_growth(count, before.get(op, 0.0))
            for op, count in fallback_counts(summary).items()
        )
        rows.append(
            XlaEpoch(
                epoch=epoch, process_epoch=process_epoch, fallback_calls=fallback_calls, **growth
            )
        )
        previous = summary
        process_epoch += 1
    return rows

"""The words and tables of the Diagnostics tab from a job's XLA reports; the per-epoch figures
themselves come from `db.xla_epochs` (the TensorBoard export reads them too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from db.xla_epochs import (
    XlaEpoch,
    counter,
    counter_growth,
    fallback_counts,
    last_report_per_epoch,
    per_epoch,
)

__all__ = ["XlaEpoch", "per_epoch"]  # besides this module's own words: the figures it words

WARM_UP_EPOCHS = 1


def is_warm_up(row: XlaEpoch, schedule: str | None) -> bool:
    """Whether new compiles are expected in this epoch.

    A process compiles the step and evaluation graphs in its first epoch (the worker's
    measurement, see `worker/xla_report.py`), and none after it. fine_tune trains a frozen
    body in epoch 0 and unfreezes it: new graphs in epoch 1 too.
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
    latest = fallback_counts(last[-1])
    before = fallback_counts(last[-2]) if len(last) > 1 else {}
    rows = [
        {
            "op": op,
            "calls": count,
            "calls in latest epoch": counter_growth(count, before.get(op, 0.0)),
        }
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
        f"{source} before it, with {counter(latest, 'graphs_kept'):.0f} compiled graphs in "
        f"memory; this job compiled {counter(latest, 'compile_count'):.0f} of its own."
    )

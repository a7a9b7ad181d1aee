"""Read torch_xla's metrics (compiles, executions, transfers, CPU fallbacks) into a summary.

Reading the metrics is host-side bookkeeping: it never makes the device compute. It waits for
executions already dispatched to finish (`read_summary` says why), which at an epoch's end,
after the host has read the epoch's losses, costs nothing.
"""

from __future__ import annotations

from typing import Any

NANOSECONDS = 1e9
FRESH_PROCESS_SEED = 101  # xm.get_rng_state() in a new process (seen with torch_xla 2.9)

# torch_xla metric → (count key, seconds key). Several metrics may add up into one pair: under
# SPMD a graph runs as `ExecuteReplicated` (once over every device) instead of `Execute`.
TIME_METRICS = {
    "CompileTime": ("compile_count", "compile_time_s"),
    "ExecuteTime": ("execute_count", "execute_time_s"),
    "ExecuteReplicatedTime": ("execute_count", "execute_time_s"),
    "TransferToDeviceTime": ("transfer_to_device_count", "transfer_to_device_time_s"),
    "TransferFromDeviceTime": ("transfer_from_device_count", "transfer_from_device_time_s"),
}
COUNTERS = {
    "CachedCompile": "cached_compile",
    "UncachedCompile": "uncached_compile",
    "PersistentCacheHit": "persistent_cache_hits",
    "PersistentCacheMiss": "persistent_cache_misses",
    "PersistentCacheDeserializeFailure": "persistent_cache_load_failures",
    "ExecuteComputation": "device_syncs",
    "ExecuteReplicated": "device_syncs",
    "TransferFromDevice": "transfers_from_device",
}


def read_summary() -> dict[str, Any]:
    """Cumulative counters since this process started (keys: see db/telemetry.py).

    An execution is counted twice, at different moments: `ExecuteComputation` /
    `ExecuteReplicated` when it is dispatched, its `Execute*Time` sample when the device is
    done with it (a callback on another thread, which can run after the host already read the
    result). Read in between, the summary has one more device sync than executions (seen on
    the CPU backend: 47 of 2,000 reads taken right after a step's `.item()`, none after
    `wait_device_ops`), so it waits for the dispatched executions first.
    """
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    xm.wait_device_ops()
    summary: dict[str, Any] = {}
    for metric, (count_key, time_key) in TIME_METRICS.items():
        data = met.metric_data(metric)
        count, total_ns = (data[0], data[1]) if data else (0, 0.0)
        summary[count_key] = summary.get(count_key, 0) + int(count)
        summary[time_key] = summary.get(time_key, 0.0) + float(total_ns) / NANOSECONDS
    counter_names = set(met.counter_names())
    for counter, key in COUNTERS.items():
        value = int(met.counter_value(counter) or 0) if counter in counter_names else 0
        summary[key] = summary.get(key, 0) + value
    summary["aten_fallbacks"] = {
        name.removeprefix("aten::"): int(met.counter_value(name) or 0)
        for name in sorted(counter_names)
        if name.startswith("aten::")
    }
    return summary


def read_raw_report() -> str:
    import torch_xla.debug.metrics as met

    return met.metrics_report()


def compile_growth_warning(
    epoch: int, warm_up: bool, previous: dict[str, Any] | None, current: dict[str, Any]
) -> str | None:
    """A warning when graphs were compiled during global epoch `epoch` (0-based), unless it is
    a `warm_up` epoch: the first this process trained with its current trainable parameters
    (fine_tune's second phase unfreezes the body, which changes the graphs).

    That epoch compiles the step and evaluation graphs (the partial last validation batch
    included); a count that still grows after it is a shape or control-flow problem that
    recompiles for ever. (Measured here on XLA's CPU backend: the recipe with and without
    `augment`, bf16, grad_accum 2 and grad_clip compiled nothing after the first epoch.)
    """
    if warm_up or previous is None:
        return None
    grown = current["compile_count"] - previous["compile_count"]
    if grown <= 0:
        return None
    return (
        f"XLA compiled {grown} new graph(s) during epoch {epoch + 1}, after the warm-up epoch: "
        "shapes or control flow change between steps (a partial batch, a Python-side branch on "
        "a tensor value, or a changing hyper-parameter baked in as a constant). Each recompile "
        "stalls training."
    )


def new_fallbacks(previous: dict[str, Any] | None, current: dict[str, Any]) -> dict[str, int]:
    """Ops that fell back to the CPU for the first time since the previous report."""
    seen = (previous or {}).get("aten_fallbacks", {})
    return {op: count for op, count in current["aten_fallbacks"].items() if op not in seen}


def cache_load_failure_warning(
    previous: dict[str, Any] | None, current: dict[str, Any], cache_dir: str
) -> str | None:
    """A warning the first time cached graphs could not be loaded from the persistent cache.

    torch_xla 2.9 writes executables to the cache but loads none back: on the CPU backend its
    PJRT client answers UNIMPLEMENTED (seen here), and on a TPU torch_xla 2.8 and 2.9 cannot
    either (pytorch/xla#9094: the TPU client has no DeserializeExecutable; 2.7 and older could).
    """
    before = (previous or {}).get("persistent_cache_load_failures", 0)
    failures = current.get("persistent_cache_load_failures", 0)
    if before > 0 or failures <= 0:
        return None
    return (
        f"the XLA compilation cache in {cache_dir} holds {failures} graph(s) of this job that "
        "this XLA backend could not load, so they were compiled again (torch_xla 2.8 and 2.9 "
        "cannot load cached executables: pytorch/xla#9094)"
    )


def restart_counting(previous_job: int) -> dict[str, int]:
    """At the start of a job in a process that trained `previous_job`: clear torch_xla's
    metrics, so this job's reports count its own compiles, put XLA's random numbers back where
    a fresh process has them, and count the compiled graphs kept in memory (XLA's in-memory
    cache), which serve this job wherever its graphs are the same."""
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    met.clear_all()
    # The random numbers a fresh process starts from (torch_xla's default seed, 101), so the
    # job's dropout masks, and its numbers, do not depend on which process trains it.
    xm.set_rng_state(FRESH_PROCESS_SEED)
    graphs = int(torch_xla._XLAC._xla_get_num_cached_compilation_graph())
    return {"graphs_kept": graphs, "graphs_kept_from_job": previous_job}

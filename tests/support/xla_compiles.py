"""What the XLA job tests ask of a job's compile counts (its XLA reports, one per epoch)."""

from __future__ import annotations


def assert_compiles_stop_after_the_first_epoch(compiles: list[float], warnings: list[str]) -> None:
    """`compiles`: the cumulative compile count at each epoch's end; `warnings`: the job's
    warning events. Nothing compiles after the first epoch, and the log warns of nothing.

    (A stray validation graph once appeared now and then on a loaded machine: a skipped
    garbage collection, see `worker.callbacks.XlaStepCallback`. Any graph after the first
    epoch is a defect again.)"""
    assert compiles[-1] == compiles[0], f"compile count grew after the first epoch: {compiles}"
    said = [message for message in warnings if "new graph(s) during epoch" in message]
    assert said == [], said

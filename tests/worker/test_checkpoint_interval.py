"""Checkpoints written at most every interval: each epoch's state kept in memory, written
when the interval has passed, at the last epoch, and on a stop (flush)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from worker import checkpoint


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _learner(value: float) -> SimpleNamespace:
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.fill_(value)
    return SimpleNamespace(model=model, opt=None, dls=SimpleNamespace(vocab=["a", "b"]))


def _writer(tmp_path, interval_s: float):
    written: list[int] = []
    clock = FakeClock()
    writer = checkpoint.CheckpointWriter(
        tmp_path,
        background=False,
        after_write=lambda _path, epoch: written.append(epoch),
        interval_s=interval_s,
        clock=clock,
    )
    return writer, clock, written


def test_short_epochs_are_kept_in_memory_until_the_interval_passes(tmp_path):
    writer, clock, written = _writer(tmp_path, interval_s=60)
    for epoch in range(3):
        clock.now += 20
        writer.save(_learner(epoch), epoch=epoch, lr=0.1, spec={})
    assert written == [2], "the first write once 60 s have passed since training began"
    clock.now += 20
    writer.save(_learner(3), epoch=3, lr=0.1, spec={})
    assert written == [2]
    writer.save(_learner(4), epoch=4, lr=0.1, spec={}, last=True)
    assert written == [2, 4], "the last epoch is always written"


def test_a_stop_writes_the_newest_epoch_kept(tmp_path):
    writer, clock, written = _writer(tmp_path, interval_s=60)
    writer.save(_learner(7.0), epoch=0, lr=0.1, spec={})
    clock.now += 1
    writer.save(_learner(8.0), epoch=1, lr=0.1, spec={})
    assert written == []
    writer.flush()
    assert written == [1]
    state = checkpoint.load_checkpoint(tmp_path)
    assert state["epoch"] == 1
    assert torch.all(state["model"]["weight"] == 8.0), "the state as it was after that epoch"
    writer.flush()
    assert written == [1], "nothing kept: nothing more to write"


def test_the_kept_state_is_a_copy_that_training_cannot_change(tmp_path):
    writer, _clock, _written = _writer(tmp_path, interval_s=60)
    learn = _learner(1.0)
    writer.save(learn, epoch=0, lr=0.1, spec={})
    with torch.no_grad():
        learn.model.weight.fill_(5.0)  # the next epoch trains on
    writer.flush()
    assert torch.all(checkpoint.load_checkpoint(tmp_path)["model"]["weight"] == 1.0)


def test_interval_zero_writes_every_epoch(tmp_path):
    writer, _clock, written = _writer(tmp_path, interval_s=0)
    for epoch in range(3):
        writer.save(_learner(epoch), epoch=epoch, lr=0.1, spec={})
    assert written == [0, 1, 2]

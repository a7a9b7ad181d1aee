"""The share of each training step spent waiting for data, on the CPU: a dataset whose item
transform sleeps is input-bound, a fast one feeding a slow step is not."""

from __future__ import annotations

import logging
import time

import pytest
import torch
from fastai.callback.core import Callback
from fastai.learner import Learner
from fastai.losses import CrossEntropyLossFlat
from fastai.torch_core import set_seed
from fasttransform import Transform
from torch import nn

from datasets.labelling import scan_items
from db.spec import JobSpec
from db.telemetry import INPUT_BOUND_SHARE, INPUT_WAIT_SHARE, MetricPoint
from tests.support.workers import digits_subset
from worker.callbacks import TrainingClock
from worker.data import build_dataloaders
from worker.input_wait import InputWaitCallback, TimedLoader

CPU = torch.device("cpu")
# Each image's sleep is long against a step of the test's tiny model on 16 px images (well
# under a millisecond), and the slow step's sleep long against loading a batch of four 8×8
# PNGs, so which side waits does not depend on the machine's speed.
ITEM_SLEEP_S = 0.05
STEP_SLEEP_S = 0.1


class SlowItem(Transform):
    """An item transform that takes ITEM_SLEEP_S per image: a loader that cannot keep up."""

    def encodes(self, x):
        time.sleep(ITEM_SLEEP_S)
        return x


class SlowStep(Callback):
    """A step that takes STEP_SLEEP_S more: the device is the slow side."""

    def after_loss(self):
        if self.training:
            time.sleep(STEP_SLEEP_S)


class Points:
    """Stands in for the TelemetryWriter: keeps what the callback hands it."""

    def __init__(self):
        self.points: list[MetricPoint] = []

    def add_points(self, points):
        self.points.extend(points)


def _fit(data_dir, tmp_path, slow_items: bool, epochs: int = 2) -> list[MetricPoint]:
    items = scan_items(digits_subset(data_dir, 2), {"type": "folder"})  # 20 images
    spec = JobSpec(bs=4, img_size=16, device="cpu", epochs=epochs)
    dls = build_dataloaders(items, spec, CPU)
    if slow_items:
        dls.train.after_item.add(SlowItem())
    set_seed(0)
    # A model of a few hundred weights: its step is far shorter than any sleep here.
    model = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, dls.c))
    learn = Learner(dls, model, loss_func=CrossEntropyLossFlat(), path=tmp_path)
    writer = Points()
    learn.add_cb(InputWaitCallback(writer, TrainingClock(epochs, len(dls.train))))
    if not slow_items:
        learn.add_cb(SlowStep())
    learn.fit(epochs, 1e-3)
    return writer.points


@pytest.mark.slow  # the sleeps add up to about 2 s; with the fit, 4 to 8 s here
def test_a_dataset_whose_item_transform_sleeps_is_input_bound(data_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="worker.training"):
        points = _fit(data_dir, tmp_path, slow_items=True)
    assert [(p.name, p.step, p.epoch) for p in points] == [
        (INPUT_WAIT_SHARE, 0, 0),
        (INPUT_WAIT_SHARE, 1, 1),
    ]
    assert all(p.value > INPUT_BOUND_SHARE for p in points), [p.value for p in points]
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("input-bound")]
    assert len(warnings) == 1  # once per job
    assert warnings[0].startswith("input-bound: training waited for its input ")
    assert "of epoch 1 (" in warnings[0] and "lighter item_tfms" in warnings[0]


def test_a_fast_dataset_feeding_a_slow_step_is_not(data_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="worker.training"):
        points = _fit(data_dir, tmp_path, slow_items=False)
    assert [p.step for p in points] == [0, 1]
    assert all(0 <= p.value < INPUT_BOUND_SHARE for p in points), [p.value for p in points]
    assert not [r for r in caplog.records if r.getMessage().startswith("input-bound")]


def test_the_timed_loader_passes_everything_through_and_stops_its_loader():
    closed = []

    def batches():
        try:
            yield from range(5)
        finally:
            closed.append(True)

    class Loader:
        bs = 7

        def __len__(self):
            return 5

        def __iter__(self):
            return batches()

    timed = TimedLoader(Loader())
    assert (len(timed), timed.bs) == (5, 7)
    assert list(timed) == [0, 1, 2, 3, 4] and closed == [True]
    first = iter(timed)
    next(first)
    first.close()  # a pass left early
    assert closed == [True, True]
    assert timed.waited_s >= 0

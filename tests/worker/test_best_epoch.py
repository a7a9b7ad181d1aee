"""Early stopping and keep-best (worker.best_epoch): fastai's comparison, patience counted in
the job's epochs, and a state that a checkpoint carries so a resumed job decides as one that
never stopped."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from db.spec import SpecError, parse_spec
from worker.best_epoch import BestEpochTracker
from worker.callbacks import TrainingClock

NAMES = ["epoch", "train_loss", "valid_loss", "accuracy", "error_rate", "time"]


def _tracker(total_epochs: int = 10, **spec: object) -> BestEpochTracker:
    tracker = BestEpochTracker(parse_spec(spec), TrainingClock(total_epochs, 5))
    model = nn.Linear(1, 1)
    tracker.learn = SimpleNamespace(
        recorder=SimpleNamespace(metric_names=NAMES, values=[]), model=model, epoch=0
    )
    tracker.before_fit()
    return tracker


def _epoch(tracker: BestEpochTracker, epoch: int, valid_loss: float, accuracy: float = 0.5):
    """One trained epoch with these values; the model's weight is set to the epoch number."""
    learn = tracker.learn
    learn.epoch = epoch
    learn.recorder.values.append([1.0, valid_loss, accuracy, 1 - accuracy])
    with torch.no_grad():
        learn.model.weight.fill_(float(epoch))
    tracker.before_train()
    tracker.after_epoch()


def test_patience_counts_epochs_without_improvement_by_min_delta():
    tracker = _tracker(early_stop=2, min_delta=0.05)
    for epoch, loss in enumerate([1.0, 0.9, 0.88, 0.87]):
        _epoch(tracker, epoch, loss)
        if tracker.stopped_at is not None:
            break
    # 0.88 and 0.87 improve on 0.9 by less than 0.05: two epochs without improvement.
    assert (tracker.best_epoch, tracker.stopped_at) == (1, 3)
    assert tracker.stop_line() == (
        "stopped early at epoch 4/10: valid_loss did not improve by more than 0.05 for 2 "
        "epoch(s) (best 0.9000 at epoch 2)"
    )


def test_accuracy_is_better_higher_and_no_early_stop_means_every_epoch():
    tracker = _tracker(monitor="accuracy", keep="best")
    for epoch, accuracy in enumerate([0.5, 0.8, 0.7, 0.6, 0.55]):
        _epoch(tracker, epoch, valid_loss=1.0, accuracy=accuracy)
    assert tracker.stopped_at is None
    assert tracker.best_epoch == 1
    assert tracker.best_model["weight"].item() == 1.0, "the weights of the best epoch, copied"


def test_skipped_epochs_of_a_resumed_fit_are_not_compared():
    tracker = _tracker(early_stop=1)
    _epoch(tracker, 0, 1.0)
    tracker.learn.recorder.values.append([1.0, 0.1, 0.5, 0.5])  # what a skipped epoch leaves
    tracker.after_epoch()  # fastai's SkipToEpoch cancels it before this callback's hooks
    assert (tracker.best_epoch, tracker.wait, tracker.best) == (0, 0, 1.0)


def test_a_restored_state_decides_as_the_uninterrupted_run():
    losses = [1.0, 0.7, 0.8, 0.75, 0.72, 0.9]
    whole = _tracker(early_stop=3, keep="best")
    for epoch, loss in enumerate(losses):
        if whole.stopped_at is None:  # training ends the fit there
            _epoch(whole, epoch, loss)
    first = _tracker(early_stop=3, keep="best")
    for epoch, loss in enumerate(losses[:3]):
        _epoch(first, epoch, loss)
    resumed = _tracker(early_stop=3, keep="best")
    resumed.restore(first.state())
    resumed.before_fit()  # a new fit after the resume must not reset the count
    for epoch, loss in enumerate(losses[3:], start=3):
        if resumed.stopped_at is None:
            _epoch(resumed, epoch, loss)
    assert whole.state()["stopped_at"] == resumed.state()["stopped_at"] == 4
    assert (resumed.best_epoch, resumed.wait, resumed.best) == (1, 3, 0.7)
    assert resumed.best_model["weight"].item() == 1.0


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"early_stop": 0}, "early_stop", "must be at least 1"),
        ({"early_stop": True}, "early_stop", "must be a number, not true or false"),
        ({"min_delta": -1}, "min_delta", "must be at least 0"),
        ({"keep": "first"}, "keep", "must be one of last or best"),
        ({"monitor": "f1"}, "monitor", "must be one of"),
    ],
)
def test_bad_stopping_fields_are_refused_naming_the_field(changes, field, message):
    with pytest.raises(SpecError) as refused:
        parse_spec(changes)
    assert message in refused.value.problems[field]

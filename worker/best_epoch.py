"""Early stopping and keep-best for every job: which epoch of `spec.monitor` is the best, how
many epochs since, and (keep=best) that epoch's weights.

The comparison is fastai's `TrackerCallback` (its `comp` and `min_delta`). fastai's
`EarlyStoppingCallback` and `SaveModelCallback` themselves do not fit a job that can be
resumed on another machine: EarlyStopping raises `CancelFitException` inside `after_epoch`,
before the epoch's checkpoint is written, counts epochs per fit and prints; SaveModel writes
the best model to a file under the job's folder (a path only this machine has) and loads it
back with `map_location` set to the device, which torch cannot restore on XLA (see
`training.lr_find`). Here the state travels in the checkpoint, epochs are the job's global
epochs, and the fit ends (fastai's `CancelFitException`) once the epoch's checkpoint is
written (`training.run`).
"""

from __future__ import annotations

import math
from typing import Any

from fastai.callback.tracker import TrackerCallback

from db.spec import JobSpec
from worker.callbacks import EPOCH_COLUMN_NAMES, TrainingClock
from worker.checkpoint import host_copy

# traindeck's epoch metric names → the Recorder's column names.
FASTAI_COLUMNS = {ours: theirs for theirs, ours in EPOCH_COLUMN_NAMES.items()}


def epoch_value(learn: Any, metric: str) -> float:
    """The newest epoch's value of an epoch metric, from fastai's Recorder (a host number)."""
    names = list(learn.recorder.metric_names[1:])
    return float(learn.recorder.values[-1][names.index(FASTAI_COLUMNS.get(metric, metric))])


class BestEpochTracker(TrackerCallback):
    """Tracks the best epoch of `spec.monitor`; marks `stopped_at` (a global epoch) when
    `spec.early_stop` epochs in a row did not improve it; keeps a host copy of the best
    epoch's weights when `spec.keep` is best."""

    # After DivergenceCallback (85), so a NaN epoch is never kept; before EpochEndCallback
    # (90), whose checkpoint carries this epoch's state.
    order = 86

    def __init__(self, spec: JobSpec, clock: TrainingClock):
        # reset_on_fit=False: the best carries over from fine_tune's frozen phase.
        super().__init__(
            monitor=FASTAI_COLUMNS.get(spec.monitor, spec.monitor),
            min_delta=spec.min_delta,
            reset_on_fit=False,
        )
        self.metric = spec.monitor
        self.patience = spec.early_stop if spec.early_stop is not None else math.inf
        self.keep_best = spec.keep == "best"
        self.clock = clock
        self.best_epoch: int | None = None
        self.best_model: dict[str, Any] | None = None
        self.wait = 0
        self.stopped_at: int | None = None

    def before_train(self) -> None:
        self.trained = True

    def after_epoch(self) -> None:
        # fastai's SkipToEpoch (order 70, a resumed fit) cancels a skipped epoch in its
        # before_epoch, before this callback's would run, and after_epoch still runs; only an
        # epoch that trains reaches before_train. The mark is cleared for the next epoch.
        trained, self.trained = getattr(self, "trained", False), False
        if not trained:
            return
        super().after_epoch()  # fastai's comparison: sets best and new_best
        epoch = self.clock.global_epoch(self.epoch)
        if self.new_best:
            self.best_epoch, self.wait = epoch, 0
            if self.keep_best:
                self.best_model = host_copy(self.learn.model.state_dict())
            return
        self.wait += 1
        if self.wait >= self.patience:
            self.stopped_at = epoch

    # --- the checkpoint ---

    def state(self) -> dict[str, Any]:
        return {
            "best": float(self.best) if self.best is not None else None,
            "best_epoch": self.best_epoch,
            "wait": self.wait,
            "stopped_at": self.stopped_at,
            "best_model": self.best_model,
        }

    def restore(self, state: dict[str, Any] | None) -> None:
        """The state a checkpoint carried (none in a checkpoint written before there was)."""
        if not state:
            return
        self.best = state["best"]
        self.best_epoch = state["best_epoch"]
        self.wait = state["wait"]
        self.stopped_at = state["stopped_at"]
        self.best_model = state["best_model"]

    # --- after the fit ---

    def stop_line(self) -> str:
        """The job's log line for an early stop."""
        assert self.stopped_at is not None and self.best_epoch is not None
        return (
            f"stopped early at epoch {self.stopped_at + 1}/{self.clock.total_epochs}: "
            f"{self.metric} did not improve by more than {self.min_delta_given:g} for "
            f"{self.wait} epoch(s) (best {self.best:.4f} at epoch {self.best_epoch + 1})"
        )

    @property
    def min_delta_given(self) -> float:
        return abs(self.min_delta)  # fastai stores it negated for the 'lower is better' metrics

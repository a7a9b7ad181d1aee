"""Fast tests of the worker's pieces that need no training run."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from fastai.callback.progress import ProgressCallback
from fastai.learner import AvgSmoothLoss
from fastai.test_utils import synth_learner

from db.spec import JobSpec, training_images
from tests.support.workers import REPO, run_worker, worker_env
from worker import checkpoint, xla_report
from worker.callbacks import (
    DivergenceCallback,
    EpochEndCallback,
    RawLossTracker,
    TrainingClock,
)
from worker.devices import resolve_device
from worker.training import Phase, schedule_phases, set_trainable, total_epochs


def test_raw_loss_is_recovered_exactly_from_fastais_smoothed_loss():
    smooth = AvgSmoothLoss(beta=0.98)
    tracker = RawLossTracker()
    losses = [2.3, 2.1, 5.0, 0.4, 0.39, 1.7, 0.01, 3.3] * 3
    recovered = []
    for index, loss in enumerate(losses):
        if index == len(losses) // 2:
            smooth.reset()  # a new fit: fastai resets the smoother
        smooth.accumulate(SimpleNamespace(loss=torch.tensor(loss)))
        recovered.append(tracker.raw_loss(smooth))
    assert recovered == pytest.approx(losses, rel=1e-4, abs=1e-4)


def test_the_host_side_stand_ins_compute_what_fastais_recorder_does():
    """worker.device_values feeds fastai's arithmetic with values read in chunks: the smoothed
    loss and a metric's average come out as fastai's own AvgSmoothLoss and AvgMetric give."""
    from fastai.learner import AvgMetric
    from fastai.metrics import accuracy

    from worker.device_values import DeviceAverage, HostSmoothLoss

    losses = [2.3, 2.1, 5.0, 0.4, 0.39, 1.7, 0.01, 3.3]
    fastai_smooth, host_smooth = AvgSmoothLoss(beta=0.98), HostSmoothLoss(beta=0.98)
    for loss in losses:
        fastai_smooth.accumulate(SimpleNamespace(loss=torch.tensor(loss)))
        assert torch.equal(host_smooth.add(torch.tensor(loss)), fastai_smooth.value)
    assert host_smooth.count == fastai_smooth.count

    torch.manual_seed(0)
    batches = [(torch.randn(bs, 10), torch.randint(0, 10, (bs,))) for bs in (16, 16, 5)]
    original = AvgMetric(accuracy)
    average = DeviceAverage(AvgMetric(accuracy))
    original.reset()
    for pred, target in batches:
        learn = SimpleNamespace(pred=pred, yb=(target,), to_detach=lambda t: t.detach())
        original.accumulate(learn)
        average.capture(learn)
        average.accumulate(learn)  # what the Recorder calls: nothing more to add
    assert average.value is None and average.unread  # not read from the device yet
    average.take(average.total)
    assert average.count == original.count == 37 and average.name == "accuracy"
    torch.testing.assert_close(average.value, original.value)


def test_the_training_count_checked_at_submit_is_fastais_random_split():
    from fastai.data.transforms import RandomSplitter

    for count in (2, 7, 48, 49, 100, 1797):
        for valid_pct in (0.05, 0.1, 0.15, 0.2, 0.3, 0.35, 0.5):
            train, _ = RandomSplitter(valid_pct=valid_pct, seed=0)(range(count))
            assert training_images(count, valid_pct) == len(train), (count, valid_pct)


def test_training_clock_numbers_steps_across_phases():
    clock = TrainingClock(total_epochs=3, steps_per_epoch=10)
    assert clock.total_steps == 30
    assert clock.global_step(0, 0) == 0 and clock.global_step(1, 9) == 19
    clock.epoch_offset = 1  # fine_tune's second phase starts at global epoch 1
    assert clock.global_epoch(0) == 1 and clock.global_step(1, 0) == 20


def test_fine_tune_has_a_frozen_epoch_then_the_asked_epochs():
    spec = JobSpec(schedule="fine_tune", epochs=4, pretrained=True)
    frozen, unfrozen = schedule_phases(spec, 1e-3)
    assert (frozen.frozen, frozen.epochs, frozen.offset) == (True, 1, 0)
    assert (unfrozen.frozen, unfrozen.epochs, unfrozen.offset) == (False, 4, 1)
    assert unfrozen.lr.stop == pytest.approx(5e-4)
    assert total_epochs(spec) == 5
    (only,) = schedule_phases(JobSpec(epochs=4), 1e-3)
    assert (only.frozen, only.epochs, only.lr) == (False, 4, 1e-3)


def test_compile_growth_warns_only_when_compiles_go_on_after_the_warm_up_epoch():
    first = {"compile_count": 9, "aten_fallbacks": {}}
    second = {"compile_count": 10, "aten_fallbacks": {}}
    third = {"compile_count": 10, "aten_fallbacks": {"nonzero": 3}}
    fourth = {"compile_count": 12, "aten_fallbacks": {"nonzero": 3}}
    assert xla_report.compile_growth_warning(0, True, None, first) is None
    assert "1 new graph(s) during epoch 2" in xla_report.compile_growth_warning(
        1, False, first, second
    )
    assert xla_report.compile_growth_warning(1, True, first, second) is None  # fine_tune unfroze
    assert xla_report.compile_growth_warning(2, False, second, third) is None
    assert "2 new graph(s) during epoch 4" in xla_report.compile_growth_warning(
        3, False, third, fourth
    )
    assert xla_report.new_fallbacks(second, third) == {"nonzero": 3}
    assert xla_report.new_fallbacks(third, fourth) == {}


def test_explicit_devices_are_kept_and_auto_finds_the_cpu_here(monkeypatch):
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
    assert resolve_device("xla") == "xla"
    assert resolve_device("cuda") == "cuda"
    assert resolve_device("auto") in ("cpu", "cuda")  # this machine has no TPU


def test_the_supervisor_never_imports_torch():
    probe = (
        "import sys, worker.supervisor, worker.cli; "
        "print(sorted(m for m in ('torch', 'torch_xla', 'fastai') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=worker_env(), capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    assert result.stdout.strip() == "[]"


def test_once_on_an_empty_queue_exits_zero_with_a_message(sqlite_engine):
    result = run_worker("--once", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "queue is empty" in result.stderr


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--device", "tpu"], "--device"),
        (["--poll-interval", "0"], "--poll-interval"),
        (["--poll-interval", "soon"], "--poll-interval"),
        (["--max-jobs", "-1"], "--max-jobs"),
        (["--worker-id", ""], "--worker-id"),
    ],
)
def test_bad_flags_give_one_line_and_no_traceback(sqlite_engine, args, complaint):
    result = run_worker(*args, timeout=60)
    assert result.returncode == 2
    assert complaint in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_heartbeat_setting_is_refused(sqlite_engine):
    result = run_worker("--once", timeout=60, TRAINDECK_HEARTBEAT_TIMEOUT="soon")
    assert result.returncode == 2
    assert "TRAINDECK_HEARTBEAT_TIMEOUT" in result.stderr and "Traceback" not in result.stderr


def _tiny_learner() -> SimpleNamespace:
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()  # momentum buffers: optimizer state worth saving
    return SimpleNamespace(model=model, opt=optimizer, dls=SimpleNamespace(vocab=["a", "b"]))


def test_a_background_checkpoint_holds_the_state_of_its_epoch(tmp_path):
    learn = _tiny_learner()
    writer = checkpoint.CheckpointWriter(tmp_path)
    writer.save(learn, epoch=0, lr=0.1, spec={"epochs": 2})
    expected = learn.model.weight.detach().clone()
    with torch.no_grad():
        learn.model.weight.add_(1.0)  # training goes on while the write runs
    writer.wait()
    state = checkpoint.load_checkpoint(tmp_path)
    assert state["epoch"] == 0 and state["classes"] == ["a", "b"]
    assert torch.equal(state["model"]["weight"], expected)
    assert state["optimizer"]["state"], "the optimizer's buffers are saved"


def test_a_kept_state_lives_in_one_block_per_dtype_reused_by_the_next_epoch(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(2))  # int64 too
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    learn = SimpleNamespace(model=model, opt=optimizer, dls=SimpleNamespace(vocab=["a", "b"]))
    writer = checkpoint.CheckpointWriter(tmp_path, background=False, interval_s=3600)
    writer.save(learn, epoch=0, lr=0.1, spec={})  # kept in memory: the interval has not passed
    copied = writer._kept["model"]
    blocks = {(t.dtype, t.untyped_storage().data_ptr()) for t in copied.values()}
    assert {dtype for dtype, _ in blocks} == {torch.float32, torch.int64}
    assert len(blocks) == 2, "one block per dtype"
    with torch.no_grad():
        model[0].weight.add_(1.0)
    writer.save(learn, epoch=1, lr=0.1, spec={})
    again = writer._kept["model"]
    assert {(t.dtype, t.untyped_storage().data_ptr()) for t in again.values()} == blocks
    writer.flush()  # torch.save takes the blocks' views as they are
    state = checkpoint.load_checkpoint(tmp_path)
    assert state["epoch"] == 1
    for name, tensor in model.state_dict().items():
        assert torch.equal(state["model"][name], tensor), name
    momentum = optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(state["optimizer"]["state"][0]["momentum_buffer"], momentum)


@pytest.mark.parametrize("background", [True, False], ids=["background", "in-place"])
def test_a_failed_write_is_raised_and_the_previous_checkpoint_kept(tmp_path, background):
    learn = _tiny_learner()
    writer = checkpoint.CheckpointWriter(tmp_path, background=background)
    writer.save(learn, epoch=0, lr=0.1, spec={})
    writer.wait()
    # A folder where the next temporary file goes: opening it for writing fails (even as root).
    (tmp_path / f".{checkpoint.CHECKPOINT_NAME}.{os.getpid()}.tmp").mkdir()
    with pytest.raises(checkpoint.ArtifactWriteError) as failure:
        writer.save(learn, epoch=1, lr=0.1, spec={})
        writer.wait()  # in the background, the failure comes with the wait
    assert "cannot write the checkpoint of epoch 2 (the previous checkpoint is intact)" in str(
        failure.value
    )
    assert checkpoint.load_checkpoint(tmp_path)["epoch"] == 0
    writer.wait()  # a failure is raised once


def _regression_learner(lr: float, valid_x: float | None = None) -> Any:
    """fastai's synthetic regression Learner (SGD, momentum 0.9) with the divergence check and
    a stand-in checkpoint that records the epochs it was asked to save."""
    torch.manual_seed(0)
    learn = synth_learner(n_trn=10, lr=lr)
    learn.remove_cb(ProgressCallback)
    learn.logger = lambda *_args: None
    if valid_x is not None:
        learn.dls.valid.dataset.tensors[0][:] = valid_x
    clock = TrainingClock(total_epochs=3, steps_per_epoch=len(learn.dls.train))
    learn.saved = []
    learn.divergence = DivergenceCallback(clock)
    learn.add_cbs([EpochEndCallback(clock, learn.saved.append), learn.divergence])
    return learn


def test_a_diverging_fit_stops_at_the_first_non_finite_loss_and_keeps_no_checkpoint():
    learn = _regression_learner(lr=1e3)
    learn.fit(3)
    assert learn.divergence.diverged is not None
    assert learn.divergence.diverged.startswith(
        "training diverged: the training loss became inf at step 7 in epoch 1/3 "
        "(learning rate 1e+03); nothing was saved. Try a lower learning rate"
    ), learn.divergence.diverged
    assert learn.saved == []
    assert learn.epoch == 0, "the fit went on after the loss was lost"


def test_a_non_finite_valid_loss_ends_the_fit_before_that_epoch_is_checkpointed():
    learn = _regression_learner(lr=1e-2, valid_x=float("nan"))
    learn.fit(3)
    assert learn.divergence.diverged is not None
    assert "the valid loss became nan in epoch 1/3" in learn.divergence.diverged
    assert learn.saved == []


def test_a_fit_that_stays_finite_is_left_alone():
    learn = _regression_learner(lr=1e-2)
    learn.fit(3)
    assert learn.divergence.diverged is None
    assert learn.saved == [0, 1, 2]


@pytest.mark.parametrize("keep_state", [True, False], ids=["resumed-phase", "new-phase"])
def test_setting_what_trains_keeps_a_resumed_optimizers_state(keep_state):
    """fastai's freeze/unfreeze clear the optimizer's moments: right when a phase begins,
    wrong for a phase resumed from a checkpoint, whose moments were just restored."""
    learn = _regression_learner(lr=1e-2)
    learn.fit(1)
    assert all("grad_avg" in state for state in learn.opt.state.values())
    set_trainable(learn, Phase(epochs=2, offset=0, frozen=False, lr=1e-2), keep_state=keep_state)
    kept = [("grad_avg" in state) for state in learn.opt.state.values()]
    assert kept and all(kept) == keep_state and any(kept) == keep_state

"""Train one job with fastai: DataLoaders, Learner, schedule, checkpoints, resume, export.

The rules of the XLA path (see the design card) live here: the model is on the device before
the optimizer exists, one `torch_xla.sync()` per batch, bf16 by autocast, and nothing reads a
device tensor that fastai has not already read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from fastai.callback.core import CancelFitException, TrainEvalCallback
from fastai.callback.progress import ProgressCallback
from fastai.callback.training import GradientAccumulation, GradientClip
from fastai.learner import Learner, Recorder
from fastai.metrics import accuracy, error_rate, top_k_accuracy
from fastai.torch_core import set_seed, to_device
from fastai.vision.learner import vision_learner

from common import config, store
from common.errors import error_summary
from db.artifacts import record_artifact
from db.engine import Engine, retry_while_unavailable
from db.queue import Lease
from db.spec import JobSpec
from db.sweeps import Trial, end_trial, report_epoch
from db.telemetry import LR_FIND, MetricPoint
from worker import checkpoint, gang, multihost, spmd
from worker.best_epoch import BestEpochTracker, epoch_value
from worker.callbacks import (
    AutocastCallback,
    DivergenceCallback,
    EpochEndCallback,
    FailpointCallback,
    StopCallback,
    TelemetryCallback,
    TrainingClock,
    XlaReportCallback,
    XlaStepCallback,
)
from worker.checkpoint_upload import CheckpointUploader, newest_checkpoint, remove_uploaded
from worker.data import build_dataloaders, load_items
from worker.device_values import DeviceValuesCallback
from worker.failpoints import EXPORT_TMP_WRITTEN, any_armed, failpoint
from worker.input_wait import InputWaitCallback
from worker.outputs import publish
from worker.prefetch import PrefetchCallback
from worker.profiling import ProfileCallback
from worker.reporter import TelemetryWriter
from worker.results import record_results
from worker.skipped import RECORD_NAME as SKIP_RECORD_NAME
from worker.skipped import SkippedFilesCallback, SkipRecord
from worker.spmd import DataParallel

if TYPE_CHECKING:
    from worker.gang import GangPlace

log = logging.getLogger(__name__)

EXPORT_NAME = "export.pkl"
# A stopped job (a preempted VM) waits this long for the checkpoint upload in flight.
UPLOAD_WAIT_ON_STOP_S = 30.0
FINE_TUNE_FREEZE_EPOCHS = 1
FINE_TUNE_LR_MULT = 100
LR_FIND_ITERATIONS = 100


class StopRequested(Exception):
    """The supervisor asked this run to stop (cancel, shutdown or time limit)."""


class JobFailure(Exception):
    """A failure with a message a person can act on (no traceback needed)."""


class TrialPruned(Exception):
    """A sweep's pruner stopped this trial; the message says when and why."""


T = TypeVar("T")


@dataclass
class TrainingContext:
    engine: Engine
    lease: Lease
    spec: JobSpec
    job_dir: Path
    device_kind: str  # "xla", "cuda" or "cpu" (already resolved from "auto")
    writer: TelemetryWriter
    stop: threading.Event
    parent_pid: int | None = None
    # A sweep's trial (db.sweeps): each epoch's objective goes to its study.
    trial: Trial | None = None
    # The global epoch (0-based) whose model was exported: the last, or the best (keep=best).
    kept_epoch: int | None = None
    # The global epoch after which the sweep's pruner stopped the trial.
    pruned_at: int | None = None
    previous_job: int | None = None  # the job this process trained before, graphs kept
    # A multi-host job (worker.gang): this process's place in its gang, and its index among
    # the gang's processes once the device is open. Only process 0 writes the job's rows and
    # files; the others train the same steps.
    gang: GangPlace | None = None
    process_index: int = 0

    @property
    def primary(self) -> bool:
        return self.process_index == 0

    def db(self, action: Callable[[], T], what: str) -> T:
        """A database call of the job process, tried again while the database is locked or
        away (the telemetry writer buffers and retries on its own); a stop request ends it."""
        return retry_while_unavailable(action, what, give_up=self.stop.is_set)


@dataclass(frozen=True)
class Phase:
    """One fit_one_cycle call of a schedule, at global epochs [offset, offset + epochs)."""

    epochs: int
    offset: int
    frozen: bool
    lr: Any
    pct_start: float = 0.25
    div: float = 25.0

    @property
    def end(self) -> int:
        return self.offset + self.epochs


def schedule_phases(spec: JobSpec, lr: float) -> list[Phase]:
    """fit_one_cycle: one phase over everything. fine_tune (as fastai's): one epoch with the
    pretrained body frozen, then `epochs` unfrozen at half the rate, discriminative lrs."""
    if spec.schedule == "one_cycle":
        return [Phase(spec.epochs, 0, frozen=False, lr=lr)]
    unfrozen_lr = lr / 2
    return [
        Phase(FINE_TUNE_FREEZE_EPOCHS, 0, frozen=True, lr=slice(lr), pct_start=0.99),
        Phase(
            spec.epochs,
            FINE_TUNE_FREEZE_EPOCHS,
            frozen=False,
            lr=slice(unfrozen_lr / FINE_TUNE_LR_MULT, unfrozen_lr),
            pct_start=0.3,
            div=5.0,
        ),
    ]


def total_epochs(spec: JobSpec) -> int:
    return spec.epochs + (FINE_TUNE_FREEZE_EPOCHS if spec.schedule == "fine_tune" else 0)


# --- device ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceSetup:
    """Where a job trains: the torch device, a label for the job row, and with more than one
    XLA device the SPMD mesh that splits each batch over them."""

    device: torch.device
    label: str
    parallel: DataParallel | None = None

    @property
    def devices(self) -> int:
        return self.parallel.devices if self.parallel is not None else 1


def open_device(kind: str, cores: int | None = None) -> DeviceSetup:
    """Open the device for `kind`; on XLA `cores` devices (None: all), with SPMD over several."""
    if kind == "xla":
        return _open_xla(cores)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise JobFailure("device cuda: torch sees no CUDA GPU on this worker")
        return DeviceSetup(torch.device("cuda"), f"cuda:{torch.cuda.get_device_name(0)}")
    return DeviceSetup(torch.device("cpu"), "cpu")


def _open_xla(cores: int | None) -> DeviceSetup:
    from worker.devices import tpu_present

    if not tpu_present() and not os.environ.get("PJRT_DEVICE"):
        raise JobFailure(
            "device xla: this worker has no TPU (set PJRT_DEVICE=CPU to run the XLA path "
            "on the CPU, or submit with device auto/cpu)"
        )
    try:
        spmd.narrow_cpu_devices(cores)
    except spmd.DeviceRequestError as exc:
        raise JobFailure(str(exc)) from None
    import torch_xla
    import torch_xla.runtime as xr

    cache = xla_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    # Once per process: a kept job process (worker.job_channel) opened it for its first job.
    if not torch_xla._XLAC._xla_computation_cache_is_initialized():
        xr.initialize_cache(str(cache), readonly=False)
    available = xr.global_runtime_device_count()
    device_type = xr.device_type()
    try:
        used = spmd.devices_to_use(cores, available, device_type)
    except spmd.DeviceRequestError as exc:
        raise JobFailure(str(exc)) from None
    if used == 1:
        of = f"1 of {available} devices" if available > 1 else "1 device"
        return DeviceSetup(torch_xla.device(), f"xla:{device_type} ({of})")
    parallel = spmd.DataParallel.over_all_devices()
    label = f"xla:{device_type} ({parallel.devices} devices, SPMD data parallel)"
    return DeviceSetup(parallel.device, label, parallel)


def _join_runtime(spec: JobSpec, setup: DeviceSetup) -> multihost.Processes | None:
    """This process's place when the XLA runtime spans several processes (`worker.multihost`),
    else None."""
    try:
        return multihost.join_runtime(spec, setup.parallel)
    except multihost.ShareError as exc:
        raise JobFailure(str(exc)) from None


def xla_cache_dir() -> Path:
    """The persistent XLA compilation cache: shared by every job this data folder serves."""
    return config.data_dir() / "xla_cache"


# --- the learner ----------------------------------------------------------------------------


def _architecture(name: str) -> Any:
    import torchvision.models

    return getattr(torchvision.models, name)


def _weights_file(arch: str) -> str:
    import torchvision.models

    url = torchvision.models.get_model_weights(arch).DEFAULT.url
    return url.rsplit("/", 1)[-1]


def _pretrained_unavailable(arch: str, exc: Exception) -> JobFailure:
    checkpoints = Path(torch.hub.get_dir()) / "checkpoints"
    weights = _weights_file(arch)
    return JobFailure(
        f"pretrained weights for {arch} ({weights}) are not in {checkpoints} and could not "
        f"be downloaded ({error_summary(exc)}). "
        f'Pre-fetch them on a machine with internet access: python -c "import torchvision; '
        f"torchvision.models.{arch}(weights='DEFAULT')\", then copy "
        f"~/.cache/torch/hub/checkpoints/{weights} to {checkpoints}/ on this worker "
        "(or submit with pretrained off)."
    )


def _no_print(*_args: Any) -> None:
    return None


def build_learner(
    dls: Any,
    spec: JobSpec,
    device: torch.device,
    job_dir: Path,
    parallel: DataParallel | None = None,
    prefetch: bool = True,
    read_every: int | None = None,
) -> Learner:
    """fastai's vision Learner, on the device, with the XLA step rules when it is XLA.

    On XLA each batch is loaded and copied ahead in a thread (`prefetch`), split over the SPMD
    mesh when `parallel` is given; `prefetch=False` leaves fastai's own loading in place. The
    loss and metrics stay on the device and are read every `read_every` training steps and at
    the end of each validation pass (`worker.device_values`; None: TRAINDECK_XLA_READ_EVERY)."""
    metrics: list[Any] = [accuracy, error_rate]
    if dls.c > 5:
        metrics.append(top_k_accuracy)  # k=5 by default
    try:
        learn = vision_learner(
            dls,
            _architecture(spec.arch),
            pretrained=spec.pretrained,
            metrics=metrics,
            wd=spec.wd,
            path=job_dir,
        )
    except (OSError, RuntimeError) as exc:
        if spec.pretrained and ("urlopen" in repr(exc) or isinstance(exc, OSError)):
            raise _pretrained_unavailable(spec.arch, exc) from exc
        raise
    learn.remove_cb(ProgressCallback)
    learn.logger = _no_print  # the telemetry callback logs each epoch to the job's log
    # The model must be on the device before the optimizer exists: on XLA, Module.to() makes
    # new Parameter objects, and an optimizer built earlier would keep updating the old ones.
    learn.model.to(device)
    learn.create_opt()
    if spec.grad_accum > 1:
        learn.add_cb(GradientAccumulation(n_acc=spec.bs * spec.grad_accum))
    if spec.grad_clip is not None:
        learn.add_cb(GradientClip(max_norm=spec.grad_clip))
    if spec.mixed_precision == "bf16":
        learn.add_cb(AutocastCallback(device.type))
    elif spec.mixed_precision == "fp16":
        learn.to_fp16()
    if device.type == "xla":
        learn.add_cb(XlaStepCallback())
        learn.add_cb(DeviceValuesCallback(read_every))
        if prefetch:
            learn.add_cb(PrefetchCallback(spmd.placement(device, parallel)))
        if parallel is not None:
            learn.add_cb(spmd.PartitionableBatchNormCallback())
    return learn


# --- the run --------------------------------------------------------------------------------


def run(ctx: TrainingContext) -> Path | None:
    """Train the job to the end and export it. Returns the export's path (None in a gang's
    process other than process 0, which exports).

    Raises StopRequested when asked to stop, JobFailure for a problem a person can fix.
    """
    spec = ctx.spec
    set_seed(spec.seed)
    setup = open_device(ctx.device_kind, spec.cores)
    gang.take_role(ctx)
    device, device_label = setup.device, setup.label
    hosts = _join_runtime(spec, setup) if device.type == "xla" else None
    kept = _graphs_kept(ctx) if device.type == "xla" else {}
    log.info("training %s on %s (%s)", spec.display_name, device_label, spec.dataset)
    if setup.parallel is not None:
        try:
            share = spmd.per_device_batch_size(spec.bs, setup.devices)
        except spmd.DeviceRequestError as exc:
            raise JobFailure(str(exc)) from None
        log.info(
            "data parallel over %d XLA devices (SPMD): each computes %d of the %d images of a "
            "batch; parameters are replicated",
            setup.devices,
            share,
            spec.bs,
        )

    # From the dataset's manifest: nothing is scanned or decoded before the first batch.
    items = ctx.db(lambda: load_items(ctx.engine, spec.dataset), "read the dataset")
    skipped = SkipRecord(ctx.job_dir / SKIP_RECORD_NAME)
    dls = build_dataloaders(items, spec, device, skipped)
    if hosts is not None:  # this process loads its share of each training batch
        dls = multihost.share_training(dls, spec, hosts)
    log.info(
        "%d training and %d validation images, %d classes, %d batches per epoch",
        len(dls.train_ds),
        len(dls.valid_ds),
        dls.c,
        len(dls.train),
    )
    learn = build_learner(dls, spec, device, ctx.job_dir, setup.parallel)
    if hosts is not None and setup.parallel is not None:
        multihost.prefetch_shares(learn, setup.parallel)
    watched = [("monitor", spec.monitor)]
    if ctx.trial is not None:
        watched.append(("the sweep's objective", ctx.trial.sweep.metric))
    for what, metric in watched:
        if metric == "top5_accuracy" and dls.c <= 5:
            raise JobFailure(
                f"{what} top5_accuracy: the dataset has {dls.c} classes, and top-5 accuracy "
                "is measured with more than 5; use accuracy instead"
            )
    clock = TrainingClock(total_epochs(spec), len(dls.train))
    best = BestEpochTracker(spec, clock)
    learn.add_cbs(
        [
            TelemetryCallback(ctx.writer, clock, device_label),
            InputWaitCallback(ctx.writer, clock),
            StopCallback(ctx.stop, ctx.parent_pid),
            SkippedFilesCallback(skipped),
        ]
    )
    if device.type == "xla":
        learn.add_cb(XlaReportCallback(ctx.writer, clock, str(xla_cache_dir()), kept))
    if any_armed():
        learn.add_cb(FailpointCallback())

    phases = schedule_phases(spec, 0.0)
    set_trainable(learn, phases[0])
    resume_from = 0
    distributed = (
        multihost.DistributedCheckpoints(
            ctx.lease.job_id, checkpoint_interval_s(spec), store.checkpoints_kept()
        )
        if hosts is not None
        else None
    )
    found = _newest_checkpoint(ctx, distributed)
    state, origin = found if found is not None else (None, None)
    if state is not None and _same_spec(state.get("spec"), spec):
        checkpoint.restore(learn, state, device)
        best.restore(state.get("tracker"))
        resume_from = state["epoch"] + 1
        lr = float(state["lr"])
        log.info("resuming from the checkpoint of epoch %d/%d", resume_from, clock.total_epochs)
        ctx.writer.add_event(
            "warning",
            f"resumed from the checkpoint after epoch {resume_from} (attempt {ctx.lease.lease}, "
            f"from {origin}); training continues at epoch {resume_from + 1}",
        )
    else:
        if ctx.lease.lease > 1:
            ctx.writer.add_event(
                "warning",
                f"attempt {ctx.lease.lease} found no checkpoint of this job, here or in the "
                "store: training starts again from epoch 1",
            )
        lr = find_learning_rate(learn, ctx) if spec.lr == "find" else float(spec.lr)

    # On an accelerator the checkpoint is written on a background thread while the next epoch
    # trains; training on the CPU writes it at the epoch's end (see CheckpointWriter).
    uploads = CheckpointUploader(
        ctx.lease.job_id, ctx.job_dir, ctx.writer.add_event, kept=store.checkpoints_kept()
    )
    checkpoints = distributed or checkpoint.CheckpointWriter(
        ctx.job_dir,
        background=device.type != "cpu",
        after_write=uploads.submit,
        interval_s=checkpoint_interval_s(spec),
    )

    def on_epoch_end(epoch: int) -> None:
        last_epoch = epoch + 1 == clock.total_epochs
        if ctx.primary and report_to_sweep(ctx, learn, epoch, last_epoch):
            ctx.pruned_at = epoch
        if hosts is not None:  # only process 0 asks the sweep's pruner; all stop alike
            ctx.pruned_at = multihost.from_process_0(ctx.pruned_at)
        stopping = best.stopped_at is not None or ctx.pruned_at is not None
        # The end of training writes a checkpoint only when a succeeded job keeps one: else it
        # would be deleted right after the export, and a stop or failure before the export
        # is done still writes the state kept in memory (below).
        final = (last_epoch or stopping) and store.keep_final_checkpoint()
        spec_json = spec.model_dump(mode="json")
        if ctx.primary or distributed is not None:  # a distributed one: every process writes
            checkpoints.save(
                learn, epoch=epoch, lr=lr, spec=spec_json, last=final, tracker=best.state()
            )
        if stopping:
            raise CancelFitException()  # fastai's way to end a fit, once the checkpoint is kept

    def ended() -> bool:
        return best.stopped_at is not None or ctx.pruned_at is not None

    epoch_end = EpochEndCallback(clock, on_epoch_end)
    divergence = DivergenceCallback(clock)
    profiler = ProfileCallback(
        ctx.engine, ctx.lease.job_id, clock, device, ctx.job_dir,
        lambda kind, path: publish(ctx, kind, path),
    ) if ctx.primary else None  # fmt: skip
    learn.add_cbs([epoch_end, divergence, best, *([profiler] if profiler else [])])
    try:
        try:
            _fit_phases(learn, spec, lr, resume_from, clock, epoch_end, divergence, ended, ctx.stop)
        finally:
            if profiler is not None:
                profiler.close()
        checkpoints.wait()  # the checkpoint in flight is on disk, or its failure is raised
        if ctx.pruned_at is not None and ctx.primary:
            raise prune(ctx, learn)
        if not ctx.primary:  # the export and the results are process 0's
            uploads.close()
            log.info("trained; the export and the results are process 0's")
            return None
        ctx.kept_epoch = keep_epoch(learn, best)
        if hosts is not None:
            multihost.unshare_training(learn.dls, spec.bs)
        export = export_model(learn, ctx.job_dir)
        if ctx.stop.is_set():
            export.unlink(missing_ok=True)
            raise StopRequested()
        published = publish(ctx, "export", export)
    except BaseException:
        # Stopped or failed, training or exporting: the write in flight still lands and the
        # newest epoch's state kept in memory is written, so a requeued job resumes from it;
        # their own failure would only hide the reason being raised.
        with contextlib.suppress(Exception):
            checkpoints.flush()
        uploads.wait(timeout=UPLOAD_WAIT_ON_STOP_S)
        uploads.close()
        raise
    _finish_checkpoints(ctx, uploads)
    log.info("exported the model to %s", published.path)
    record_results(ctx, learn)
    if ctx.stop.is_set():
        raise StopRequested()
    if ctx.trial is not None:
        trial, kept = ctx.trial, ctx.kept_epoch
        ctx.db(lambda: end_trial(ctx.engine, trial, "complete", kept), "end the sweep's trial")
    return export


def report_to_sweep(ctx: TrainingContext, learn: Learner, epoch: int, last: bool) -> bool:
    """A trial's objective after `epoch`, sent to its study; whether the pruner says stop (never
    after the `last` epoch: the trial is trained, it completes)."""
    trial = ctx.trial
    if trial is None:
        return False
    value = epoch_value(learn, trial.sweep.metric)
    return ctx.db(
        lambda: report_epoch(ctx.engine, trial, epoch, value, last), "report to the sweep's study"
    )


def prune(ctx: TrainingContext, learn: Learner) -> TrialPruned:
    """End the trial as pruned in its study; the exception that ends the job so."""
    trial, epoch = ctx.trial, ctx.pruned_at
    assert trial is not None and epoch is not None
    ctx.db(lambda: end_trial(ctx.engine, trial, "pruned"), "end the sweep's trial")
    sweep = trial.sweep
    return TrialPruned(
        f"pruned by the sweep's {sweep.pruner} pruner after epoch {epoch + 1}: "
        f"{sweep.metric} {epoch_value(learn, sweep.metric):.4f}; the last checkpoint is kept"
    )


def _newest_checkpoint(
    ctx: TrainingContext, distributed: multihost.DistributedCheckpoints | None
) -> tuple[Any, str] | None:
    """The checkpoint the job resumes from and where it was: a runtime of several processes
    reads its distributed checkpoint; every host of a gang the store's, so they all start
    alike; any other job the newer of this machine's copy and the store's."""
    if distributed is not None:
        return distributed.newest()
    return newest_checkpoint(
        ctx.job_dir, ctx.lease.job_id, ctx.writer.add_event, store_only=ctx.gang is not None
    )


def _same_spec(saved: Any, spec: JobSpec) -> bool:
    """Whether a checkpoint was written for this spec. Compared with the defaults filled in,
    so a checkpoint written before a field existed still resumes the job."""
    try:
        return JobSpec.model_validate(saved).model_dump() == spec.model_dump()
    except ValueError:
        return False


def keep_epoch(learn: Learner, best: BestEpochTracker) -> int:
    """Which epoch's model is exported, said in the job's log: the last epoch trained, or with
    keep=best the best one, whose weights are loaded back into the model."""
    last = best.stopped_at if best.stopped_at is not None else best.clock.total_epochs - 1
    if best.stopped_at is not None:
        log.info("%s", best.stop_line())
    if not best.keep_best or best.best_epoch is None or best.best_model is None:
        return last
    kept = best.best_epoch
    if kept == last:
        log.info(
            "keeping the model of epoch %d, the best by %s and the last", kept + 1, best.metric
        )
        return kept
    learn.model.load_state_dict(best.best_model)
    log.info(
        "keeping the model of epoch %d (%s %.4f), the best, not that of the last epoch %d",
        kept + 1,
        best.metric,
        best.best,
        last + 1,
    )
    return kept


def _graphs_kept(ctx: TrainingContext) -> dict[str, int]:
    """In a process that trained a job before this one: its XLA metrics restart from zero (so
    this job's reports count its own compiles) and the graphs compiled for the previous job,
    in memory, are counted for the XLA panel."""
    if ctx.previous_job is None:
        return {}
    from worker import xla_report

    kept = xla_report.restart_counting(ctx.previous_job)
    log.info(
        "%d compiled XLA graph(s) of job %d are kept in this process's memory: graphs this job "
        "shares with it are not compiled again",
        kept["graphs_kept"],
        ctx.previous_job,
    )
    return kept


def checkpoint_interval_s(spec: JobSpec) -> float:
    """Seconds between checkpoint writes: the job's own, else the worker's setting."""
    if spec.checkpoint_interval is not None:
        return float(spec.checkpoint_interval)
    return config.checkpoint_interval_s()


def _finish_checkpoints(ctx: TrainingContext, uploads: CheckpointUploader) -> None:
    """After success the job's checkpoints leave the store, unless they are to be kept; then
    the newest one is recorded as the job's checkpoint."""
    if not store.keep_final_checkpoint():
        uploads.close()
        with contextlib.suppress(store.StoreError):
            remove_uploaded(ctx.lease.job_id)
        return
    uploads.wait()
    uploads.close()
    pointer = store.read_json(store.checkpoint_pointer_key(ctx.lease.job_id))
    if pointer is not None:
        size = store.size(pointer["url"])
        job_id = ctx.lease.job_id
        ctx.db(
            lambda: record_artifact(
                ctx.engine, job_id, "checkpoint", pointer["url"], size, pointer["sha256"]
            ),
            "record the checkpoint",
        )


def _fit_phases(
    learn: Learner,
    spec: JobSpec,
    lr: float,
    resume_from: int,
    clock: TrainingClock,
    epoch_end: EpochEndCallback,
    divergence: DivergenceCallback,
    ended: Callable[[], bool],
    stop: threading.Event,
) -> None:
    """Train every phase of the schedule from global epoch `resume_from` on, until the end,
    an early stop or the sweep's pruner (`ended`)."""
    for phase in schedule_phases(spec, lr):
        if phase.end <= resume_from:
            continue
        if ended():
            break
        set_trainable(learn, phase, keep_state=resume_from > phase.offset)
        clock.epoch_offset = phase.offset
        learn.fit_one_cycle(
            phase.epochs,
            phase.lr,
            pct_start=phase.pct_start,
            div=phase.div,
            start_epoch=max(0, resume_from - phase.offset),
        )
        if epoch_end.failure is not None:
            raise epoch_end.failure
        if divergence.diverged is not None:
            raise JobFailure(divergence.diverged)
        if stop.is_set():
            raise StopRequested()
    if stop.is_set():
        raise StopRequested()


def set_trainable(learn: Learner, phase: Phase, keep_state: bool = False) -> None:
    """Freeze the pretrained body for a frozen phase, else train every layer.

    fastai's `Learner.freeze_to` also clears the optimizer's state (Adam's moments), as a new
    phase should start. A job resumed in the middle of a phase must keep the state its
    checkpoint restored (`keep_state`): cleared there, Adam restarted from zero moments at the
    schedule's peak rate and the resumed epoch trained worse than the one before it.
    """
    frozen_groups = -1 if phase.frozen else 0
    if keep_state:
        learn.opt.freeze_to(frozen_groups)
    else:
        learn.freeze_to(frozen_groups)


def find_learning_rate(learn: Learner, ctx: TrainingContext) -> float:
    """fastai's lr_find; the curve and its suggestion are stored as `lr_find/` metrics."""
    log.info("looking for a learning rate (lr_find, %d iterations)", LR_FIND_ITERATIONS)
    try:
        suggestion = lr_find(learn, LR_FIND_ITERATIONS)
    except Exception:
        if ctx.stop.is_set():
            raise StopRequested() from None
        raise
    if ctx.stop.is_set():
        raise StopRequested()
    lr = float(suggestion.valley)
    recorder = learn.recorder
    points = [
        MetricPoint(LR_FIND + "lr", step, float(value)) for step, value in enumerate(recorder.lrs)
    ]
    points += [
        MetricPoint(LR_FIND + "loss", step, float(value))
        for step, value in enumerate(recorder.losses)
    ]
    points.append(MetricPoint(LR_FIND + "suggestion", 0, lr))
    ctx.writer.add_points(points)
    ctx.writer.add_event("info", f"lr_find suggests lr = {lr:.3g} (valley); training with it")
    return lr


def lr_find(learn: Learner, num_it: int = LR_FIND_ITERATIONS) -> Any:
    """fastai's `lr_find` (no plot), which on XLA also puts the model back as it found it.

    fastai's LRFinder saves the model before it starts and loads it back at the end with
    `learn.load`, which maps the file to the DataLoaders' device; torch.load cannot map to an
    XLA device ("don't know how to restore data location … xla:0"). On XLA the file is read on
    the CPU and copied to the device: the model by `load_state_dict`, the optimizer's state by
    `to_device`.
    """
    device = learn.dls.device
    if getattr(device, "type", None) != "xla":
        return learn.lr_find(num_it=num_it, show_plot=False)

    def load_through_the_cpu(file: Any, device_: Any = None, **kwargs: Any) -> Learner:
        Learner.load(learn, file, device="cpu", **kwargs)
        if learn.opt is not None:
            learn.opt.load_state_dict(to_device(learn.opt.state_dict(), device))
        return learn

    learn.load = load_through_the_cpu
    try:
        return learn.lr_find(num_it=num_it, show_plot=False)
    finally:
        del learn.load


def export_model(learn: Learner, job_dir: Path) -> Path:
    """`learn.export()` with the model on the CPU, so it loads where torch_xla is absent."""
    keep = (TrainEvalCallback, Recorder)
    learn.remove_cbs([cb for cb in learn.cbs if not isinstance(cb, keep)])
    learn.model.to("cpu")
    learn.dls.to(torch.device("cpu"))
    learn.opt = None
    learn.logger = print  # not `_no_print`: the pickle must not name worker code to load
    final = job_dir / EXPORT_NAME
    temporary = job_dir / f".{EXPORT_NAME}.{os.getpid()}.tmp"
    try:
        learn.export(temporary)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        failpoint(EXPORT_TMP_WRITTEN)
        os.replace(temporary, final)
    except (OSError, RuntimeError) as exc:
        kept = checkpoint.checkpoint_path(job_dir)
        what = "the exported model" + (
            f" (the checkpoint {kept} is intact)" if kept.exists() else ""
        )
        raise checkpoint.write_failure(what, final, exc) from exc
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
    return final

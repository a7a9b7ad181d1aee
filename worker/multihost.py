"""One job trained by several processes of one XLA runtime: the hosts of a multi-host pod slice.

On a multi-host TPU slice every host runs the job's process (`worker.gang`) and libtpu joins
them into one runtime: `xr.process_count()` processes, each driving its own host's chips, in
one SPMD mesh over `xr.global_runtime_device_count()` devices (`spmd.DataParallel`). What
changes then is here; a runtime of one process (every single-host job, and each host's
process in the tests on one machine) uses none of it. As torch_xla documents the path:

- Data: each process loads only its share of every global batch of `spec.bs` images:
  `spec.bs / process_count` of them, its items of each pass taken as `DistributedSampler`
  takes them (`share_of`), from an order every process draws alike (`pass_order`).
- Placement: a share is copied to this process's devices as a minibatch,
  `xs.ShardingSpec(mesh, ('data', ...), minibatch=True)` through
  `xm.send_cpu_data_to_device` (what `MpDeviceLoader(input_sharding=...)` does): XLA takes it
  as this process's rows of the global batch, so each step sees the global batch.
- Validation: every process loads the whole validation batches and copies only its devices'
  part of each (`SharedBatchPrefetch`), because the last one is usually short: split into
  shares, each share must divide evenly over its host's devices, and padding it would count
  some images twice in the metrics.
- Checkpoints: torch_xla's distributed checkpoint (`CheckpointManager`, over a gloo process
  group) writes into the store's folder for the job, which every process reads on resume
  (`DistributedCheckpoints`).
- Choices that must be alike in every process (whether a checkpoint is written now, whether
  the sweep's pruner stopped the trial) are process 0's (`from_process_0`).

Only process 0 (by `xr.process_index()`) writes the job's rows and files (`gang.take_role`).
Tested here with a runtime of one process only (torch_xla's CPU backend runs one); a runtime
of several processes was not run.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch
from fastai.data.core import DataLoaders

from common import store
from common.errors import first_line
from db.spec import JobSpec
from worker import checkpoint, spmd
from worker.checkpoint_upload import CheckpointUnavailable
from worker.prefetch import PREFETCH_DEPTH, PrefetchCallback

log = logging.getLogger(__name__)

T = TypeVar("T")
SKELETON_KEY = "skeleton"
TENSOR_MARK = "__tensor__"


class ShareError(ValueError):
    """A job that cannot be shared among the runtime's processes (a message for people)."""


@dataclass(frozen=True)
class Processes:
    """This process's place in an XLA runtime of `count` processes."""

    index: int
    count: int


# --- the runtime ----------------------------------------------------------------------------


def join_runtime(spec: JobSpec, parallel: spmd.DataParallel | None) -> Processes | None:
    """When the XLA runtime spans several processes: this one's place, once the job is found
    shareable and torch.distributed's gloo group joined. None for a runtime of one process."""
    import torch_xla.runtime as xr

    count = int(xr.process_count())
    if count <= 1:
        return None
    check_shareable(spec, parallel, count, store.is_shared())
    join_process_group()
    processes = Processes(int(xr.process_index()), count)
    log.info(
        "process %d of %d of one XLA runtime: it loads %d of the %d images of each training batch",
        processes.index,
        count,
        spec.bs // count,
        spec.bs,
    )
    return processes


def check_shareable(
    spec: JobSpec, parallel: spmd.DataParallel | None, count: int, shared_store: bool
) -> None:
    """ShareError when a job cannot train across `count` processes as asked."""
    share_batch_size(spec.bs, count)
    if parallel is None:
        raise ShareError(
            f"cores {spec.cores}: a job across the {count} processes of a multi-host slice "
            "trains on every device of the slice; leave cores empty"
        )
    if not shared_store:
        raise ShareError(
            f"a job across {count} processes checkpoints into the store, which every host "
            "reads: set TRAINDECK_STORE to a gs:// bucket on every host"
        )


def join_process_group() -> None:
    """torch.distributed's default group, gloo, ranked by process index (`xla://` finds the
    peers from the XLA runtime): CheckpointManager and `from_process_0` need one; SPMD itself
    needs none. Once per process."""
    import torch.distributed as dist
    import torch_xla.distributed.xla_backend  # noqa: F401  (registers `xla://`)

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="xla://")


def from_process_0(value: T) -> T:
    """Process 0's `value`, in every process (a collective: every process must call it)."""
    import torch.distributed as dist

    carried = [value]
    dist.broadcast_object_list(carried, src=0)
    return carried[0]


# --- each process's share of the data -------------------------------------------------------


def share_batch_size(bs: int, processes: int) -> int:
    """How many images of each global batch of `bs` one of `processes` processes loads."""
    if bs % processes:
        raise ShareError(
            f"batch size {bs} cannot be shared evenly by the {processes} processes of this "
            f"slice: each host loads bs / {processes} images of every batch, so use a "
            f"multiple of {processes} (e.g. {spmd.nearest_multiples(bs, processes)})"
        )
    return bs // processes


def pass_order(items: int, seed: int, pass_number: int) -> np.ndarray:
    """The shuffled order of `items` items for one training pass, drawn alike in every process
    from the job's seed and the pass's number (fastai draws each DataLoader's own, which
    processes would not share)."""
    return np.random.default_rng([seed, pass_number]).permutation(items)


def share_of(order: np.ndarray, index: int, count: int) -> np.ndarray:
    """Process `index`'s share of a pass's `order`, as `DistributedSampler(drop_last=True)`
    takes it: every `count`-th item from position `index`, cut so all shares are as long.

    With local batches of bs / count, batch b of every share together hold exactly the items
    `order[b*bs:(b+1)*bs]`: the global batch of one process training on the same order."""
    if not 0 <= index < count:
        raise ValueError(f"process index {index} is not one of {count} processes")
    length = len(order) // count
    return order[index : length * count : count]


@dataclass
class ProcessShare:
    """A training DataLoader's `get_idxs`: this process's share of each pass. fastai's copies
    of the loader (`new`: the prefetcher's per pass) keep this object and count passes on it."""

    items: int
    index: int
    count: int
    seed: int
    passes: int = 0

    @property
    def length(self) -> int:
        return self.items // self.count

    def __call__(self) -> list[int]:
        order = pass_order(self.items, self.seed, self.passes)
        self.passes += 1
        return share_of(order, self.index, self.count).tolist()


def share_training(dls: DataLoaders, spec: JobSpec, processes: Processes) -> DataLoaders:
    """The job's DataLoaders with the training loader loading this process's share only."""
    train = dls.train
    share = ProcessShare(len(train.dataset), processes.index, processes.count, spec.seed)
    local_bs = share_batch_size(spec.bs, processes.count)
    dls.train = train.new(bs=local_bs, n=share.length, get_idxs=share)
    draw_apart(dls.train, spec.seed, processes.index)
    return dls


def unshare_training(dls: DataLoaders, bs: int) -> None:
    """The training loader as one process's again (fastai's own order, `bs` a batch), before
    the export pickles the DataLoaders: a pickle that names this module would not load where
    the worker's code is absent."""
    dls.train = dls.train.new(bs=bs, get_idxs=None)  # None: the class's own `get_idxs`


def draw_apart(dl: Any, seed: int, index: int) -> None:
    """Each process draws its own augmentations. The XLA augmentation's generator is seeded
    by the job's seed alone: every process would give the image at the same place of its
    share the same flip, rotation and lighting."""
    for tfm in getattr(dl.after_batch, "fs", []):
        if hasattr(tfm, "host_inputs") and hasattr(tfm, "rng"):
            tfm.rng = np.random.default_rng([seed, index])


# --- placement ------------------------------------------------------------------------------


@dataclass
class ShareSender:
    """Copies this process's share of a global batch to its own devices as a minibatch: XLA
    takes it as this process's rows of a batch `process_count` times as long."""

    parallel: spmd.DataParallel
    _specs: dict[int, Any] = field(default_factory=dict, repr=False)

    def spec(self, dims: int) -> Any:
        """Dimension 0 split over the mesh as a minibatch, the others whole (None: scalar)."""
        if dims == 0:
            return None
        if dims not in self._specs:
            import torch_xla.distributed.spmd as xs

            partition = (spmd.MESH_AXIS,) + (None,) * (dims - 1)
            self._specs[dims] = xs.ShardingSpec(self.parallel.mesh, partition, minibatch=True)
        return self._specs[dims]

    def __call__(self, batch: Any) -> Any:
        return spmd.send_to_device(batch, self.parallel.device, self.spec)


class SharedBatchPrefetch(PrefetchCallback):
    """The prefetcher of a job across processes: training batches are this process's shares,
    copied as minibatches; validation batches are whole in every process, and each process
    copies its devices' part of them (see the module's docstring for why)."""

    def __init__(self, parallel: spmd.DataParallel, depth: int = PREFETCH_DEPTH):
        super().__init__(parallel.send, depth)
        self.shares: Callable[[Any], Any] = ShareSender(parallel)
        self.wholes: Callable[[Any], Any] = parallel.send

    def before_train(self) -> None:
        self.place = self.shares
        super().before_train()

    def before_validate(self) -> None:
        self.place = self.wholes
        super().before_validate()


def prefetch_shares(learn: Any, parallel: spmd.DataParallel) -> None:
    """Put `SharedBatchPrefetch` in place of the Learner's one-process prefetcher."""
    learn.remove_cb(PrefetchCallback)
    learn.add_cb(SharedBatchPrefetch(parallel))


# --- checkpoints ----------------------------------------------------------------------------


def split_tensors(state: Any) -> dict[str, torch.Tensor]:
    """A checkpoint's state (`checkpoint.checkpoint_state`) as the flat dict of tensors that
    torch.distributed.checkpoint writes: each tensor on the CPU under a key of its own, and
    the rest (epoch, spec, hyper-parameters) pickled into one uint8 tensor, the skeleton."""
    tensors: dict[str, torch.Tensor] = {}

    def visit(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            key = f"tensor/{len(tensors)}"
            tensors[key] = value.detach().cpu()
            return {TENSOR_MARK: key}
        if isinstance(value, dict):
            return {name: visit(item) for name, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(visit(item) for item in value)
        return value

    skeleton = pickle.dumps(visit(state))
    tensors[SKELETON_KEY] = torch.frombuffer(bytearray(skeleton), dtype=torch.uint8)
    return tensors


def join_tensors(tensors: dict[str, torch.Tensor]) -> Any:
    """The state `split_tensors` split, whole again."""
    skeleton = pickle.loads(tensors[SKELETON_KEY].numpy().tobytes())

    def visit(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {TENSOR_MARK}:
                return tensors[value[TENSOR_MARK]]
            return {name: visit(item) for name, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(visit(item) for item in value)
        return value

    return visit(skeleton)


def empty_like_saved(url: str) -> dict[str, torch.Tensor]:
    """Tensors of the shapes and types a distributed checkpoint at `url` holds, on the CPU, for
    it to be read into (torch.distributed.checkpoint reads into the tensors it is given)."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FsspecReader(url).read_metadata()
    return {
        key: torch.empty(item.size, dtype=item.properties.dtype)
        for key, item in metadata.state_dict_metadata.items()
        if isinstance(item, TensorStorageMetadata)
    }


class DistributedCheckpoints:
    """A multi-process job's checkpoints, in the store, through torch_xla's CheckpointManager:
    one folder per epoch (`store.distributed_checkpoint_url`), the newest `kept` of them kept.

    Written at an epoch's end once `interval_s` has passed since the last write (or when told
    it is the `last`), as `checkpoint.CheckpointWriter` does, but by every process together (a
    collective), so process 0's clock decides. The model is replicated on every device, so the
    state is copied to the host and each process reads all of it back on resume, into the
    same checkpoint dict the one-process path reads (`checkpoint.restore` then loads it).
    Synchronous: the epoch waits for the write. Nothing is kept for a `flush`: a stopping or
    failed process cannot be counted on to join a write. Preemption checkpoints
    (`chkpt_on_preemption`) stay off: a preempted slice's job is requeued whole, from the
    newest epoch's checkpoint.
    """

    def __init__(
        self,
        job_id: int,
        interval_s: float = 0.0,
        kept: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ):
        from torch_xla.experimental.distributed_checkpoint import CheckpointManager

        self.url = store.distributed_checkpoint_url(job_id)
        try:  # it lists the checkpoints in the store
            self.manager = CheckpointManager(
                self.url, save_interval=1, max_to_keep=kept, chkpt_on_preemption=False
            )
        except Exception as exc:
            raise unavailable(self.url, exc) from exc
        self.interval = checkpoint.WriteInterval(interval_s, clock)

    def save(
        self,
        learn: Any,
        *,
        epoch: int,
        lr: float,
        spec: dict[str, Any],
        last: bool = False,
        tracker: dict[str, Any] | None = None,
    ) -> None:
        """In every process at `epoch`'s end: the state after it, written if it is due."""
        if not from_process_0(self.interval.due(last)):
            return
        state = checkpoint.checkpoint_state(learn, epoch=epoch, lr=lr, spec=spec, tracker=tracker)
        try:
            self.manager.save(epoch, split_tensors(state), force=True)
        except Exception as exc:
            raise checkpoint.ArtifactWriteError(
                f"cannot write the distributed checkpoint of epoch {epoch + 1} to "
                f"{self.url}/{epoch}: {first_line(exc)}"
            ) from exc
        self.interval.written()
        log.info("distributed checkpoint of epoch %d written to %s/%d", epoch + 1, self.url, epoch)

    def flush(self) -> None:
        return None

    def wait(self) -> None:
        return None

    def newest(self) -> tuple[dict[str, Any], str] | None:
        """The newest checkpoint's state and where it is, or None when there is none."""
        steps = self.manager.all_steps()
        if not steps:
            return None
        where = f"{self.url}/{steps[-1]}"
        try:
            tensors = empty_like_saved(where)
            self.manager.restore(steps[-1], tensors)
        except Exception as exc:
            raise unavailable(where, exc) from exc
        return join_tensors(tensors), where


def unavailable(url: str, exc: BaseException) -> CheckpointUnavailable:
    return CheckpointUnavailable(
        f"cannot read the distributed checkpoints at {url}, from which every process "
        f"resumes: {first_line(exc)}"
    )

"""Data parallelism over the XLA devices of this machine: SPMD in the one training process.

After `torch_xla.runtime.use_spmd()` the process sees one virtual device. A 1-D mesh over the
physical devices names the batch axis `data`; each input batch is copied to the devices split
along its first dimension, and everything else (parameters, optimizer state) is replicated,
SPMD's default. XLA's partitioner turns the one traced step into a per-device program and
inserts the all-reduces (of the gradients, and of batch norm's statistics, which is why batch
norm runs as plain reductions during the fit: `partitionable_batch_norm`), so fastai's Learner,
callbacks and metrics still see one model and one global batch, and the numbers match a run on
one device.

SPMD needs every device the runtime opened in its mesh (torch_xla asserts it). So `cores` picks
how many the runtime opens: on the CPU (`PJRT_DEVICE=CPU`) by `CPU_NUM_DEVICES`, set before the
runtime starts; on a TPU one core (no SPMD) or all of them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from fastai.callback.core import Callback
from fastai.torch_core import retain_types
from torch import nn

from worker.layer_forward import override_forward, restore_forward

MESH_AXIS = "data"
CPU_DEVICES_VARIABLE = "CPU_NUM_DEVICES"


class DeviceRequestError(ValueError):
    """The job asks for devices or a batch split this worker cannot give (a message for people)."""


def narrow_cpu_devices(cores: int | None) -> None:
    """On XLA's CPU backend, open only `cores` virtual devices. Call before the runtime starts.

    A worker started with CPU_NUM_DEVICES=N offers N devices; a job asking for more is refused
    later, when the runtime has counted them.
    """
    if cores is None or os.environ.get("PJRT_DEVICE", "").upper() != "CPU":
        return
    configured = os.environ.get(CPU_DEVICES_VARIABLE, "1")
    try:
        offered = int(configured)
    except ValueError:
        raise DeviceRequestError(
            f"{CPU_DEVICES_VARIABLE}={configured!r} on this worker is not a whole number of "
            "devices; restart the worker with e.g. CPU_NUM_DEVICES=2"
        ) from None
    if cores <= offered:
        os.environ[CPU_DEVICES_VARIABLE] = str(cores)


def devices_to_use(cores: int | None, available: int, device_type: str) -> int:
    """How many of the `available` devices a job asking for `cores` trains on."""
    if cores is None:
        return available
    if cores > available:
        hint = "leave cores empty to use them all" if available > 1 else "use cores 1"
        raise DeviceRequestError(
            f"cores {cores}: this worker has {available} XLA {device_type} "
            f"device{'s' if available != 1 else ''}; {hint}"
        )
    if 1 < cores < available:
        raise DeviceRequestError(
            f"cores {cores}: on this worker's {device_type} SPMD spans every device the "
            f"process opens, so a job trains on 1 core or on all {available}; "
            f"use cores 1 or {available}, or leave it empty for all"
        )
    return cores


def per_device_batch_size(bs: int, devices: int) -> int:
    """The share of a global batch of `bs` images each device computes."""
    if bs % devices:
        raise DeviceRequestError(
            f"batch size {bs} cannot be split evenly over {devices} XLA devices: the global "
            f"batch is divided among them, so use a multiple of {devices} "
            f"(e.g. {nearest_multiples(bs, devices)})"
        )
    return bs // devices


def nearest_multiples(bs: int, parts: int) -> str:
    """The batch sizes next to `bs` that `parts` divide, for a message: "48 or 64"."""
    lower = bs - bs % parts
    return " or ".join(str(size) for size in (lower, lower + parts) if size > 0)


@dataclass
class DataParallel:
    """A 1-D mesh over `devices` XLA devices, and how to place a host batch on it."""

    devices: int
    device: torch.device
    mesh: Any
    _specs: dict[int, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def over_all_devices(cls) -> DataParallel:
        """Turn SPMD on (before any XLA tensor exists) and mesh every device of the runtime."""
        import numpy as np
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        if not xr.is_spmd():  # a kept job process turned it on for its previous job
            xr.use_spmd()
        devices = xr.global_runtime_device_count()
        mesh = xs.Mesh(np.arange(devices), (devices,), (MESH_AXIS,))
        return cls(devices=devices, device=torch_xla.device(), mesh=mesh)

    def batch_spec(self, dims: int) -> Any:
        """Split dimension 0 over the mesh, keep the others whole (None for a scalar)."""
        if dims == 0:
            return None
        if dims not in self._specs:
            import torch_xla.distributed.spmd as xs

            self._specs[dims] = xs.ShardingSpec(self.mesh, (MESH_AXIS,) + (None,) * (dims - 1))
        return self._specs[dims]

    def send(self, batch: Any) -> Any:
        """Copy a host batch to the devices, each getting its slice of the batch dimension,
        straight from the host to each device's shard (no full copy first). Plain tensors, safe
        on a loading thread: `send_to_device`."""
        return send_to_device(batch, self.device, self.batch_spec)

    def place(self, batch: Any) -> Any:
        """`send`, keeping fastai's tensor types (TensorImage, TensorCategory). For one thread:
        the types are restored with XLA operations (`send_to_device` says why that matters)."""
        return retain_types(self.send(batch), batch)


def partitionable_batch_norm(module: nn.modules.batchnorm._BatchNorm, x: torch.Tensor) -> Any:
    """Batch norm in training, from plain reductions that XLA's SPMD partitioner splits.

    torch_xla lowers batch norm to XLA's `batch-norm-training` op, which the partitioner does
    not split over a sharded batch: it gathers the whole batch on every device and each
    device then computes the whole network (seen on XLA's CPU backend: per-device work did
    not fall at all). Means and variances as reductions are split, with one all-reduce each.
    The arithmetic is nn.BatchNorm's: biased variance to normalise, unbiased in the running
    estimate, `momentum` as the update weight.
    """
    if not module.training or module.momentum is None or not module.track_running_stats:
        return type(module).forward(module, x)
    dims = [0, *range(2, x.dim())]
    statistics_input = x.float()  # in bf16 (autocast) the statistics would lose precision
    mean = statistics_input.mean(dims)
    variance = statistics_input.var(dims, unbiased=False)
    with torch.no_grad():
        count = x.numel() / x.size(1)
        module.num_batches_tracked.add_(1)
        module.running_mean.mul_(1 - module.momentum).add_(module.momentum * mean)
        unbiased = variance * (count / max(count - 1, 1))
        module.running_var.mul_(1 - module.momentum).add_(module.momentum * unbiased)
    shape = [1, -1] + [1] * (x.dim() - 2)
    normalised = (x - mean.view(shape)) * torch.rsqrt(variance.view(shape) + module.eps)
    if module.affine:
        normalised = normalised * module.weight.view(shape) + module.bias.view(shape)
    return normalised.to(x.dtype)


def is_batch_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.batchnorm._BatchNorm)


class PartitionableBatchNormCallback(Callback):
    """While a fit runs, the model's batch-norm layers compute as `partitionable_batch_norm`.

    The layers keep their class, parameters and buffers (checkpoints and the export are plain
    torchvision/fastai modules); only an instance `forward` is set, and taken away after the
    fit, so nothing of it is pickled into the export.
    """

    order = -25

    def before_fit(self) -> None:
        self.layers = override_forward(self.learn.model, is_batch_norm, partitionable_batch_norm)

    def after_fit(self) -> None:
        restore_forward(self.layers)
        self.layers = []


def send_to_device(
    batch: Any, device: torch.device, spec_for: Callable[[int], Any] | None = None
) -> Any:
    """Copy the tensors of a host batch to the XLA device(s) as plain tensors, each split as
    `spec_for(its number of dimensions)` says (None: whole, on the one device).

    Safe on a loading thread while the training thread traces and syncs: each tensor is made
    by `xm.send_cpu_data_to_device`, as torch_xla's own loaders do, which uploads the data and
    only then creates the XLA tensor around it, and nothing else touches it in this thread.
    `tensor.to(device)` (fastai's `to_device`) instead creates an empty tensor first, a pending
    computation already among the live tensors, then uploads and sets its value. A
    `torch_xla.sync()` on the training thread in between (one per batch) takes the half-made
    tensor into its graph: it can donate the batch's fresh buffer (the next step then fails,
    "buffer ... is deleted"), write the graph's zeros into it, or add a graph output (one more
    compile). fastai's types are left off for the same reason: restoring one (`as_subclass`)
    runs an XLA operation on the tensor; the prefetcher restores them on the training thread.
    """
    import torch_xla.core.xla_model as xm

    def one(tensor: torch.Tensor) -> torch.Tensor:
        # send_cpu_data_to_device copies plain tensors only: it leaves a TensorImage on the host.
        plain = tensor.as_subclass(torch.Tensor)
        spec = spec_for(plain.dim()) if spec_for is not None else None
        (moved,) = xm.send_cpu_data_to_device([plain], device, spec)
        return moved

    return _map_tensors(one, batch)


def _map_tensors(function: Callable[[torch.Tensor], Any], batch: Any) -> Any:
    """`function` applied to each tensor of a (nested) tuple, list or dict; the rest kept."""
    if isinstance(batch, torch.Tensor):
        return function(batch)
    if isinstance(batch, (list, tuple)):
        return type(batch)([_map_tensors(function, item) for item in batch])
    if isinstance(batch, dict):
        return {key: _map_tensors(function, value) for key, value in batch.items()}
    return batch


def placement(device: torch.device, parallel: DataParallel | None) -> Callable[[Any], Any]:
    """How the prefetch thread copies a host batch to where training reads it (plain tensors:
    the prefetcher restores fastai's types on the training thread)."""
    if parallel is not None:
        return parallel.send
    return functools.partial(send_to_device, device=device)


def local_batch_shapes(tensor: torch.Tensor) -> list[tuple[int, ...]]:
    """The shape of the slice of `tensor` each device holds (for measurements and tests)."""
    import torch_xla

    (shards,) = torch_xla._XLAC._get_local_shards([tensor])
    return [tuple(shard.shape) for shard, _device in shards]

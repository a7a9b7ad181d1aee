"""`worker.multihost` with a real XLA runtime of one process (XLA's CPU backend, two devices), in
a fresh process: the runtime and SPMD are set once per process. Prints one JSON line.

    PJRT_DEVICE=CPU CPU_NUM_DEVICES=2 MASTER_PORT=N python -m tests.worker.multihost_probe DIR

With TRAINDECK_STORE on the Cloud Storage emulator (STORAGE_EMULATOR_HOST). torch_xla's CPU
backend runs one process only: the group and the runtime here are of one process, so this
checks the pieces (minibatch placement, the share's loader in a fit, the distributed
checkpoint through the store), not training across processes.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

JOB_ID = 7


def _placement(parallel: Any) -> dict[str, Any]:
    """A host batch placed as this process's minibatch: each device's rows, and a batch whose
    rows do not divide over this process's devices refused, as minibatch placement does."""
    import torch

    from worker import multihost, spmd

    send = multihost.ShareSender(parallel)
    batch = torch.arange(8 * 3 * 4 * 4, dtype=torch.float32).reshape(8, 3, 4, 4)
    placed = send(batch)
    try:
        send(torch.zeros(3, 2))
        refusal = ""
    except RuntimeError as exc:
        refusal = str(exc)
    return {
        "shapes": spmd.local_batch_shapes(placed),
        "global_shape": list(placed.shape),
        "values_kept": bool(torch.equal(placed.cpu(), batch)),
        "uneven_refused": refusal,
    }


def _cpu_state(learn: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    model = {name: value.detach().cpu() for name, value in learn.model.state_dict().items()}
    optimizer = [
        {name: value.cpu() if hasattr(value, "cpu") else value for name, value in entry.items()}
        for entry in learn.opt.state_dict()["state"]
    ]
    return model, optimizer


def _same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def main() -> None:
    data_dir = Path(sys.argv[1])

    import torch
    from fastai.callback.core import Callback
    from fastai.torch_core import set_seed

    from common import store
    from datasets.labelling import scan_items
    from db.spec import JobSpec
    from tests.support.workers import digits_subset
    from worker import checkpoint, multihost
    from worker.data import build_dataloaders
    from worker.training import build_learner, export_model, open_device

    (data_dir / "job").mkdir(parents=True, exist_ok=True)
    setup = open_device("xla")
    assert setup.parallel is not None, "two CPU devices: SPMD"
    multihost.join_process_group()  # gloo by `xla://`: a group of this one process
    figures: dict[str, Any] = {"placement": _placement(setup.parallel)}
    figures["from_process_0"] = multihost.from_process_0({"pruned_at": 3})

    class GlobalBatches(Callback):
        """The training batches' sizes as the step sees them (shapes only: nothing read)."""

        def __init__(self) -> None:
            self.sizes: list[int] = []

        def before_batch(self) -> None:
            if self.training:
                self.sizes.append(int(self.learn.xb[0].shape[0]))

    spec = JobSpec(bs=8, img_size=16, device="xla", epochs=1, augment=True)
    items = scan_items(digits_subset(data_dir, 4), {"type": "folder"})
    set_seed(spec.seed)
    dls = build_dataloaders(items, spec, setup.device)
    dls = multihost.share_training(dls, spec, multihost.Processes(0, 1))
    learn = build_learner(dls, spec, setup.device, data_dir / "job", setup.parallel)
    multihost.prefetch_shares(learn, setup.parallel)
    seen = GlobalBatches()
    learn.add_cb(seen)
    learn.fit(1, 1e-3)
    figures["fit"] = {
        "batches": seen.sizes,
        "prefetchers": [type(cb).__name__ for cb in learn.cbs if "Prefetch" in type(cb).__name__],
        "local_bs": learn.dls.train.bs,
    }

    written = multihost.DistributedCheckpoints(JOB_ID, interval_s=0.0, kept=2)
    spec_json = spec.model_dump(mode="json")
    tracker = {"best": 0.25, "best_epoch": 0, "wait": 0, "stopped_at": None, "best_model": None}
    written.save(learn, epoch=0, lr=1e-3, spec=spec_json, tracker=tracker)
    trained_model, trained_optimizer = _cpu_state(learn)

    # A fresh Learner with other initial weights, restored as a resumed attempt would be: a new
    # manager finds the checkpoint in the store, and every tensor is read back from there.
    set_seed(spec.seed + 1)
    fresh = build_learner(dls, spec, setup.device, data_dir / "fresh", setup.parallel)
    before, _ = _cpu_state(fresh)
    found = multihost.DistributedCheckpoints(JOB_ID, interval_s=0.0, kept=2).newest()
    assert found is not None, "no distributed checkpoint found in the store"
    state, where = found
    checkpoint.restore(fresh, state, setup.device)
    restored_model, restored_optimizer = _cpu_state(fresh)
    figures["checkpoint"] = {
        "where": where,
        "stored": store.list_keys(f"jobs/{JOB_ID}/checkpoints/distributed"),
        "differed_before": not _same(before, trained_model),
        "model_equal": _same(restored_model, trained_model),
        "optimizer_equal": _same(restored_optimizer, trained_optimizer),
        "optimizer_tensors": sum(
            isinstance(value, torch.Tensor)
            for entry in trained_optimizer
            for value in entry.values()
        ),
        "epoch": state["epoch"],
        "lr": state["lr"],
        "spec_equal": state["spec"] == spec_json,
        "tracker": state["tracker"],
        "classes": state["classes"],
    }
    # The export pickles the DataLoaders: with the one-process loader back, it names no share.
    shared_pickle = pickle.dumps(learn.dls.new_empty())
    multihost.unshare_training(learn.dls, spec.bs)
    exported = export_model(learn, data_dir / "job").read_bytes()
    figures["export"] = {
        "shared_names_multihost": b"worker.multihost" in shared_pickle,
        "train_bs": learn.dls.train.bs,
        "names_multihost": b"worker.multihost" in exported,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

"""Small XLA programs the perf tests run in fresh processes (the XLA runtime, SPMD and the
compilation cache are set once per process). Each prints one JSON line.

    python -m tests.perf.xla_probe place     # a fastai batch placed over the SPMD mesh
    python -m tests.perf.xla_probe compile   # one small training step, with the data folder's cache
    python -m tests.perf.xla_probe train     # a small batch-norm CNN on the digits, fastai's fit
    python -m tests.perf.xla_probe reports   # the summary read right after each of many steps
"""

from __future__ import annotations

import json
import sys


def place() -> dict:
    import torch
    from fastai.torch_core import TensorCategory, TensorImage

    from worker import spmd
    from worker.training import open_device

    setup = open_device("xla")
    images = TensorImage(torch.arange(32 * 3 * 8 * 8, dtype=torch.uint8).reshape(32, 3, 8, 8))
    labels = TensorCategory(torch.arange(32) % 10)
    placed_images, placed_labels = setup.parallel.place((images, labels))
    return {
        "label": setup.label,
        "devices": setup.devices,
        "types": [type(placed_images).__name__, type(placed_labels).__name__],
        "device": str(placed_images.device),
        "image_shards": spmd.local_batch_shapes(placed_images),
        "label_shards": spmd.local_batch_shapes(placed_labels),
        "round_trip": bool(
            torch.equal(placed_images.cpu(), images) and torch.equal(placed_labels.cpu(), labels)
        ),
    }


def compile_step() -> dict:
    import torch
    import torch_xla

    from worker import xla_report
    from worker.training import open_device

    setup = open_device("xla")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 10)).to(setup.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        inputs = torch.randn(8, 3, 4, 4).to(setup.device)
        loss = model(inputs).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch_xla.sync()
    summary = xla_report.read_summary()
    summary["loss"] = float(loss.detach().cpu())
    return summary


STEPS = 1000


def reports() -> dict:
    """Many small SPMD steps, each followed by a host read of its result and a summary: the
    moment the epoch-end report is read, repeated until a read between an execution's dispatch
    and its completion callback would have been caught (about 1 read in 40 before the wait)."""
    import torch
    import torch_xla

    from worker import xla_report
    from worker.training import open_device

    setup = open_device("xla")
    weights = torch.randn(256, 256).to(setup.device)
    mismatched = []
    for step in range(STEPS):
        weights = (weights @ torch.randn(256, 256).to(setup.device)).tanh()
        total = weights.sum()
        torch_xla.sync()
        total.item()
        summary = xla_report.read_summary()
        if summary["device_syncs"] != summary["execute_count"]:
            mismatched.append([step, summary["device_syncs"], summary["execute_count"]])
    return {"label": setup.label, "reads": STEPS, "mismatched": mismatched}


def train() -> dict:
    """The worker's data pipeline, device setup and XLA callbacks around a small batch-norm CNN
    (resnet18 takes minutes to compile on XLA's CPU backend), trained on all the digits."""
    import torch
    from fastai.learner import Learner
    from fastai.losses import CrossEntropyLossFlat
    from fastai.metrics import accuracy
    from fastai.torch_core import set_seed

    from datasets.builtin import ensure_digits
    from datasets.labelling import scan_items
    from db.spec import JobSpec
    from worker import spmd
    from worker.callbacks import XlaStepCallback
    from worker.data import build_dataloaders
    from worker.prefetch import PrefetchCallback
    from worker.training import open_device

    spec = JobSpec(img_size=8, bs=64, seed=7, device="xla")
    setup = open_device("xla")
    set_seed(spec.seed)
    dls = build_dataloaders(scan_items(ensure_digits(), {"type": "folder"}), spec, setup.device)

    def block(inputs: int, outputs: int) -> list[torch.nn.Module]:
        conv = torch.nn.Conv2d(inputs, outputs, 3, padding=1, bias=False)
        return [conv, torch.nn.BatchNorm2d(outputs), torch.nn.ReLU()]

    model = torch.nn.Sequential(
        *block(3, 16), *block(16, 32), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(32, dls.c),
    ).to(setup.device)  # fmt: skip
    learn = Learner(dls, model, loss_func=CrossEntropyLossFlat(), metrics=accuracy)
    learn.add_cbs(
        [XlaStepCallback(), PrefetchCallback(spmd.placement(setup.device, setup.parallel))]
    )
    if setup.parallel is not None:  # as `worker.training.build_learner` does
        learn.add_cb(spmd.PartitionableBatchNormCallback())
    with learn.no_logging(), learn.no_bar():
        learn.fit_one_cycle(4, 1e-2)
    return {
        "label": setup.label,
        "losses": [float(loss) for loss in learn.recorder.losses],
        "accuracy": float(learn.recorder.values[-1][2]),
        "valid_images": len(dls.valid_ds),
    }


PROBES = {"place": place, "compile": compile_step, "train": train, "reports": reports}

if __name__ == "__main__":
    print(json.dumps(PROBES[sys.argv[1]]()))

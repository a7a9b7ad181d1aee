"""The prefetch thread's placement race on XLA's CPU backend: `tensor.to(device)` vs the worker's.

    .venv/bin/python -m bench.xla_place_race [--steps 3000] [--rounds 2]

A tiny model trains on random 16 px uint8 batches that `worker.prefetch.DevicePrefetcher` loads
and copies ahead in its thread, with one `torch_xla.sync()` a step on the training thread (as
`XlaStepCallback`). Each step also sums its batch on the device; the sums are read every 50
steps and compared with the host's. Two arms alternate, `--rounds` times each:
  to_device  fastai's `to_device` (`tensor.to(device)`) in the loading thread, as before the fix
  worker     `worker.spmd.placement` (`xm.send_cpu_data_to_device`), what the worker uses
Prints per round the batches whose device copy differed from the host (a sync on the training
thread caught the copy half-made), the error that ended the round if one did, and the graphs
compiled. A thread race: the to_device counts vary from run to run; the worker's must be 0.
"""

from __future__ import annotations

import argparse
import gc
import os
from typing import Any

from common.entry import run_main

BATCH, BATCHES, CHECK_EVERY = 64, 8, 50


def train(place: Any, steps: int) -> tuple[int, str]:
    """`steps` steps over batches placed by `place`. Returns (batches wrong, error or '')."""
    import torch
    import torch_xla
    from fastai.data.core import TfmdDL
    from fastai.torch_core import TensorCategory, TensorImage

    from worker.callbacks import YOUNG_GENERATIONS
    from worker.device_values import read_to_host
    from worker.prefetch import DevicePrefetcher

    device = torch_xla.device()
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (BATCH * BATCHES, 3, 16, 16), generator=generator)
    images = images.to(torch.uint8)
    items = [(TensorImage(image), TensorCategory(i % 10)) for i, image in enumerate(images)]
    sums = [int(images[i * BATCH : (i + 1) * BATCH].sum()) for i in range(BATCHES)]
    dl = TfmdDL(items, bs=BATCH, num_workers=0)  # as the worker on XLA: no forked loaders
    model = torch.nn.Linear(3 * 16 * 16, 10).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    wrong, done, checks = 0, 0, []

    def check() -> int:
        values = read_to_host([total for _, total in checks])
        return sum(
            int(value) != sums[index] for (index, _), value in zip(checks, values, strict=True)
        )

    try:
        while done < steps:
            for index, (xb, _) in enumerate(DevicePrefetcher(dl, place)):
                x = xb.as_subclass(torch.Tensor)
                model(x.float().flatten(1) / 255).square().mean().backward()
                opt.step()
                opt.zero_grad()
                checks.append((index, x.to(torch.int64).sum()))
                gc.collect(YOUNG_GENERATIONS)
                torch_xla.sync()
                done += 1
                if len(checks) == CHECK_EVERY:
                    wrong, checks = wrong + check(), []
                if done == steps:
                    break
    except RuntimeError as exc:
        return wrong, str(exc).strip().splitlines()[0][:160]
    return wrong + (check() if checks else 0), ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("PJRT_DEVICE", "CPU")

    import torch_xla
    import torch_xla.debug.metrics as met
    from fastai.torch_core import to_device

    from worker import spmd

    device = torch_xla.device()
    arms = {
        "to_device": lambda batch: to_device(batch, device),
        "worker": spmd.placement(device, None),
    }
    print(f"placement race: {args.steps} steps of {BATCH} 16 px images a round, XLA on the CPU")
    for round_index in range(args.rounds):
        for name, place in arms.items():
            compiles = met.metric_data("CompileTime")[0] if met.metric_data("CompileTime") else 0
            wrong, error = train(place, args.steps)
            compiled = met.metric_data("CompileTime")[0] - compiles
            ended = f"; ended: {error}" if error else ""
            print(f"  round {round_index + 1} {name:<9} {wrong:4d} batches differed from the "
                  f"host, {compiled:2d} graphs compiled{ended}", flush=True)  # fmt: skip


if __name__ == "__main__":
    run_main(main)

"""What SPMD data parallelism gives each device: its slice of the batch and its share of the
work per training step, with 1, 2, 4… XLA devices (virtual ones on the CPU: PJRT_DEVICE=CPU).

    .venv/bin/python -m bench.spmd [--devices 1 2 4] [--img-size 16] [--bs 64] [--accuracy]

For each device count a fresh process trains the worker's resnet18 Learner on the digits for
a few steps, with XLA dumping the compiled programs. Per device count it prints:
  - the shape of each device's slice of an input batch (from the placed tensor's local shards);
  - the floating-point operations each device executes per training step, counted from XLA's
    partitioned program of the step (convolutions and matrix products: 2·multiply-adds);
  - the measured time per step. On the CPU every virtual device shares the same cores, so this
    time does not fall with more devices; on a TPU each device is its own core.
--accuracy also trains two real jobs through the worker, on 1 device and on all of the largest
count, and prints their final validation accuracy (same seed, data and order).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common.entry import run_main

REPO = Path(__file__).resolve().parent.parent

INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+) = \w+\[([\d,]*)\]\S* (\w[\w\-]*)\((.*)$")
OPERAND = re.compile(r"%([\w.\-]+)")
TIMED_FROM_STEP = 3  # the first steps compile


def _shape(text: str) -> list[int]:
    return [int(size) for size in text.split(",") if size]


def _product(sizes: list[int]) -> int:
    total = 1
    for size in sizes:
        total *= size
    return total


def module_flops(hlo_text: str) -> int:
    """2 × multiply-adds of the convolutions and dot products in one HLO module's text."""
    shapes: dict[str, list[int]] = {}
    ops: list[tuple[str, list[int], str]] = []
    for line in hlo_text.splitlines():
        match = INSTRUCTION.match(line)
        if match is None:
            continue
        name, shape, opcode, rest = match.groups()
        shapes[name] = _shape(shape)
        if opcode in ("convolution", "dot"):
            ops.append((opcode, _shape(shape), rest))
    flops = 0
    for opcode, output, rest in ops:
        operands = OPERAND.findall(rest.split(")", 1)[0])
        if opcode == "convolution":
            kernel = shapes[operands[1]]
            labels = re.search(r"dim_labels=\w+_(\w+)->", rest)[1]
            per_output = kernel[labels.index("i")] * _product(
                [kernel[i] for i, label in enumerate(labels) if label.isdigit()]
            )
        else:
            lhs = shapes[operands[0]]
            contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)[1]
            per_output = _product([lhs[int(d)] for d in contracting.split(",") if d])
        flops += 2 * _product(output) * per_output
    return flops


def child(dump: Path) -> None:
    """Train a few steps on this process's devices; print one JSON line of figures."""
    from fastai.callback.core import Callback
    from fastai.callback.training import ShortEpochCallback

    from datasets.builtin import ensure_digits
    from datasets.labelling import scan_items
    from db.spec import JobSpec
    from worker import spmd
    from worker.data import build_dataloaders
    from worker.training import build_learner, open_device

    bs, img_size = int(os.environ["BENCH_BS"]), int(os.environ["BENCH_IMG_SIZE"])
    spec = JobSpec(bs=bs, img_size=img_size, lr=1e-2, device="xla")
    setup = open_device("xla")
    dls = build_dataloaders(scan_items(ensure_digits(), {"type": "folder"}), spec, setup.device)
    learn = build_learner(dls, spec, setup.device, dump.parent / "learner", setup.parallel)

    class StepClock(Callback):
        order = 100  # after the step's torch_xla.sync (-20) and fastai's loss read (50)

        def __init__(self) -> None:
            self.seconds: list[float] = []

        def before_batch(self) -> None:
            self.started = time.perf_counter()

        def after_batch(self) -> None:
            if self.training:
                self.seconds.append(time.perf_counter() - self.started)

    clock = StepClock()
    learn.fit(1, 1e-3, cbs=[clock, ShortEpochCallback(pct=0.4, short_valid=True)])
    host_batch = dls.train.new(device=None, after_batch=None).one_batch()
    placed = setup.parallel.place(host_batch) if setup.parallel else host_batch
    slices = spmd.local_batch_shapes(placed[0]) if setup.parallel else [tuple(placed[0].shape)]
    print(json.dumps({
        "label": setup.label,
        "slices": slices,
        "step_s": statistics.median(clock.seconds[TIMED_FROM_STEP:]),
    }))  # fmt: skip


def measure(devices: int, args: argparse.Namespace, folder: Path) -> dict:
    dump = folder / f"hlo-{devices}"
    env = dict(os.environ)
    env.update(
        PJRT_DEVICE="CPU",
        CPU_NUM_DEVICES=str(devices),
        TRAINDECK_DATA=str(folder),
        BENCH_BS=str(args.bs),
        BENCH_IMG_SIZE=str(args.img_size),
        XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_as_text",
    )
    result = subprocess.run(
        [sys.executable, __file__, "--child", str(dump)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"{devices} device(s): the training process failed:\n{result.stderr}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    programs = sorted(dump.glob("*after_optimizations.txt"))
    figures["flops"] = max(module_flops(path.read_text()) for path in programs)
    return figures


def accuracy_jobs(largest: int, folder: Path) -> None:
    from db import queue, telemetry
    from db.engine import get_engine
    from db.migrate import upgrade

    os.environ["TRAINDECK_DATA"] = str(folder)
    os.environ["DATABASE_URL"] = f"sqlite:///{folder / 'bench.db'}"
    engine = get_engine()
    upgrade(engine)
    spec = {"arch": "resnet18", "epochs": 4, "lr": 3e-3, "img_size": 16, "bs": 64,
            "device": "xla"}  # fmt: skip
    jobs = {1: queue.submit(engine, {**spec, "cores": 1}), largest: queue.submit(engine, spec)}
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(largest))
    env["PYTHONPATH"] = str(REPO)
    for _ in jobs:
        subprocess.run([sys.executable, "-m", "worker", "--once"], cwd=REPO, env=env,
                       capture_output=True, check=True)  # fmt: skip
    finals = telemetry.final_metrics(engine, list(jobs.values()))
    for devices, job_id in jobs.items():
        job = queue.get_job(engine, job_id)
        accuracy = finals.get(job_id, {}).get("accuracy", float("nan"))
        print(f"digits accuracy, resnet18, 4 epochs, {devices} device(s): {accuracy:.4f} "
              f"({job.status} on {job.device})")  # fmt: skip
    one, many = (finals[jobs[n]]["accuracy"] for n in (1, largest))
    print(f"accuracy difference: {abs(one - many) * 100:.2f} points (target: within 1)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--img-size", type=int, default=16)
    parser.add_argument("--bs", type=int, default=64)
    parser.add_argument("--accuracy", action="store_true")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return

    folder = Path(tempfile.mkdtemp(prefix="traindeck-spmd-"))
    print(f"SPMD benchmark: resnet18, digits {args.img_size}px, global batch {args.bs}, "
          "XLA on the CPU with virtual devices", flush=True)  # fmt: skip
    baseline = None
    for devices in args.devices:
        figures = measure(devices, args, folder)
        baseline = baseline or figures
        slices = ", ".join("×".join(map(str, shape)) for shape in figures["slices"])
        print(f"{devices} device(s): per-device batch slices [{slices}]; "
              f"{figures['flops'] / 1e9:.3f} GFLOP per device per step "
              f"({baseline['flops'] / figures['flops']:.2f}× less than 1 device); "
              f"{figures['step_s'] * 1e3:.0f} ms per step measured "
              "(virtual devices share the CPU's cores)", flush=True)  # fmt: skip
    if args.accuracy:
        accuracy_jobs(max(args.devices), folder)


if __name__ == "__main__":
    run_main(main)

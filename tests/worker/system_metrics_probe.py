"""The system-metrics sampler on XLA's CPU backend, in a fresh process (torch_xla's runtime is
set once per process): a graph is traced and left pending, the sampler reads the host and a
fake TPU metrics service five times, and torch_xla's counters are read before and after.
Prints one JSON line.

    PJRT_DEVICE=CPU python -m tests.worker.system_metrics_probe
"""

from __future__ import annotations

import json
import time


class _Writer:
    def __init__(self) -> None:
        self.points: list = []

    def add_points(self, points: list) -> None:
        self.points.extend(points)


def _counts() -> dict[str, int]:
    from worker import xla_report

    summary = xla_report.read_summary()
    keys = ("execute_count", "device_syncs", "transfer_from_device_count",
            "transfers_from_device", "transfer_to_device_count", "compile_count")  # fmt: skip
    return {key: summary[key] for key in keys}


def main() -> None:
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    from tpu_info.device import TpuChip

    from tests.support.fake_tpu_metrics import GIB, FakeChip, serve_tpu_metrics
    from worker.system_metrics import HostSource, SystemSampler, TpuSource

    device = torch_xla.device()
    model = torch.nn.Linear(8, 4).to(device)
    inputs = torch.randn(16, 8).to(device)
    model(inputs).square().mean().backward()
    torch_xla.sync()
    xm.wait_device_ops()  # the step has run: its execution is counted before sampling starts
    pending = model(inputs).sum()  # traced, not yet run: a sync would run it
    writer = _Writer()
    with serve_tpu_metrics([FakeChip(50.0, [(GIB, 16 * GIB)])]) as fake:
        # The default readiness check: torch_xla's runtime has started in this process.
        sources = [HostSource(), TpuSource(fake.address, TpuChip.V4)]
        sampler = SystemSampler(writer, time.time(), sources, 1.0)
        before = _counts()
        for _ in range(5):
            sampler.sample()
        after = _counts()
    torch_xla.sync()
    xm.wait_device_ops()
    synced = _counts()
    del pending
    print(json.dumps({
        "before": before,
        "after": after,
        "synced": synced,
        "samples": len({point.step for point in writer.points}),
        "tpu_points": sum(point.name.startswith("sys/tpu") for point in writer.points),
    }))  # fmt: skip


if __name__ == "__main__":
    main()

"""fastai on XLA with and without the device-side values (`worker.device_values`), in a fresh
process (the XLA runtime and SPMD are set once per process). Prints one JSON line.

    PJRT_DEVICE=CPU python -m tests.worker.device_values_probe DATA_DIR [READ_EVERY]

The same digits Learner (`build_learner`, 16 px) is fitted twice from the same seed: once as
fastai does it (its Recorder reads the loss and the metrics to the host every batch) and once
with the values kept on the device and read every READ_EVERY steps. Then lr_find runs on a
third Learner with the device-side values in place, and a short fit after it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any


class _Writer:
    """What TelemetryCallback writes to, kept in memory."""

    def __init__(self) -> None:
        self.points: list[Any] = []

    def add_points(self, points: list[Any]) -> None:
        self.points.extend(points)

    def request_flush(self) -> None:
        return None

    def set_progress(self, progress: Any) -> None:
        return None


def _transfers() -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data("TransferFromDeviceTime")
    return data[0] if data else 0


def main() -> None:
    data_dir = Path(sys.argv[1])
    read_every = int(sys.argv[2]) if len(sys.argv) > 2 else 4

    import torch_xla
    from fastai.callback.core import Callback
    from fastai.torch_core import set_seed

    from datasets.labelling import scan_items
    from db.spec import JobSpec
    from tests.support.workers import digits_subset
    from worker.callbacks import DivergenceCallback, TelemetryCallback, TrainingClock
    from worker.data import build_dataloaders
    from worker.device_values import DeviceValuesCallback
    from worker.training import build_learner, lr_find, open_device

    setup = open_device("xla")
    spec = JobSpec(bs=16, img_size=16, device="xla")
    items = scan_items(digits_subset(data_dir, 12), {"type": "folder"})
    epochs = 2

    class TrainingTransfers(Callback):
        """Device→host transfers made while the training passes ran."""

        order = -100

        def __init__(self) -> None:
            self.count = 0

        def before_train(self) -> None:
            self.started = _transfers()

        def before_validate(self) -> None:
            self.count += _transfers() - self.started

    def fit(deferred: bool) -> dict[str, Any]:
        set_seed(0)  # the same shuffles (each DataLoader draws its own seed) and weights
        torch_xla.manual_seed(0)  # and the same dropout masks (XLA's own generator)
        dls = build_dataloaders(items, spec, setup.device)
        learn = build_learner(
            dls,
            spec,
            setup.device,
            data_dir / f"fit-{deferred}",
            setup.parallel,
            read_every=read_every,
        )
        if not deferred:
            learn.remove_cbs([cb for cb in learn.cbs if isinstance(cb, DeviceValuesCallback)])
        writer = _Writer()
        clock = TrainingClock(epochs, len(dls.train))
        transfers = TrainingTransfers()
        learn.add_cbs(
            [TelemetryCallback(writer, clock, setup.label), DivergenceCallback(clock), transfers]
        )
        learn.fit_one_cycle(epochs, 1e-2)
        recorder = learn.recorder
        return {
            "losses": [float(value) for value in recorder.losses],
            "lrs": [float(value) for value in recorder.lrs],
            "values": [[float(value) for value in epoch] for epoch in recorder.values],
            "iters": list(recorder.iters),
            "names": list(recorder.metric_names),
            "smooth_loss": type(recorder.smooth_loss).__name__,
            "metrics": [type(metric).__name__ for metric in learn.metrics],
            "points": sorted((point.name, point.step, point.value) for point in writer.points),
            "training_transfers": transfers.count,
        }

    plain = fit(deferred=False)
    deferred = fit(deferred=True)

    set_seed(0)
    dls = build_dataloaders(items, spec, setup.device)
    learn = build_learner(
        dls, spec, setup.device, data_dir / "lr-find", setup.parallel, read_every=read_every
    )
    suggestion = lr_find(learn, num_it=8)
    found = {"valley": float(suggestion.valley), "losses": len(learn.recorder.losses)}
    learn.fit_one_cycle(1, found["valley"] if math.isfinite(found["valley"]) else 1e-3)
    found["fit_after"] = [float(value) for value in learn.recorder.values[-1]]

    print(
        json.dumps(
            {
                "label": setup.label,
                "steps_per_epoch": len(dls.train),
                "epochs": epochs,
                "read_every": read_every,
                "plain": plain,
                "deferred": deferred,
                "lr_find": found,
            }
        )
    )


if __name__ == "__main__":
    main()

"""What results cost: the end-of-training interpretation; loading and predicting an export.

    .venv/bin/python -m bench.results [--arch resnet18] [--img-size 16] [--images 50]

A Learner built as the worker builds it (`worker.data`, `worker.training.build_learner`) on the
built-in digits, untrained (the timings do not depend on the weights), exported as the worker
exports it. Prints:
1. interpretation: `worker.results.interpret` (one prediction pass over the 359 validation
   images, plus thumbnails) against fastai's ClassificationInterpretation.from_learner followed
   by its confusion_matrix() (two passes); and the size of the stored results.
2. the export: reading and hashing its bytes (the SHA-256 check) against unpickling them.
3. predictions: per-image latency of `LoadedModel.predict_one` (median and 90th percentile)
   against the same images in one batch through a test DataLoader (images/s).
Never fails on time.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from common.entry import run_main


def seconds(function) -> tuple[float, object]:
    start = time.perf_counter()
    value = function()
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--img-size", type=int, default=16)
    parser.add_argument("--images", type=int, default=50, help="images to predict one by one")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="traindeck-results-bench-"))
    os.environ["TRAINDECK_DATA"] = str(folder)

    import torch
    from fastai.interpret import ClassificationInterpretation

    from datasets.builtin import ensure_digits
    from datasets.labelling import scan_items
    from db.spec import JobSpec
    from inference.model import load_model
    from worker.data import build_dataloaders
    from worker.results import interpret
    from worker.training import build_learner, export_model

    spec = JobSpec(arch=args.arch, img_size=args.img_size, device="cpu")
    items = scan_items(ensure_digits(), {"type": "folder"})
    dls = build_dataloaders(items, spec, torch.device("cpu"))
    learn = build_learner(dls, spec, torch.device("cpu"), folder)
    export = export_model(learn, folder)
    valid = len(dls.valid_ds)
    print(f"{args.arch}, {args.img_size}px, digits: {valid} validation images, CPU")

    ours, result = seconds(lambda: interpret(learn, threading.Event()))

    def fastai_way() -> object:
        interpretation = ClassificationInterpretation.from_learner(learn)
        return interpretation.confusion_matrix()

    with learn.removed_cbs([learn.recorder]):  # as `interpret` does: see its comment
        theirs, _ = seconds(fastai_way)
    stored = len(json.dumps(dataclasses.asdict(result)).encode())
    print(
        f"1. interpretation: {ours:.2f} s (one pass + thumbnails) vs fastai's from_learner + "
        f"confusion_matrix {theirs:.2f} s (two passes): ratio {ours / theirs:.2f}; "
        f"stored results {stored / 1024:.0f} KiB ({stored / valid:.0f} bytes per image)"
    )

    reading, data = seconds(lambda: Path(export).read_bytes())
    digest_s, digest = seconds(lambda: hashlib.sha256(data).hexdigest())
    loading, model = seconds(lambda: load_model(data, digest))
    size_mb = len(data) / 2**20
    print(
        f"2. export {size_mb:.1f} MiB: read {reading * 1000:.0f} ms + SHA-256 "
        f"{digest_s * 1000:.0f} ms ({size_mb / digest_s:.0f} MiB/s) vs unpickling "
        f"{loading * 1000:.0f} ms: the check adds {(reading + digest_s) / loading:.0%} to a load"
    )

    paths = [path for path, _ in items.items][: args.images]
    images = [(path.name, path.read_bytes()) for path in paths]
    model.predict_one(*images[0])  # warm-up
    latencies = [model.predict_one(name, data).latency_s for name, data in images]
    batch_s, _ = seconds(lambda: model.learn.get_preds(dl=model.learn.dls.test_dl(paths)))
    median = statistics.median(latencies)
    p90 = statistics.quantiles(latencies, n=10)[-1]
    print(
        f"3. predict one at a time: median {median * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms per "
        f"image ({1 / median:.0f} images/s) vs one batch of {len(paths)}: "
        f"{len(paths) / batch_s:.0f} images/s ({len(paths) / batch_s * median:.1f}× faster)"
    )


if __name__ == "__main__":
    run_main(main)

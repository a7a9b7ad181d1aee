"""Scale benchmark: what a claim, a `traindeck jobs` and a metric read cost with a small and a
large table, on SQLite and Postgres, and what a worker does before a job's first batch with a
small and a large dataset. Prints figures and ratios (large / small); never fails on timing.

    .venv/bin/python -m bench.scale [--backends sqlite,postgres] [--small-queue 200]
        [--large-queue 70000] [--small-jobs 220] [--large-jobs 70000] [--points 1000000]
        [--repeats 5] [--only claim,jobs,metrics,prep] [--small-images 10000]
        [--large-images 200000] [--prep-dir /tmp/traindeck-scale]

- claim: p50 of in-process `db.queue.claim` with a queue of --small-queue and of --large-queue
  queued jobs (the claims alternate between the two databases). Target: ratio <= 1.5.
- jobs: `traindeck jobs` (the default page) in a fresh process with --small-jobs and with
  --large-jobs jobs, each with its final metrics: wall time of the process, time inside
  `main`, and peak memory (ru_maxrss); also `jobs --all --json`, whose time grows with the
  jobs but whose memory must not. Targets: time ratio <= 1.5, memory flat.
- final_metrics: p50 of one job with --points metric points against one with 300, both in the
  same table and both of 20 epochs (they differ by their batch points). Target: ratio <= 2.
- prep: the worker's preparation before the first batch (`worker.data.load_items` and
  `build_dataloaders`: the dataset's manifest read and checked against the folder's sizes and
  times, the DataLoaders built) in a fresh process, with folder datasets of --small-images and
  --large-images 32-px PNGs in 10 classes; the images PIL opened before the first batch, and the
  memory the preparation adds (resident, kept after it) beside the manifest's own size. Targets:
  under 5 s at the large size, no image opened, the heap it adds within the manifest's JSON.
  The memory is measured from after one read of the dataset's row (a job's process has used
  the database before its prep: SQLAlchemy's one-time set-up is not the prep's) and split into
  anonymous memory (the heap, judged against the target) and file-backed pages (library code
  run for the first time, shared with other processes), both printed. The folders (and their
  registration, which decodes every image once) are made once under --prep-dir and reused.
Each pair is measured interleaved (small, large, small, …) so that drift in the machine's load
falls on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common.entry import run_main  # noqa: E402
from db import queue  # noqa: E402
from db.engine import create_db_engine  # noqa: E402
from db.migrate import upgrade  # noqa: E402
from db.telemetry import final_metrics  # noqa: E402
from tests.support.bulk import analyze, insert_jobs, insert_points  # noqa: E402

POSTGRES_ADMIN = os.environ.get(
    "TRAINDECK_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
JOB_STATUSES = ("succeeded", "queued", "failed", "cancelled", "succeeded", "running", "queued")
CLI = """
import json, resource, sys, time
started = time.perf_counter()
from traindeck.cli import main
imported = time.perf_counter()
code = main(sys.argv[1:])
sys.stdout.flush()
done = time.perf_counter()
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("BENCH " + json.dumps({"code": code, "main_s": done - imported, "peak_mb": peak_mb}),
      file=sys.stderr)
"""


@contextmanager
def database(backend: str, folder: Path, label: str) -> Iterator[str]:
    """A fresh, migrated database; its URL."""
    if backend == "sqlite":
        url = f"sqlite:///{folder / f'{label}.db'}"
        engine = create_db_engine(url)
        upgrade(engine)
        engine.dispose()
        yield url
        return
    name = f"traindeck_scale_{uuid.uuid4().hex[:8]}"
    admin = create_engine(POSTGRES_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = POSTGRES_ADMIN.rsplit("/", 1)[0] + "/" + name
    try:
        engine = create_db_engine(url)
        upgrade(engine)
        engine.dispose()
        yield url
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def timed_ms(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def interleaved(small: Callable[[], float], large: Callable[[], float], times: int):
    """(small figures, large figures), measured in turn."""
    figures: tuple[list[float], list[float]] = ([], [])
    for _ in range(times):
        figures[0].append(small())
        figures[1].append(large())
    return figures


def ratio_line(what: str, small: float, large: float, unit: str, target: float) -> str:
    ratio = large / small if small else float("inf")
    verdict = "ok" if ratio <= target else "ABOVE TARGET"
    return (
        f"{what:<66} small {small:8.2f} {unit:<3} large {large:9.2f} {unit:<3} "
        f"ratio {ratio:5.2f} (target <= {target:g}: {verdict})"
    )


# --- the claim ------------------------------------------------------------------------------


def bench_claim(backend: str, folder: Path, args: argparse.Namespace) -> None:
    with (
        database(backend, folder, "claim-small") as small_url,
        database(backend, folder, "claim-large") as large_url,
    ):
        engines = []
        for url, count in ((small_url, args.small_queue), (large_url, args.large_queue)):
            engine = create_db_engine(url)
            insert_jobs(engine, count, statuses=("queued",), priorities=5)
            analyze(engine)
            queue.claim(engine, "warm-up")
            engines.append(engine)
        claims = min(100, args.small_queue // 2)
        small, large = interleaved(
            lambda: timed_ms(lambda: queue.claim(engines[0], "bench")),
            lambda: timed_ms(lambda: queue.claim(engines[1], "bench")),
            claims,
        )
        for engine in engines:
            engine.dispose()
    print(
        ratio_line(
            f"{backend:<8} claim p50 ({args.small_queue} vs {args.large_queue} queued)",
            statistics.median(small),
            statistics.median(large),
            "ms",
            1.5,
        ),
        flush=True,
    )


# --- traindeck jobs -------------------------------------------------------------------------


def fill_jobs(url: str, count: int) -> None:
    """`count` jobs, each with the four epoch metrics of one epoch and a few batch points."""
    engine = create_db_engine(url)
    insert_jobs(engine, count, statuses=JOB_STATUSES, priorities=3)
    with engine.begin() as connection:
        for name in ("epoch/accuracy", "epoch/valid_loss", "epoch/train_loss", "batch/lr"):
            connection.execute(
                text(
                    "INSERT INTO metrics (job_id, name, step, epoch, value, wall_time)"
                    " SELECT id, :name, 0, 0, 0.5, 0 FROM jobs"
                ),
                {"name": name},
            )
    analyze(engine)
    engine.dispose()


def run_cli(url: str, data: Path, argv: list[str]) -> dict:
    env = {**os.environ, "DATABASE_URL": url, "TRAINDECK_DATA": str(data), "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CLI, *argv],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    wall_s = time.perf_counter() - started
    figures = json.loads(done.stderr.rsplit("BENCH ", 1)[1])
    if figures["code"] != 0:
        raise RuntimeError(f"traindeck {' '.join(argv)} failed: {done.stderr}")
    return {**figures, "wall_s": wall_s}


def bench_jobs(backend: str, folder: Path, args: argparse.Namespace) -> None:
    data = folder / "data"
    data.mkdir(exist_ok=True)
    sizes = f"{args.small_jobs} vs {args.large_jobs} jobs"
    with (
        database(backend, folder, "jobs-small") as small_url,
        database(backend, folder, "jobs-large") as large_url,
    ):
        fill_jobs(small_url, args.small_jobs)
        fill_jobs(large_url, args.large_jobs)
        for argv, time_target in ((["jobs"], 1.5), (["jobs", "--all", "--json"], None)):
            small, large = [], []
            for _ in range(args.repeats):
                small.append(run_cli(small_url, data, argv))
                large.append(run_cli(large_url, data, argv))
            command = "traindeck " + " ".join(argv)

            def median(runs: list[dict], key: str) -> float:
                return statistics.median(run[key] for run in runs)

            what = f"{backend:<8} {command} ({sizes})"
            if time_target is not None:
                print(
                    ratio_line(
                        f"{what}: process",
                        median(small, "wall_s") * 1000,
                        median(large, "wall_s") * 1000,
                        "ms",
                        time_target,
                    )
                )
                print(
                    ratio_line(
                        f"{what}: in main",
                        median(small, "main_s") * 1000,
                        median(large, "main_s") * 1000,
                        "ms",
                        time_target,
                    )
                )
            else:
                print(
                    f"{what}: in main {median(small, 'main_s') * 1000:.0f} ms vs "
                    f"{median(large, 'main_s') * 1000:.0f} ms (grows with the jobs listed)"
                )
            print(
                ratio_line(
                    f"{what}: peak memory",
                    median(small, "peak_mb"),
                    median(large, "peak_mb"),
                    "MB",
                    1.5,
                ),
                flush=True,
            )


# --- final metrics --------------------------------------------------------------------------


def bench_final_metrics(backend: str, folder: Path, args: argparse.Namespace) -> None:
    with database(backend, folder, "metrics") as url:
        engine = create_db_engine(url)
        big, small = insert_jobs(engine, 2)
        # Both jobs ran 20 epochs (10 names a point each: 200 points); they differ by their
        # batch points. The read's cost follows the epoch points, which are the work.
        epochs = 20
        for job_id, points in ((big, args.points), (small, 300)):
            for name in ("batch/train_loss", "batch/lr"):
                insert_points(engine, job_id, name, (points - 10 * epochs) // 2)
            for name in (
                "epoch/accuracy", "epoch/error_rate", "epoch/train_loss", "epoch/valid_loss",
                "epoch/time_s", "epoch/images_per_s", "epoch/top5_accuracy",
                "lr_find/lr", "lr_find/loss", "lr_find/suggestion",
            ):  # fmt: skip
                insert_points(engine, job_id, name, epochs)
        analyze(engine)
        assert len(final_metrics(engine, [big])[big]) == 7
        small_ms, large_ms = interleaved(
            lambda: timed_ms(lambda: final_metrics(engine, [small])),
            lambda: timed_ms(lambda: final_metrics(engine, [big])),
            args.repeats * 10,
        )
        engine.dispose()
    print(
        ratio_line(
            f"{backend:<8} final_metrics p50 (300 vs {args.points:,} points)",
            statistics.median(small_ms),
            statistics.median(large_ms),
            "ms",
            2.0,
        ),
        flush=True,
    )


# --- a worker's preparation before the first batch -----------------------------------------

PREP = """
import json, os, resource, sys, time
from pathlib import Path
import torch
from PIL import Image
from db.datasets import get_dataset
from db.engine import create_db_engine
from db.spec import JobSpec
from worker.data import build_dataloaders, load_items
from worker.skipped import SkipRecord

opened = []
real_open = Image.open
def counting_open(source, *args, **kwargs):
    if isinstance(source, (str, os.PathLike)):  # a file; fastai's type probe reads a blank
        opened.append(source)                    # image in memory
    return real_open(source, *args, **kwargs)
Image.open = counting_open

# Resident memory: anonymous (the heap: what the process made) and file-backed (pages of the
# libraries' code and data read from disk, shared with every process that maps them).
def resident() -> dict[str, int]:
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
            name, value = line.split()[:2]
            found[name.rstrip(":")] = int(value) * 1024
    return found

engine = create_db_engine()
get_dataset(engine, sys.argv[1])  # the job process has used the database before its prep
spec = JobSpec(dataset=sys.argv[1], bs=64, img_size=32, device="cpu", augment=False)
record = SkipRecord(Path(sys.argv[2]))
before = resident()
started = time.perf_counter()
items = load_items(engine, sys.argv[1])
dls = build_dataloaders(items, spec, torch.device("cpu"), record)
prep_s = time.perf_counter() - started
after = resident()
added = {name: after[name] - before[name] for name in after}
opened_before = len(opened)
dls.train.one_batch()
print("BENCH " + json.dumps({"prep_s": prep_s, "items": len(items.items),
      "added_mb": sum(added.values()) / 1e6, "anon_mb": added["RssAnon"] / 1e6,
      "file_mb": (added["RssFile"] + added["RssShmem"]) / 1e6,
      "opened_before": opened_before, "opened_first_batch": len(opened) - opened_before}),
      file=sys.stderr)
"""

REGISTER = """
import gzip, sys
from pathlib import Path
from datasets import manifest
from datasets.register import register_folder
from db.datasets import get_dataset
from db.engine import create_db_engine
from db.migrate import upgrade
engine = create_db_engine()
upgrade(engine)
if get_dataset(engine, sys.argv[1]) is None:
    register_folder(engine, sys.argv[1], sys.argv[2])
dataset = get_dataset(engine, sys.argv[1])
found = manifest.load(dataset.manifest_url, dataset.manifest_sha256)
data = manifest.encode(found)
print(len(data), len(gzip.decompress(data)))
"""


def prep_env(home: Path) -> dict[str, str]:
    data = home / "data"
    return {
        **os.environ,
        "TRAINDECK_DATA": str(data),
        "DATABASE_URL": f"sqlite:///{data / 'bench.db'}",
        "PYTHONPATH": str(REPO),
    }


def ensure_images(folder: Path, count: int) -> None:
    """`count` 32-px PNGs in 10 class folders, written once (a marker says they are whole)."""
    marker = folder / ".complete"
    if marker.is_file() and marker.read_text() == str(count):
        return
    from PIL import Image

    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    for index in range(count):
        label = index % 10
        if index < 10:
            (staging / f"class{label}").mkdir(parents=True)
        shade = (index // 10) % 256
        image = Image.new("RGB", (32, 32), (25 * label, shade, 255 - shade))
        image.save(staging / f"class{label}" / f"{index:07d}.png", compress_level=1)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    marker.write_text(str(count))


def registered(home: Path, name: str, folder: Path) -> tuple[int, int]:
    """Register `folder` once in the bench's database; the manifest's stored size (gzipped
    JSON) and its size as plain JSON, in bytes."""
    done = subprocess.run(
        [sys.executable, "-c", REGISTER, name, str(folder)],
        env=prep_env(home),
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"registering {folder} failed: {done.stderr[-2000:]}")
    stored, plain = done.stdout.split()
    return int(stored), int(plain)


def run_prep(home: Path, name: str) -> dict:
    record = home / "skipped.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", PREP, name, str(record)],
        env=prep_env(home),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    if "BENCH " not in done.stderr:
        raise RuntimeError(f"the preparation of {name} failed: {done.stderr[-2000:]}")
    return json.loads(done.stderr.rsplit("BENCH ", 1)[1])


def bench_prep(args: argparse.Namespace) -> None:
    home = Path(args.prep_dir)
    sizes = (args.small_images, args.large_images)
    manifests = {}
    for count in sizes:
        folder = home / "data" / f"images-{count}"
        ensure_images(folder, count)
        manifests[count] = registered(home, f"images-{count}", folder)
    small, large = interleaved(
        lambda: run_prep(home, f"images-{sizes[0]}"),
        lambda: run_prep(home, f"images-{sizes[1]}"),
        args.repeats,
    )

    def median(runs: list[dict], key: str) -> float:
        return statistics.median(run[key] for run in runs)

    what = f"worker prep before the first batch ({sizes[0]:,} vs {sizes[1]:,} images)"
    seconds = median(large, "prep_s")
    print(
        f"{what}: small {median(small, 'prep_s'):.2f} s large {seconds:.2f} s ratio "
        f"{seconds / median(small, 'prep_s'):.1f} (target at {sizes[1]:,}: under 5 s: "
        f"{'ok' if seconds < 5 else 'ABOVE TARGET'})"
    )
    opened = max(run["opened_before"] for run in small + large)
    print(
        f"images opened before the first batch: {opened} (target 0: "
        f"{'ok' if opened == 0 else 'ABOVE TARGET'}); by the first batch of 64: "
        f"{max(run['opened_first_batch'] for run in small + large)}"
    )
    for count, runs in zip(sizes, (small, large), strict=True):
        stored, plain = manifests[count]
        heap = median(runs, "anon_mb")
        verdict = "ok" if heap <= plain / 1e6 else "ABOVE TARGET"
        print(
            f"memory the prep adds at {count:,} images: {median(runs, 'added_mb'):.1f} MB "
            f"resident = {heap:.1f} MB anonymous (heap) + {median(runs, 'file_mb'):.1f} MB "
            f"file-backed (library code run for the first time); the "
            f"manifest: {stored / 1e6:.1f} MB stored (gzip), {plain / 1e6:.1f} MB as JSON "
            f"(target: the heap within the manifest's JSON: {verdict})",
            flush=True,
        )
    grown = median(large, "anon_mb") - median(small, "anon_mb")
    json_grown = manifests[sizes[1]][1] - manifests[sizes[0]][1]
    print(
        f"heap per image from {sizes[0]:,} to {sizes[1]:,} images: "
        f"{grown * 1e6 / (sizes[1] - sizes[0]):.0f} bytes; the manifest's JSON: "
        f"{json_grown / (sizes[1] - sizes[0]):.0f} bytes",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--small-queue", type=int, default=200)
    parser.add_argument("--large-queue", type=int, default=70_000)
    parser.add_argument("--small-jobs", type=int, default=220)
    parser.add_argument("--large-jobs", type=int, default=70_000)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--small-images", type=int, default=10_000)
    parser.add_argument("--large-images", type=int, default=200_000)
    parser.add_argument("--prep-dir", default="/tmp/traindeck-scale")
    parser.add_argument("--only", default="claim,jobs,metrics,prep", help="which parts to run")
    args = parser.parse_args()
    parts = args.only.split(",")
    print("scale benchmark: small vs large; ratio = large / small", flush=True)
    if "prep" in parts:
        bench_prep(args)
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            if "claim" in parts:
                bench_claim(backend, Path(tmp), args)
            if "jobs" in parts:
                bench_jobs(backend, Path(tmp), args)
            if "metrics" in parts:
                bench_final_metrics(backend, Path(tmp), args)


if __name__ == "__main__":
    run_main(main)

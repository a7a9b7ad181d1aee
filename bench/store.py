"""What the bucket costs: a fit whose checkpoints go to a bucket against one whose go to the
local store, and a download through the dashboard's route against reading the object directly.

    .venv/bin/python -m bench.store [--rounds 3] [--epochs 2] [--img-size 16] [--mb 100]
        [--parts fit,download] [--emulator-nice 0] [--split-cores]

The bucket is the Cloud Storage emulator (fake-gcs-server, tests/support/gcs.py) on loopback,
reached through gcsfs as a real bucket is. One interleaved run: every round runs each arm once,
so that the machine's noise hits them alike.
  fit       the worker's run on the digits (bench/overhead.py's traindeck arm: per-batch
            telemetry into SQLite), with a checkpoint written every epoch (not
            the worker's interval policy: every upload is measured), each checkpoint handed to the
            worker's uploader (worker/checkpoint_upload.py), which puts it in the store off the
            training thread; the fit's wall time with TRAINDECK_STORE unset (a folder) and with
            the bucket. Target: local/bucket ≥ 0.97 (the upload does not slow training). The
            time the last upload took after the fit ended is printed beside it, and the CPU
            seconds spent during a fit by the uploader's thread, gcsfs's I/O thread and the
            emulator. The emulator shares this machine's cores with the training, which a
            bucket does not: --emulator-nice runs it at a lower priority (said in the output);
            --split-cores runs this process (the fit, its uploader and gcsfs's threads) on
            the first CPU only and the emulator on the others, in both arms, as a bucket
            elsewhere leaves the training machine's cores to it.
  download  an object of --mb megabytes in the bucket, read through the dashboard's download
            route (dashboard.downloads.routes() served by uvicorn on 127.0.0.1 in a process of
            its own, as the dashboard is, and read over HTTP in 1 MB reads by this process, as
            a browser would elsewhere) and directly with the store's client in this process
            (common.store.iter_chunks: ranged reads through fsspec's file object). Target:
            route/direct ≥ 0.8. A third arm reads directly as the route does (one streamed GET,
            common.store.aiter_chunks), to show what the route itself costs. Beside the rates,
            the CPU time per 100 MB of each process: the reader, the route's server, the
            emulator.
Prints the figures and the ratios; never fails on timing.
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script (make bench), the repository is not on the path

from bench._fit import (  # noqa: E402
    check_fit_finished,
    instrument_like_worker,
    prepare_digits_fit,
    threads_cpu_seconds,
)
from common.entry import run_main  # noqa: E402

BUCKET = "traindeck-bench"
READ_BYTES = 1 << 20


def _start_bucket(root: Path) -> Any:
    from tests.support.gcs import GcsEmulator

    emulator = GcsEmulator(root / "objects").start()
    emulator.create_bucket(BUCKET)
    os.environ["STORAGE_EMULATOR_HOST"] = emulator.url
    return emulator


def _use_store(bucket: bool) -> None:
    if bucket:
        os.environ["TRAINDECK_STORE"] = f"gs://{BUCKET}/bench"
    else:
        os.environ.pop("TRAINDECK_STORE", None)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


SERVE = """
import sys
import uvicorn
from starlette.applications import Starlette
from dashboard import auth, downloads
auth.session_identity = lambda: None  # a link for anyone: no sign-in in front of the route
print(downloads.link_for(sys.argv[1], "export.pkl", sys.argv[2]), flush=True)
app = Starlette(routes=downloads.routes())
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[3]), log_level="warning")
"""


def _serve_downloads(url: str, sha256: str) -> tuple[subprocess.Popen, str, int]:
    """The dashboard's download route alone, served by uvicorn on loopback in a process of
    its own (no sign-in): the process, the link to `url`, the port."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE, url, sha256, str(port)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    link = server.stdout.readline().strip()
    deadline = time.monotonic() + 60
    while True:
        if server.poll() is not None or time.monotonic() > deadline or not link:
            server.kill()
            raise SystemExit("the download route did not start")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, link, port
        except OSError:
            time.sleep(0.05)


def _pin(pid: int, cpus: list[int]) -> None:
    """Every thread of process `pid` on `cpus` (an affinity is a thread's own; the threads
    they start later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def _cpu_seconds(process: Any) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _read_through_route(port: int, link: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        connection.request("GET", link)
        response = connection.getresponse()
        if response.status != 200:
            raise SystemExit(f"the download route answered {response.status}: {response.read()}")
        total = 0
        while chunk := response.read(READ_BYTES):
            total += len(chunk)
        return total
    finally:
        connection.close()


def _read_directly(url: str) -> int:
    from common import store

    return sum(len(chunk) for chunk in store.iter_chunks(url))


def _read_streamed(url: str) -> int:
    """As the route reads it: one GET on an event loop (common.store.aiter_chunks)."""
    import asyncio

    from common import store

    async def read() -> int:
        return sum([len(chunk) async for chunk in store.aiter_chunks(url)])

    return asyncio.run(read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--img-size", type=int, default=16)
    parser.add_argument("--bs", type=int, default=64)
    parser.add_argument("--mb", type=int, default=100, help="size of the downloaded object")
    parser.add_argument("--parts", default="fit,download", help="which comparisons to run")
    parser.add_argument(
        "--emulator-nice",
        type=int,
        default=0,
        help="run the bucket's emulator at this niceness (a real bucket's CPU is elsewhere)",
    )
    parser.add_argument(
        "--split-cores",
        action="store_true",
        help="this process on the first CPU, the emulator on the others (a remote bucket)",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    cpus = sorted(os.sched_getaffinity(0))
    if args.split_cores and len(cpus) < 2:
        raise SystemExit("--split-cores needs at least 2 CPUs")

    bench = prepare_digits_fit("traindeck-store-", args.epochs, args.img_size, args.bs, False)
    folder, engine, spec, setup = bench.folder, bench.engine, bench.spec, bench.setup
    dls = bench.dls
    emulator = _start_bucket(Path(tempfile.mkdtemp(prefix="traindeck-store-bucket-")))

    import psutil

    from common import store
    from worker.checkpoint_upload import CheckpointUploader
    from worker.training import build_learner

    print(f"store benchmark: resnet18, digits {args.img_size}px, bs {args.bs}, {args.epochs} "
          f"epochs; an object of {args.mb} MB; {args.rounds} rounds per arm, on {setup.label}; "
          f"the bucket is fake-gcs-server on loopback; the download route is served by a "
          f"process of its own")  # fmt: skip
    if args.emulator_nice:
        print(f"the emulator runs at nice {args.emulator_nice}: it yields the CPU to the fit, "
              f"as a bucket elsewhere takes none of this machine's")  # fmt: skip

    runs = iter(range(1, 1_000_000))

    uploader_threads = ("checkpoint-upload", "fsspecIO")  # the uploader's, and gcsfs's I/O
    emulator_process = psutil.Process(emulator.process.pid)
    if args.emulator_nice:
        emulator_process.nice(args.emulator_nice)
    if args.split_cores:
        import torch

        torch.set_num_threads(1)
        _pin(os.getpid(), cpus[:1])
        _pin(emulator.process.pid, cpus[1:])
        print(f"this process runs on CPU {cpus[0]} (one torch thread), the emulator on CPUs "
              f"{', '.join(map(str, cpus[1:]))}")  # fmt: skip
    spent_in_fits: dict[bool, dict[str, list[float]]] = {False: {}, True: {}}

    def thread_cpu() -> dict[str, float]:
        return threads_cpu_seconds(uploader_threads)

    def fit(bucket: bool) -> tuple[float, float]:
        """(seconds the fit took, seconds its last upload took after the fit); the CPU the
        uploader's threads and the emulator spent during the fit, into `spent_in_fits`."""
        from fastai.torch_core import set_seed

        _use_store(bucket)
        run = next(runs)
        problems: list[str] = []
        uploads = CheckpointUploader(
            900_000 + run, folder, lambda level, message: problems.append(message), kept=2
        )
        set_seed(spec.seed)
        learn = build_learner(dls, spec, setup.device, folder / f"fit-{run}", setup.parallel)
        writer = instrument_like_worker(
            learn, engine, spec, folder, setup.label, args.epochs, False,
            after_write=uploads.submit, interval_policy=False,
        )  # fmt: skip
        threads_before, emulator_before = thread_cpu(), _cpu_seconds(emulator_process)
        started = time.perf_counter()
        learn.fit_one_cycle(args.epochs, 1e-2)
        fitted = time.perf_counter()
        threads_after, emulator_after = thread_cpu(), _cpu_seconds(emulator_process)
        spent = spent_in_fits[bucket]
        for name in uploader_threads:
            spent.setdefault(name, []).append(threads_after[name] - threads_before[name])
        spent.setdefault("emulator", []).append(emulator_after - emulator_before)
        uploads.wait()
        tail = time.perf_counter() - fitted
        uploads.close()
        writer.close()
        check_fit_finished(learn, args.epochs)
        if problems or uploads.uploaded_epoch != args.epochs - 1:
            raise SystemExit(f"a checkpoint did not reach the store: {problems}")
        return fitted - started, tail

    # The object to download, in the bucket.
    _use_store(True)
    source = folder / "object.bin"
    with open(source, "wb") as handle:
        for _ in range(args.mb):
            handle.write(os.urandom(1 << 20))
    stored = store.put_file(
        source, store.job_output_key(1, "export.pkl", store.sha256_file(source))
    )
    source.unlink()
    server, link, port = _serve_downloads(stored.url, stored.sha256)
    processes = {
        "reader": psutil.Process(),
        "server": psutil.Process(server.pid),
        "emulator": psutil.Process(emulator.process.pid),
    }
    readers = {
        "direct": lambda: _read_directly(stored.url),
        "streamed": lambda: _read_streamed(stored.url),
        "route": lambda: _read_through_route(port, link),
    }
    cpu: dict[str, dict[str, list[float]]] = {arm: {} for arm in readers}

    def download(arm: str) -> float:
        """Megabytes per second (and each process's CPU seconds per 100 MB, into `cpu`)."""
        _use_store(True)
        before = {name: _cpu_seconds(process) for name, process in processes.items()}
        started = time.perf_counter()
        read = readers[arm]()
        elapsed = time.perf_counter() - started
        if read != stored.bytes:
            raise SystemExit(f"read {read} bytes of {stored.bytes}")
        for name, process in processes.items():
            spent = (_cpu_seconds(process) - before[name]) * 100e6 / read
            cpu[arm].setdefault(name, []).append(spent)
        return read / 1e6 / elapsed

    try:
        if "fit" in parts:
            fit(False), fit(True)  # warm-up: first-touch costs
        for arm in readers if "download" in parts else ():
            download(arm)
        fits: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        reads: dict[str, list[float]] = {arm: [] for arm in readers}
        for round_index in range(args.rounds):
            for bucket in (False, True) if "fit" in parts else ():
                fits[bucket].append(fit(bucket))
                seconds, tail = fits[bucket][-1]
                arm = "bucket" if bucket else "local"
                print(f"  round {round_index + 1} fit, {arm:<6} store {seconds:7.2f} s "
                      f"(+{tail:.2f} s for the last upload)", flush=True)  # fmt: skip
            for arm in readers if "download" in parts else ():
                reads[arm].append(download(arm))
                print(f"  round {round_index + 1} download, {arm:<8}  "
                      f"{reads[arm][-1]:8.1f} MB/s", flush=True)  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
        emulator.stop()

    if "fit" in parts:
        local = statistics.median(seconds for seconds, _ in fits[False])
        bucket = statistics.median(seconds for seconds, _ in fits[True])
        tail = statistics.median(tail for _, tail in fits[True])
        print(f"fit, local store   {local:7.2f} s")
        print(
            f"fit, bucket store  {bucket:7.2f} s  (+{tail:.2f} s until its last checkpoint was up)"
        )
        print(f"ratio local/bucket {local / bucket:.3f} (target ≥ 0.97)")
        for in_bucket in (False, True):
            figures = ", ".join(
                f"{name} {statistics.median(values):.2f} s"
                for name, values in spent_in_fits[in_bucket].items()
            )
            arm = "bucket" if in_bucket else "local"
            print(f"CPU during a fit, {arm} store: {figures}")
    if "download" not in parts:
        return
    direct, streamed, route = (statistics.median(reads[arm]) for arm in readers)
    print(f"download, directly with the client        {direct:8.1f} MB/s")
    print(f"download, directly, one streamed GET      {streamed:8.1f} MB/s")
    print(f"download, through the route               {route:8.1f} MB/s")
    print(f"ratio route/direct {route / direct:.3f} (target ≥ 0.8); "
          f"route/streamed {route / streamed:.3f}")  # fmt: skip
    for arm in readers:
        spent = ", ".join(
            f"{name} {statistics.median(values):.3f} s"
            for name, values in cpu[arm].items()
            if name != "server" or arm == "route"
        )
        print(f"CPU per 100 MB, {arm}: {spent}")


if __name__ == "__main__":
    run_main(main)

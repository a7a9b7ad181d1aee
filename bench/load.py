"""Under load: 20 sessions watch live jobs while 4 workers write metrics. Prints figures; never
fails on time.

- The dashboard is the real one (`streamlit run dashboard/app.py` on 127.0.0.1).
- Each session is a real Streamlit session driven over its websocket the way the browser
  drives it, with Streamlit's own protobuf messages: it opens `/job?job=N`, waits for the page
  to finish, then asks for the live fragment's rerun every time the server's `auto_rerun`
  interval (2 s) comes round, as the browser's timer does. A refresh is the time from that
  request to the server's `script_finished`: the server's whole part of a refresh (query,
  downsampling, figures, serialization, transport). The browser's drawing is left out: 20
  headless Chromium tabs redrawing plotly every 2 s would need far more than this machine's
  2 cores, and in use the browsers run on the watchers' machines, not beside the server.
- Each worker is a process that runs the worker's real `worker.reporter.TelemetryWriter` (a
  background thread writing batches every 2 s) and heartbeats, around a simulated training
  step: `--cpu-ms` of host work (data loading) then a wait for the device (`--step-ms` in all).
  Its speed is steps per second.
- Phases alternate: quiet (no session) and watched (20 sessions), `--rounds` times each, quiet
  first and last, so drift in the machine falls on both. Slowdown = 1 - (steps/s watched) /
  (steps/s quiet), per worker, then averaged. Targets: p95 refresh under 1 s, slowdown under 5%.
- At the end every job's metric rows are counted against the steps its worker reported: points
  lost (fewer rows) or doubled (more) should both be 0.

    .venv/bin/python -m bench.load [--quick] [--sessions 20] [--writers 4]
        [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import websockets
from sqlalchemy import create_engine, func, select, text
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from common.entry import run_main
from db import queue
from db.engine import create_db_engine, read_tx
from db.migrate import upgrade
from db.models import Metric
from db.telemetry import MetricPoint
from tests.support.browser import DashboardDidNotStart, start_dashboard, stop_dashboard

REPO = Path(__file__).resolve().parent.parent
STEPS_PER_EPOCH = 200
HEARTBEAT_S = 5.0
FINISHED_SUCCESSFULLY = ForwardMsg.FINISHED_SUCCESSFULLY
FINISHED_FRAGMENT_RUN_SUCCESSFULLY = ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY


# --- the workers --------------------------------------------------------------------------------


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    value = 0
    while time.perf_counter() < end:
        value += 1


def run_worker(url: str, worker_id: str, cpu_s: float, step_s: float, stop_at: float, out: str):
    """One worker: claims a job, 'trains' until `stop_at`, writes its step times to `out`."""
    from worker.reporter import Progress, TelemetryWriter

    engine = create_db_engine(url)
    claimed = queue.claim(engine, worker_id)
    assert claimed is not None, "no queued job left to claim"
    writer = TelemetryWriter(engine, claimed.lease)
    step_times: list[float] = []
    step = 0
    next_beat = time.monotonic() + HEARTBEAT_S
    while time.time() < stop_at:
        started = time.perf_counter()
        _busy(cpu_s)
        time.sleep(max(0.0, step_s - (time.perf_counter() - started)))
        epoch = step // STEPS_PER_EPOCH
        loss = 2.0 / (1 + step / 100)
        writer.add_points(
            [
                MetricPoint("batch/train_loss", step, loss, epoch),
                MetricPoint("batch/lr", step, 1e-3, epoch),
            ]
        )
        if (step + 1) % STEPS_PER_EPOCH == 0:
            writer.add_points(
                [
                    MetricPoint("epoch/train_loss", epoch, loss, epoch),
                    MetricPoint("epoch/valid_loss", epoch, loss * 1.1, epoch),
                    MetricPoint("epoch/accuracy", epoch, 1 - loss / 3, epoch),
                ]
            )
        writer.set_progress(
            Progress(epoch, step, 1000, 1000 * STEPS_PER_EPOCH, 3600.0, device="bench")
        )
        step_times.append(time.time())
        step += 1
        if time.monotonic() >= next_beat:
            queue.heartbeat(engine, claimed.lease)
            next_beat = time.monotonic() + HEARTBEAT_S
    flushed = writer.close(timeout_s=60)
    epochs_done = step // STEPS_PER_EPOCH
    Path(out).write_text(
        json.dumps(
            {
                "job_id": claimed.id,
                "step_times": step_times,
                "points": 2 * step + 3 * epochs_done,
                "flushed": flushed,
            }
        )
    )


# --- the sessions ------------------------------------------------------------------------------


@dataclass
class SessionStats:
    page_loads: list[float] = field(default_factory=list)
    refreshes: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def _rerun(job_id: int, fragment_id: str = "") -> bytes:
    message = BackMsg()
    state = message.rerun_script
    state.query_string = f"job={job_id}"
    state.page_name = "job"
    if fragment_id:
        state.fragment_id = fragment_id
        state.is_auto_rerun = True
    return message.SerializeToString()


async def _until_finished(ws, expected_name: str | None = None) -> tuple[int, str, float, bool]:
    """Read until script_finished: (status, auto-rerun fragment, interval, saw the job name)."""
    fragment_id, interval, saw_name = "", 0.0, expected_name is None
    while True:
        message = ForwardMsg.FromString(await ws.recv())
        kind = message.WhichOneof("type")
        if kind == "auto_rerun":
            fragment_id, interval = message.auto_rerun.fragment_id, message.auto_rerun.interval
        elif kind == "delta" and not saw_name and expected_name in str(message.delta):
            saw_name = True
        elif kind == "script_finished":
            return message.script_finished, fragment_id, interval, saw_name


async def watch(
    base_url: str, job_id: int, name: str, until: float, delay_s: float, stats: SessionStats
):
    """One browser session on the job page until `until` (time.time())."""
    url = base_url.replace("http://", "ws://") + "/_stcore/stream"
    await asyncio.sleep(delay_s)
    try:
        async with websockets.connect(url, subprotocols=["streamlit"], max_size=None) as ws:
            started = time.perf_counter()
            await ws.send(_rerun(job_id))
            status, fragment_id, interval, saw_name = await _until_finished(ws, name)
            stats.page_loads.append(time.perf_counter() - started)
            if status != FINISHED_SUCCESSFULLY or not fragment_id or not saw_name:
                stats.failures.append(f"job {job_id}: page load ended {status}, no live part")
                return
            next_request = time.perf_counter() + interval
            while time.time() + interval < until:
                await asyncio.sleep(max(0.0, next_request - time.perf_counter()))
                requested = time.perf_counter()
                await ws.send(_rerun(job_id, fragment_id))
                status, *_ = await _until_finished(ws)
                if status != FINISHED_FRAGMENT_RUN_SUCCESSFULLY:
                    stats.failures.append(f"job {job_id}: refresh ended with status {status}")
                stats.refreshes.append(time.perf_counter() - requested)
                next_request = requested + interval
    except (OSError, websockets.WebSocketException) as exc:
        stats.failures.append(f"job {job_id}: {type(exc).__name__}: {exc}")


async def watched_phase(base_url: str, jobs: list[tuple[int, str]], sessions: int, until: float):
    stats = SessionStats()
    await asyncio.gather(
        *(
            # Sessions arrive over the first second, not all in one instant.
            watch(base_url, *jobs[index % len(jobs)], until, index / sessions, stats)
            for index in range(sessions)
        )
    )
    return stats


# --- the run -----------------------------------------------------------------------------------


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def steps_in(step_times: list[float], start: float, end: float) -> int:
    return sum(1 for moment in step_times if start <= moment < end)


def run(url: str, args: argparse.Namespace, workdir: Path) -> None:
    engine = create_db_engine(url)
    upgrade(engine)
    jobs = []
    for index in range(args.writers):
        name = f"load job {index + 1}"
        jobs.append((queue.submit(engine, {"name": name, "epochs": 1000}), name))
    engine.dispose()

    env = dict(os.environ, DATABASE_URL=url, TRAINDECK_DATA=str(workdir))
    env.pop("TRAINDECK_PASSWORD_HASH", None)
    try:
        server, base_url = start_dashboard("127.0.0.1", env, workdir / "streamlit.log")
    except DashboardDidNotStart as exc:
        raise SystemExit(str(exc)) from None
    # Quiet and watched phases, quiet first and last.
    phases = ["quiet", "watched"] * args.rounds + ["quiet"]
    warmup_s = 5.0
    begin = time.time() + warmup_s
    bounds = [
        (kind, begin + i * args.phase_s, begin + (i + 1) * args.phase_s)
        for i, kind in enumerate(phases)
    ]
    stop_at = bounds[-1][2]
    outputs = [workdir / f"worker{index}.json" for index in range(args.writers)]
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                url,
                f"bench-{index}",
                str(args.cpu_ms),
                str(args.step_ms),
                str(stop_at),
                str(outputs[index]),
            ],
            cwd=REPO,
        )
        for index in range(args.writers)
    ]
    print(f"load average before the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(
        f"{args.writers} workers ({args.step_ms:g} ms steps, {args.cpu_ms:g} ms of it host work), "
        f"{args.sessions} sessions on the job pages, phases of {args.phase_s:g} s: "
        + " ".join(kind for kind, *_ in bounds),
        flush=True,
    )
    all_stats: list[SessionStats] = []
    try:
        for kind, start, end in bounds:
            time.sleep(max(0.0, start - time.time()))
            if kind == "watched":
                stats = asyncio.run(watched_phase(base_url, jobs, args.sessions, end))
                all_stats.append(stats)
                print(
                    f"  watched phase: {len(stats.refreshes)} refreshes, "
                    f"p95 {percentile(stats.refreshes, 0.95):.3f} s, "
                    f"{len(stats.failures)} failures",
                    flush=True,
                )
            time.sleep(max(0.0, end - time.time()))
        for process in workers:
            process.wait(timeout=120)
    finally:
        for process in workers:
            if process.poll() is None:
                process.kill()
        stop_dashboard(server)

    results = [json.loads(path.read_text()) for path in outputs]
    report(url, results, bounds, all_stats)


def report(url: str, results: list[dict], bounds, all_stats: list[SessionStats]) -> None:
    refreshes = [value for stats in all_stats for value in stats.refreshes]
    loads = [value for stats in all_stats for value in stats.page_loads]
    failures = [value for stats in all_stats for value in stats.failures]
    print("\nSessions")
    print(
        f"  page loads: {len(loads)}, median {percentile(loads, 0.5):.3f} s, "
        f"p95 {percentile(loads, 0.95):.3f} s"
    )
    print(
        f"  refreshes:  {len(refreshes)}, median {percentile(refreshes, 0.5):.3f} s, "
        f"p95 {percentile(refreshes, 0.95):.3f} s, "
        f"max {max(refreshes, default=float('nan')):.3f} s "
        f"(target: p95 under 1 s)"
    )
    print(f"  failures:   {len(failures)}" + "".join(f"\n    {f}" for f in failures[:5]))

    print("\nWorkers (steps/s)")
    ratios = []
    for result in results:
        rates = {"quiet": [], "watched": []}
        for kind, start, end in bounds:
            rates[kind].append(steps_in(result["step_times"], start, end) / (end - start))
        quiet, watched = statistics.mean(rates["quiet"]), statistics.mean(rates["watched"])
        ratios.append(watched / quiet)
        print(
            f"  job {result['job_id']}: quiet {quiet:.2f}, watched {watched:.2f}, "
            f"slowdown {1 - watched / quiet:+.2%}"
        )
    print(f"  mean slowdown while watched: {1 - statistics.mean(ratios):+.2%} (target: under 5%)")

    engine = create_db_engine(url)
    lost = doubled = 0
    with read_tx(engine) as session:
        for result in results:
            stored = session.scalar(
                select(func.count()).select_from(Metric).where(Metric.job_id == result["job_id"])
            )
            lost += max(0, result["points"] - stored)
            doubled += max(0, stored - result["points"])
    engine.dispose()
    written = sum(result["points"] for result in results)
    print(f"\nMetric points: {written:,} written, {lost} lost, {doubled} doubled (targets: 0, 0)")


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        url, worker_id, cpu_ms, step_ms, stop_at, out = sys.argv[2:8]
        run_worker(url, worker_id, float(cpu_ms) / 1000, float(step_ms) / 1000, float(stop_at), out)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--phase-s", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--step-ms", type=float, default=50.0, help="one training step")
    parser.add_argument("--cpu-ms", type=float, default=10.0, help="host work in each step")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 10 s phases")
    parser.add_argument("--postgres", metavar="ADMIN_URL", help="run on a temporary Postgres db")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.phase_s = 2, 10.0
    with tempfile.TemporaryDirectory(prefix="traindeck-load-") as folder:
        workdir = Path(folder)
        if not args.postgres:
            print("SQLite")
            run(f"sqlite:///{workdir / 'traindeck.db'}", args, workdir)
            return
        admin = create_engine(args.postgres, isolation_level="AUTOCOMMIT")
        name = f"traindeck_load_{uuid.uuid4().hex[:8]}"
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            print("Postgres")
            run(args.postgres.rsplit("/", 1)[0] + "/" + name, args, workdir)
        finally:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


if __name__ == "__main__":
    run_main(main)

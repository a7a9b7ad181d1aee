"""Every page of the dashboard through Streamlit's AppTest, against a real migrated database."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import update
from streamlit.testing.v1 import AppTest

from db import gang, queue
from db.engine import dispose_engines, write_tx
from db.models import JobHost, Worker, utcnow
from db.telemetry import add_events
from db.workers import register_worker, worker_heartbeat
from tests.support import seed
from tests.support.markdown import shown

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


@pytest.fixture(autouse=True)
def _fresh_engine_cache():
    dispose_engines()
    yield
    dispose_engines()


def open_page(page: str, **query: object) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    if page != "pages/jobs.py":
        at.switch_page(page)
    for key, value in query.items():
        at.query_params[key] = str(value)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def show_tab(at: AppTest, title: str) -> AppTest:
    """Open one of the job page's tabs (lazy: only the open tab runs)."""
    at.session_state["job.tab"] = title
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def button(at: AppTest, label: str):
    matches = [b for b in at.button if b.label == label]
    assert matches, f"no button {label!r} among {[b.label for b in at.button]}"
    return matches[0]


def texts(at: AppTest) -> str:
    """What a person reads on the page: the Markdown elements rendered, the code as it is."""
    parts = []
    for kind in ("markdown", "caption", "error", "warning", "info", "success"):
        parts += [shown(element.value) for element in getattr(at, kind)]
    parts += [str(element.value) for element in at.code]
    return "\n".join(parts)


def figures(at: AppTest) -> list[dict]:
    return [json.loads(element.proto.spec) for element in at.get("plotly_chart")]


def values(array: list | dict) -> np.ndarray:
    """A trace's x or y: plotly sends numpy arrays as base64 typed arrays."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"])
    return np.asarray(array)


# --- New job --------------------------------------------------------------------------------


def test_the_form_queues_a_job_with_the_values_set(engine):
    at = open_page("pages/new_job.py")
    assert at.number_input(key="spec.epochs").value == 3  # the spec's default
    assert "Default: 3" in at.number_input(key="spec.epochs").help

    at.number_input(key="spec.epochs").set_value(5)
    at.number_input(key="spec.bs").set_value(32)
    at.selectbox(key="spec.arch").set_value("resnet34")
    at.checkbox(key="spec.lr.find").check()
    at.text_input(key="spec.name").input("my digits run")
    button(at, "Queue job").click().run()

    assert not at.exception
    jobs = queue.list_jobs(engine)
    assert len(jobs) == 1
    spec = jobs[0].spec
    assert (spec["epochs"], spec["bs"], spec["arch"], spec["lr"]) == (5, 32, "resnet34", "find")
    assert jobs[0].name == "my digits run"
    assert f"Queued job #{jobs[0].id}." in texts(at)
    links = at.get("page_link")
    assert any(f"Open job #{jobs[0].id}" in link.proto.label for link in links)


def test_invalid_input_is_shown_at_the_field_and_nothing_is_queued(engine):
    at = open_page("pages/new_job.py")
    at.number_input(key="spec.lr").set_value(-0.5)
    at.selectbox(key="spec.device").set_value("xla")
    at.selectbox(key="spec.mixed_precision").set_value("fp16")
    button(at, "Queue job").click().run()

    assert queue.list_jobs(engine) == []
    errors = [shown(e.value) for e in at.error]
    assert "must be greater than 0 (or 'find')" in errors
    assert "Nothing was queued: fix the fields marked above." in errors

    # A corrected field loses its message; the spec then finds the next problem.
    at.number_input(key="spec.lr").set_value(0.01).run()
    assert "must be greater than 0 (or 'find')" not in [shown(e.value) for e in at.error]
    button(at, "Queue job").click().run()
    assert queue.list_jobs(engine) == []
    assert "fp16 runs on CUDA only; use bf16 on XLA" in [shown(e.value) for e in at.error]

    at.selectbox(key="spec.mixed_precision").set_value("bf16")
    button(at, "Queue job").click().run()
    assert [job.spec["mixed_precision"] for job in queue.list_jobs(engine)] == ["bf16"]
    assert not [shown(e.value) for e in at.error]


def test_a_name_with_control_characters_is_refused_at_the_field(sqlite_engine):
    at = open_page("pages/new_job.py")
    at.text_input(key="spec.name").input("bad\x07name")
    button(at, "Queue job").click().run()

    assert queue.list_jobs(sqlite_engine) == []
    assert "must not contain control characters" in [shown(e.value) for e in at.error]


# --- Jobs -----------------------------------------------------------------------------------


def test_jobs_table_lists_jobs_with_progress_and_latest_metrics(engine):
    live = seed.running_job(engine)
    done_id, _ = seed.finished_job(engine)
    queued_id = queue.submit(engine, {"name": "waiting"})

    at = open_page("pages/jobs.py")

    frame = at.dataframe[0].value
    assert frame["name"].tolist() == ["waiting", "done run", "live run"]
    assert frame["status"].tolist() == ["queued", "succeeded", "running"]
    assert frame["progress"].tolist() == [0.0, 1.0, 0.5]
    assert frame["job"].tolist() == [f"job?job={i}" for i in (queued_id, done_id, live.id)]
    running = frame.iloc[2]
    assert running["epoch"] == "1/3"
    assert running["device"] == "xla:0 (TPU v4)"
    assert running["worker"] == "worker-a"
    assert running["train loss"] == pytest.approx(seed.batch_points(29, 1)[0].value)
    assert running["accuracy"] == pytest.approx(0.5)

    at.multiselect(key="jobs.statuses").set_value(["succeeded"]).run()
    assert at.dataframe[0].value["name"].tolist() == ["done run"]


def test_cancel_retry_and_delete_from_the_jobs_page(engine, data_dir):
    queued_id = queue.submit(engine, {"name": "to cancel"})
    at = open_page("pages/jobs.py")
    at.selectbox(key="jobs.selected").set_value(queued_id).run()
    button(at, "Cancel").click().run()
    assert queue.get_job(engine, queued_id).status == "cancelled"
    assert f"Job #{queued_id} was cancelled before it started." in texts(at)

    button(at, "Retry").click().run()
    retried = queue.list_jobs(engine)[0]
    assert retried.id != queued_id and retried.cloned_from == queued_id
    assert retried.status == "queued"

    done_id, export = seed.finished_job(engine)
    at.run()
    at.selectbox(key="jobs.selected").set_value(done_id).run()
    button(at, "Delete").click().run()
    assert queue.get_job(engine, done_id).status == "succeeded"  # not before confirming
    button(at, f"Yes, delete job #{done_id}").click().run()
    with pytest.raises(queue.JobNotFound):
        queue.get_job(engine, done_id)
    assert not export.exists()
    assert f"Job #{done_id} and its files were deleted." in texts(at)


def test_a_running_job_cannot_be_deleted_or_retried(sqlite_engine):
    live = seed.running_job(sqlite_engine)
    at = open_page("pages/jobs.py")
    at.selectbox(key="jobs.selected").set_value(live.id).run()
    assert button(at, "Delete").disabled
    assert button(at, "Retry").disabled
    button(at, "Cancel").click().run()
    assert queue.get_job(sqlite_engine, live.id).cancel_requested
    assert f"Job #{live.id} will stop at its next batch." in texts(at)


def test_clone_opens_the_form_filled_with_the_spec(engine):
    done_id, _ = seed.finished_job(engine, bs=16, epochs=7, schedule="fine_tune")
    at = open_page("pages/jobs.py")
    at.selectbox(key="jobs.selected").set_value(done_id).run()
    button(at, "Clone").click().run()

    assert at.title[0].value == "New job"
    assert at.number_input(key="spec.bs").value == 16
    assert at.number_input(key="spec.epochs").value == 7
    assert at.selectbox(key="spec.schedule").value == "fine_tune"
    assert f"A copy of job #{done_id}" in texts(at)

    at.number_input(key="spec.epochs").set_value(2)
    button(at, "Queue job").click().run()
    clone = queue.list_jobs(engine)[0]
    assert clone.cloned_from == done_id
    assert (clone.spec["bs"], clone.spec["epochs"]) == (16, 2)


# --- Job ------------------------------------------------------------------------------------


def test_job_page_shows_a_running_jobs_partial_metrics(engine):
    live = seed.running_job(engine)
    at = open_page("pages/job.py", job=live.id)

    assert at.title[0].value == f"#{live.id} · live run"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Epoch"] == "1 / 3"
    assert metrics["Step"] == "30 / 60"
    assert metrics["ETA"] == "1m 35s"
    assert at.get("progress")[0].proto.value == 50

    drawn = {figure["layout"]["title"]["text"]: figure for figure in figures(at)}
    batch = next(f for title, f in drawn.items() if title.startswith("Train loss per batch"))
    assert "30 points" in batch["layout"]["title"]["text"]
    assert values(batch["data"][0]["x"]).tolist() == list(range(30))
    assert "Loss per epoch" in drawn
    assert "accuracy" in drawn and "Learning-rate schedule" in drawn

    show_tab(at, "Diagnostics")
    assert "XLA compiles per epoch" in {f["layout"]["title"]["text"] for f in figures(at)}

    assert "No new XLA graphs after the warm-up epochs." in [shown(m.value) for m in at.success]
    fallbacks = at.dataframe[1].value
    assert fallbacks["op"].tolist() == ["aten::_local_scalar_dense", "aten::nonzero"]
    log = texts(show_tab(at, "Log"))
    assert "epoch 0 done: valid_loss 1.2" in log and "claimed by worker worker-a" in log


def test_job_page_draws_only_new_points_on_refresh(sqlite_engine):
    live = seed.running_job(sqlite_engine)
    at = open_page("pages/job.py", job=live.id)
    state = at.session_state["job.live"]
    first_id = state.last_metric_id

    from db.telemetry import write_metrics

    write_metrics(sqlite_engine, live.id, seed.batch_points(30, 10))
    at.run()

    state = at.session_state["job.live"]
    assert state.last_metric_id > first_id
    assert state.get("batch/train_loss").point_count == 40
    batch = next(f for f in figures(at) if f["layout"]["title"]["text"].startswith("Train loss"))
    assert values(batch["data"][0]["x"]).tolist() == list(range(40))


def test_job_page_offers_a_finished_jobs_model_with_its_sha256(engine):
    done_id, export = seed.finished_job(engine)
    at = show_tab(open_page("pages/job.py", job=done_id), "Artifacts")

    from common.files import sha256_file

    digest = sha256_file(export)
    assert f"SHA-256 {digest}" in texts(at)
    download = at.get("link_button")[0]
    assert shown(download.proto.label) == "Download export.pkl"
    assert download.proto.url.startswith("/downloads/")
    assert {m.label: m.value for m in at.metric}["Status"] == "succeeded"


def test_job_page_shows_a_failed_jobs_error_and_traceback(sqlite_engine):
    failed_id = seed.failed_job(sqlite_engine)
    at = open_page("pages/job.py", job=failed_id)
    assert "The job failed: RuntimeError: CUDA out of memory" in [shown(e.value) for e in at.error]
    assert any('File "worker/train.py"' in code.value for code in at.code)


def test_job_page_shows_a_multi_host_jobs_hosts(engine):
    job_id = queue.submit(engine, {"name": "pod run", "hosts": 2})
    lease = queue.claim(engine, "vm-0:*7*", slice_name="pod", hosts=2).lease.lease
    gang.join(engine, "vm-1:[x](y)", "pod", 2, 1)
    host_0 = gang.Seat(job_id, lease, 0)
    gang.mark_ready(engine, host_0)
    gang.record_progress(engine, host_0, 5)
    gang.leave(engine, host_0, "died", "killed")
    an_hour_ago = utcnow() - timedelta(hours=1)
    with write_tx(engine) as connection:  # host 1 beat an hour ago and never got ready
        connection.execute(
            update(JobHost).where(JobHost.host == 1).values(heartbeat_at=an_hour_ago)
        )

    at = open_page("pages/job.py", job=job_id)

    assert "Hosts · 2 of 2 joined the latest attempt" in texts(at)
    table = at.dataframe[0].value
    assert table["host"].tolist() == [0, 1]
    assert table["worker"].tolist() == ["vm-0:*7*", "vm-1:[x](y)"]  # as text
    assert table["state"].tolist() == ["died", "joined"]
    heartbeat, progress = table["s since heartbeat"], table["s since progress"]
    assert 0 <= heartbeat[0] < 600 and 0 <= progress[0] < 600
    assert 3600 <= heartbeat[1] < 3600 + 600 and pd.isna(progress[1])


def test_job_page_of_a_one_host_job_shows_no_hosts(sqlite_engine):
    live = seed.running_job(sqlite_engine)
    at = open_page("pages/job.py", job=live.id)
    assert "Hosts" not in texts(at)
    assert all("worker" not in frame.value.columns for frame in at.dataframe)
    queued = queue.submit(sqlite_engine, {"name": "pod run", "hosts": 4})
    at = open_page("pages/job.py", job=queued)
    assert "Hosts: none of the 4 has joined an attempt yet." in texts(at)
    assert not at.dataframe


def test_job_page_with_an_unknown_or_malformed_job(sqlite_engine):
    at = open_page("pages/job.py", job=999)
    assert "There is no job #999." in [shown(w.value) for w in at.warning]
    at = open_page("pages/job.py", job="abc")
    assert "'abc' is not a job number." in [shown(w.value) for w in at.warning]


# --- Workers and Compare -------------------------------------------------------------------


def test_workers_page_marks_a_stale_worker(engine):
    register_worker(engine, "tpu-vm-1:100", "tpu-vm-1", 100, "TPU v4-8 (4 chips)")
    register_worker(engine, "tpu-vm-2:200", "tpu-vm-2", 200, "TPU v4-8 (4 chips)")
    live = seed.running_job(engine, worker_id="tpu-vm-1:100")
    worker_heartbeat(engine, "tpu-vm-1:100", "busy", live.id)
    with write_tx(engine) as connection:
        connection.execute(
            update(Worker)
            .where(Worker.id == "tpu-vm-2:200")
            .values(heartbeat_at=utcnow() - timedelta(minutes=10))
        )

    at = open_page("pages/workers.py")

    frame = at.dataframe[0].value.set_index("worker")
    assert frame.loc["tpu-vm-1:100", "state"] == "alive (busy)"
    assert frame.loc["tpu-vm-1:100", "current job"] == f"job?job={live.id}"
    assert frame.loc["tpu-vm-2:200", "state"] == "stale"
    assert any("tpu-vm-2:200" in shown(w.value) for w in at.warning)


def test_compare_page_overlays_jobs_and_tables_their_parameters(engine):
    first, _ = seed.finished_job(engine, name="small batch", bs=16)
    second, _ = seed.finished_job(engine, name="big batch", bs=128)

    at = open_page("pages/compare.py", jobs=f"{first},{second}")

    table = at.dataframe[0].value
    assert table["bs"].tolist() == ["16", "128"]
    assert "epochs" not in table.columns  # the same in both: hidden until asked for
    assert table["final accuracy"].tolist() == pytest.approx([0.7, 0.7])
    drawn = {figure["layout"]["title"]["text"]: figure for figure in figures(at)}
    assert len(drawn["Train loss per batch (smoothed)"]["data"]) == 2
    assert len(drawn["valid_loss per epoch"]["data"]) == 2

    at.toggle(key="compare.all").set_value(True).run()
    assert "epochs" in at.dataframe[0].value.columns


def test_the_dataset_picker_shows_counts_and_sample_images(sqlite_engine, data_dir):
    from PIL import Image

    from db.datasets import save_dataset

    root = data_dir / "datasets" / "shapes"
    for label in ("circle", "square", "star"):
        (root / label).mkdir(parents=True)
        for index in range(4):
            Image.new("RGB", (16, 16), (index * 40, 0, 0)).save(root / label / f"{index}.png")
    save_dataset(
        sqlite_engine,
        name="shapes",
        kind="folder",
        location=str(root),
        label_rule={"type": "folder"},
        classes=["circle", "square", "star"],
        class_counts={"circle": 4, "square": 4, "star": 4},
    )
    at = open_page("pages/new_job.py")
    at.selectbox(key="spec.dataset").set_value("shapes").run()

    assert "folder · 3 classes · 12 images" in texts(at)
    captions = [caption for image in at.image for caption in image.proto.imgs]
    assert [image.caption for image in captions] == ["circle", "square", "star"]

    # 12 images hold no batch of the default 64; the form says how many there are to train on.
    assert "Training images: 10 of 12 (20% held out for validation)." in texts(at)
    at.number_input(key="spec.bs").set_value(8).run()
    button(at, "Queue job").click().run()
    assert queue.list_jobs(sqlite_engine)[0].spec["dataset"] == "shapes"


def test_job_page_draws_a_long_series_as_min_max_buckets_and_the_lr_finder(sqlite_engine):
    from db.telemetry import MetricPoint, write_metrics

    job_id = queue.submit(sqlite_engine, {"name": "long", "lr": "find"})
    losses = np.full(10_000, 1.0)
    losses[7_777] = 50.0
    points = [MetricPoint("batch/train_loss", i, float(v)) for i, v in enumerate(losses)]
    points += [MetricPoint("lr_find/lr", i, 1e-6 * 10 ** (i / 10)) for i in range(50)]
    points += [MetricPoint("lr_find/loss", i, 3.0 - i / 40) for i in range(50)]
    points += [MetricPoint("lr_find/suggestion", 0, 2e-3)]
    write_metrics(sqlite_engine, job_id, points)

    at = open_page("pages/job.py", job=job_id)

    drawn = {figure["layout"]["title"]["text"]: figure for figure in figures(at)}
    title = "Train loss per batch · 10,000 points, drawn as the min/max of 2,000 buckets"
    raw_line = values(drawn[title]["data"][0]["y"])
    assert len(raw_line) == 4000 and raw_line.max() == 50.0
    lr_find = drawn["Learning-rate finder"]
    assert len(values(lr_find["data"][0]["x"])) == 50
    assert lr_find["layout"]["shapes"][0]["x0"] == 2e-3


def test_job_page_of_a_cuda_job_shows_its_device_and_memory(sqlite_engine):
    from db.telemetry import MetricPoint, write_metrics

    queue.submit(sqlite_engine, {"name": "gpu", "device": "cuda"})
    claimed = queue.claim(sqlite_engine, "gpu-box")
    queue.set_progress(
        sqlite_engine,
        claimed.lease,
        epoch=1,
        step=10,
        total_epochs=3,
        total_steps=30,
        eta_seconds=20.0,
        device="cuda:0 (NVIDIA H200)",
    )
    write_metrics(sqlite_engine, claimed.id, [MetricPoint("epoch/cuda_max_memory_mb", 0, 5120.0)])

    at = show_tab(open_page("pages/job.py", job=claimed.id), "Diagnostics")

    assert "Device: cuda:0 (NVIDIA H200)" in texts(at)
    assert {m.label: m.value for m in at.metric}["CUDA peak memory (latest epoch)"] == "5,120 MB"


def test_the_log_can_be_searched(sqlite_engine):
    live = seed.running_job(sqlite_engine)
    at = show_tab(open_page("pages/job.py", job=live.id), "Log")
    at.text_input(key="job.log_search").input("VALID_LOSS").run()

    log = at.code[-1].value
    assert "epoch 0 done: valid_loss 1.2" in log
    assert "claimed by worker" not in log
    assert "lines 1–1 of 1 matching 'VALID_LOSS'" in texts(at)


def test_the_log_is_shown_a_page_at_a_time(sqlite_engine):
    live = seed.running_job(sqlite_engine)  # three lines: the claim's and two more
    add_events(sqlite_engine, live.id, [("info", f"line {n}") for n in range(700)])
    at = show_tab(open_page("pages/job.py", job=live.id), "Log")

    assert "lines 404–703 of 703" in texts(at)
    assert at.code[-1].value.splitlines()[-1].endswith("line 699")
    assert button(at, "Newer").disabled and button(at, "Newest").disabled

    button(at, "Older").click().run()
    assert "lines 104–403 of 703" in texts(at)
    assert at.code[-1].value.splitlines()[0].endswith("line 100")
    button(at, "Older").click().run()
    assert "lines 1–103 of 703" in texts(at)
    assert "epoch 0 done: valid_loss 1.2" in at.code[-1].value
    assert button(at, "Older").disabled

    button(at, "Newer").click().run()
    assert "lines 104–403 of 703" in texts(at)
    button(at, "Newest").click().run()
    assert "lines 404–703 of 703" in texts(at)


def test_a_malformed_setting_stops_the_page_with_one_line_not_a_traceback(
    sqlite_engine, monkeypatch
):
    monkeypatch.setenv("TRAINDECK_HEARTBEAT_TIMEOUT", "soon")
    seed.running_job(sqlite_engine)
    # The main page: app.py runs first, as it does for every page of a real server (AppTest's
    # switch_page would run the page's file alone).
    at = open_page("pages/jobs.py")
    assert [e.value for e in at.error] == ["traindeck cannot use a setting in its environment:"]
    assert [c.value for c in at.code] == [
        "TRAINDECK_HEARTBEAT_TIMEOUT='soon' is not valid: a number of seconds greater than 0 "
        "(at most 86400, a day)"
    ]
    assert not at.dataframe


def test_a_database_without_tables_gets_a_clear_message(data_dir, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{data_dir / 'empty.db'}")
    at = open_page("pages/jobs.py")
    assert any("python -m db upgrade" in shown(e.value) for e in at.error)


def test_job_page_warns_when_xla_keeps_compiling_after_the_warm_up(sqlite_engine):
    from db.telemetry import add_xla_report

    live = seed.running_job(sqlite_engine)
    at = show_tab(open_page("pages/job.py", job=live.id), "Diagnostics")
    assert not [shown(w.value) for w in at.warning]

    add_xla_report(sqlite_engine, live.id, 2, seed.xla_summary(18), "Metric: CompileTime")
    at.run()

    warnings = [shown(w.value) for w in at.warning]
    # Stored under the epoch index 2: the third epoch, as the worker's log counts it.
    assert any("after the warm-up epochs: 6 in epoch 3." in w for w in warnings)
    table = at.dataframe[0].value
    assert table["epoch"].tolist() == [1, 2, 3]
    assert table["compiles"].tolist() == [12, 0, 6]

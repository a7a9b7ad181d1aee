"""`traindeck export tensorboard`: every stored point, the XLA compiles per epoch and the spec
come back through TensorBoard's own reader; mistakes are one line and leave nothing behind."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
from tensorboard.plugins.hparams import metadata

import db.tensorboard
from db import queue
from db.telemetry import MetricPoint, metrics_since, write_metrics
from db.tensorboard import zip_tensorboard
from tests.support import seed
from tests.support.workers import run_python, wait_for
from traindeck.cli import main


def _accumulator(run: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(run), size_guidance={SCALARS: 0})  # 0: keep every point
    accumulator.Reload()
    return accumulator


def _scalars(accumulator: EventAccumulator) -> dict[str, dict[int, float]]:
    return {
        tag: {event.step: event.value for event in accumulator.Scalars(tag)}
        for tag in accumulator.Tags()["scalars"]
    }


def _two_jobs(engine) -> tuple[int, int]:
    running = seed.running_job(engine).id
    # lr_find points are stored without a wall time; they take the job's start.
    lr_find = [MetricPoint("lr_find/loss", step, 2.5 - step / 10) for step in range(5)]
    write_metrics(engine, running, lr_find + seed.batch_points(30, 10))
    other = queue.submit(engine, {"name": "cpu job", "epochs": 1, "device": "cpu", "lr": 0.02})
    write_metrics(engine, other, seed.epoch_points(0))
    return running, other


def test_every_stored_point_comes_back_through_tensorboards_reader(
    engine, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(db.tensorboard, "PAGE", 7)  # several pages per series
    running, other = _two_jobs(engine)
    out = tmp_path / "logs"
    assert main(["export", "tensorboard", str(running), str(other), "--dir", str(out)]) == 0
    assert f"tensorboard --logdir {out}" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted([f"job-{running}", f"job-{other}"])
    for job_id in (running, other):
        scalars = _scalars(_accumulator(out / f"job-{job_id}"))
        stored = metrics_since(engine, job_id)
        expected: dict[str, dict[int, float]] = {}
        for row in stored:
            expected.setdefault(row.name, {})[row.step] = row.value
        exported = {tag: points for tag, points in scalars.items() if not tag.startswith("xla/")}
        assert exported.keys() == expected.keys()
        for name, points in expected.items():
            assert exported[name].keys() == points.keys(), name
            for step, value in points.items():  # TensorBoard keeps a scalar as float32
                assert exported[name][step] == float(np.float32(value)), (name, step)
        assert sum(map(len, exported.values())) == len(stored)
    xla = _scalars(_accumulator(out / f"job-{running}"))
    assert xla["xla/compiles"] == {0: 12.0, 1: 0.0}  # cumulative 12 then 12, per epoch
    assert xla["xla/compile_s"] == {0: 30.0, 1: 0.0}
    assert not any(tag.startswith("xla/") for tag in _scalars(_accumulator(out / f"job-{other}")))


def test_the_spec_is_the_runs_hyper_parameters(engine, tmp_path):
    _, other = _two_jobs(engine)
    db.tensorboard.export_tensorboard(engine, [other], tmp_path)
    accumulator = _accumulator(tmp_path / f"job-{other}")
    content = accumulator.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG]
    info = metadata.parse_session_start_info_plugin_data(content)
    spec = queue.get_job(engine, other).spec
    assert info.group_name == f"job-{other}"
    assert set(info.hparams) == set(spec)
    assert info.hparams["lr"].number_value == 0.02
    assert info.hparams["device"].string_value == "cpu"
    assert info.hparams["pretrained"].bool_value is spec["pretrained"]
    assert spec["grad_clip"] is None and info.hparams["grad_clip"].string_value == "null"


def test_exporting_again_replaces_the_run(engine, tmp_path):
    running, _ = _two_jobs(engine)
    logs = tmp_path / "logs"
    for _ in range(2):
        db.tensorboard.export_tensorboard(engine, [running], logs)
    files = list((logs / f"job-{running}").iterdir())
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents.")
    assert [p.name for p in logs.iterdir()] == [f"job-{running}"]  # no staging left


def test_the_zip_holds_the_same_runs(engine, tmp_path):
    running, other = _two_jobs(engine)
    buffer = io.BytesIO()
    zip_tensorboard(engine, [running, other], buffer)
    with zipfile.ZipFile(buffer) as archive:
        archive.extractall(tmp_path / "logs")
        names = archive.namelist()
    assert sorted(name.split("/")[0] for name in names) == sorted(
        [f"job-{running}", f"job-{other}"]
    )
    points = _scalars(_accumulator(tmp_path / "logs" / f"job-{running}"))["batch/train_loss"]
    assert len(points) == 40


@pytest.mark.parametrize("problem", ["unknown job", "dir under a file"])
def test_a_mistake_is_one_line_and_writes_nothing(engine, tmp_path, capsys, problem):
    running, _ = _two_jobs(engine)
    target = tmp_path / "logs"
    ids = [str(running)]
    if problem == "unknown job":
        ids.append("999")
        expected = "no job with id 999"
    else:
        (tmp_path / "file").write_text("")
        target = tmp_path / "file" / "logs"
        expected = "--dir: cannot write in"
    code = main(["export", "tensorboard", *ids, "--dir", str(target)])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and expected in err, err
    assert "Traceback" not in err
    assert not target.exists()


def test_the_export_loads_neither_torch_nor_tensorflow():
    loaded = run_python(
        "import sys, db.tensorboard, traindeck.diagnostics_cli\n"
        "print(sorted(m for m in ('torch', 'tensorflow', 'fastai') if m in sys.modules))"
    )
    assert loaded.strip() == "[]"


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_tensorboard_itself_serves_the_exported_runs(engine, database_url, tmp_path):
    """`tensorboard --logdir DIR` (its own server, as a person runs it) lists the runs, their
    scalars, the XLA compiles and the spec as hyper-parameters."""
    running, other = _two_jobs(engine)
    logs = tmp_path / "logs"
    db.tensorboard.export_tensorboard(engine, [running, other], logs)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("tensorboard")), "--logdir", str(logs),
         "--host", "127.0.0.1", "--port", str(port), "--load_fast=false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/data"
    try:

        def runs() -> list[str] | None:
            try:
                with urllib.request.urlopen(f"{base}/runs", timeout=5) as response:
                    return json.load(response) or None
            except OSError:
                return None

        assert sorted(wait_for(runs, 120, "TensorBoard's runs")) == sorted(
            [f"job-{running}", f"job-{other}"]
        )
        with urllib.request.urlopen(f"{base}/plugin/scalars/tags", timeout=30) as response:
            tags = json.load(response)
        assert "xla/compiles" in tags[f"job-{running}"]
        assert "epoch/accuracy" in tags[f"job-{other}"]
        query = f"{base}/plugin/scalars/scalars?run=job-{running}&tag=xla%2Fcompiles"
        with urllib.request.urlopen(query, timeout=30) as response:
            assert [(step, value) for _, step, value in json.load(response)] == [(0, 12), (1, 0)]
        request = urllib.request.Request(
            f"{base}/plugin/hparams/experiment", data=b'{"experimentName": ""}',
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            hparams = {info["name"] for info in json.load(response)["hparamInfos"]}
        assert {"lr", "arch", "device", "epochs"} <= hparams
    finally:
        server.terminate()
        server.wait(timeout=30)

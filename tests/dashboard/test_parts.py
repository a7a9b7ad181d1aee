"""The dashboard's pieces that need no page: charts, XLA arithmetic, form fields, downloads."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import numpy as np
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from dashboard import charts, downloads, spec_form, xla
from db.series import Buckets
from db.spec import JobSpec
from tests.support.seed import xla_summary

# --- charts ---------------------------------------------------------------------------------


def test_envelope_draws_points_once_and_buckets_as_min_and_max():
    points = Buckets.from_points(np.array([0, 1, 2]), np.array([3.0, 1.0, 2.0]))
    x, y = charts.envelope(points)
    assert x.tolist() == [0, 1, 2] and y.tolist() == [3.0, 1.0, 2.0]

    buckets = Buckets.from_rows([(0, 9, 1.0, 5.0, 30.0, 10), (10, 19, 0.5, 4.0, 20.0, 10)])
    x, y = charts.envelope(buckets)
    assert x.tolist() == [0, 9, 10, 19]
    assert y.tolist() == [1.0, 5.0, 4.0, 0.5]  # up in the first bucket, down in the next


def test_smoothing_points_is_fastais_debiased_moving_average():
    values = np.array([4.0, 2.0, 3.0, 1.0])
    beta = 0.9
    expected, average = [], 0.0
    for index, value in enumerate(values, start=1):
        average = beta * average + (1 - beta) * value
        expected.append(average / (1 - beta**index))

    smooth = charts.smoothed(Buckets.from_points(np.arange(4), values), beta)

    np.testing.assert_allclose(smooth, expected)


def test_smoothing_buckets_weighs_each_by_its_points():
    steps = np.arange(2000)
    values = np.where(steps < 1000, 2.0, 1.0)
    exact = charts.smoothed(Buckets.from_points(steps, values), 0.99)
    bucketed = Buckets.from_points(steps, values).coarsen(40)

    approximate = charts.smoothed(bucketed, 0.99)

    ends = bucketed.last_step
    np.testing.assert_allclose(approximate, exact[ends], atol=0.05)


def test_lr_find_figure_pairs_rates_and_losses_by_step():
    lrs = Buckets.from_points(np.arange(3), np.array([1e-5, 1e-3, 1e-1]))
    losses = Buckets.from_points(np.arange(3), np.array([2.0, 1.0, 5.0]))

    figure = charts.lr_find_figure(lrs, losses, 1e-3)

    assert list(figure.data[0].x) == [1e-5, 1e-3, 1e-1]
    assert list(figure.data[0].y) == [2.0, 1.0, 5.0]
    assert figure.layout.xaxis.type == "log"
    assert figure.layout.shapes[0].x0 == 1e-3


# --- XLA ------------------------------------------------------------------------------------


def test_epoch_charts_count_epochs_from_one_like_the_log():
    stored = Buckets.from_points(np.array([0, 1, 2]), np.array([0.9, 0.5, 0.4]))  # epoch indexes
    figure = charts.epoch_figure({"valid": stored}, "Loss per epoch", "loss")
    assert list(figure.data[0].x) == [1, 2, 3]
    assert list(figure.data[0].y) == [0.9, 0.5, 0.4]
    assert figure.layout.xaxis.title.text == "epoch"
    assert figure.layout.xaxis.dtick == 1, "whole epochs"

    long_run = Buckets.from_points(np.arange(95), np.linspace(1.0, 0.1, 95))
    assert charts.epoch_figure({"train": long_run}, "t", "loss").layout.xaxis.dtick == 10


def test_per_epoch_figures_are_differences_of_the_last_report_of_each_epoch():
    reports = [
        (0, xla_summary(5)),
        (0, xla_summary(12, {"aten::nonzero": 2})),  # a timer report later in epoch 0
        (1, xla_summary(12, {"aten::nonzero": 6})),
        (2, xla_summary(13, {"aten::nonzero": 6, "aten::_local_scalar_dense": 1})),
    ]

    epochs = xla.per_epoch(reports)

    assert [row.epoch for row in epochs] == [0, 1, 2]
    assert [row.compiles for row in epochs] == [12, 0, 1]
    assert [row.compile_s for row in epochs] == [30.0, 0.0, 2.5]
    assert [row.fallback_calls for row in epochs] == [2, 4, 1]
    assert xla.recompile_warning(epochs, "one_cycle").startswith(
        "XLA keeps compiling new graphs after the warm-up epochs: 1 in epoch 3."
    )
    rows = xla.fallback_rows(reports)
    assert rows == [
        {"op": "aten::nonzero", "calls": 6, "calls in latest epoch": 0},
        {"op": "aten::_local_scalar_dense", "calls": 1, "calls in latest epoch": 1},
    ]


def test_warm_up_epochs_restart_with_a_new_process_and_fine_tune_has_more():
    compiles = [10, 11, 15, 2, 2, 5]  # a retried job: a new process from epoch 3 on
    epochs = xla.per_epoch([(epoch, xla_summary(count)) for epoch, count in enumerate(compiles)])

    assert [row.compiles for row in epochs] == [10, 1, 4, 2, 0, 3]
    assert [row.process_epoch for row in epochs] == [0, 1, 2, 0, 1, 2]
    one_cycle = xla.recompile_warning(epochs, "one_cycle")
    assert "after the warm-up epochs: 1 in epoch 2, 4 in epoch 3, 3 in epoch 6." in one_cycle
    fine_tune = xla.recompile_warning(epochs, "fine_tune")  # epoch 2 unfroze the body
    assert "after the warm-up epochs: 4 in epoch 3, 3 in epoch 6." in fine_tune
    assert xla.recompile_warning(epochs[:1], "one_cycle") is None
    assert xla.recompile_warning(epochs[:2], "fine_tune") is None


def test_reports_with_missing_or_odd_values_do_not_break_the_panel():
    epochs = xla.per_epoch([(0, {"compile_count": "n/a", "aten_fallbacks": ["x"]}), (1, {})])
    assert [row.compiles for row in epochs] == [0, 0]
    assert xla.fallback_rows([(0, {"aten_fallbacks": None})]) == []


# --- the form's fields ----------------------------------------------------------------------


def test_every_spec_field_has_a_widget_with_the_specs_default_and_bounds():
    rendered = {
        field.name: field for fields in spec_form.form_fields().values() for field in fields
    }
    assert set(rendered) | set(spec_form.RENDERED_BY_PAGE) == set(JobSpec.model_fields)
    for name, field in rendered.items():
        assert field.default == JobSpec.model_fields[name].default
        assert JobSpec.model_fields[name].description in field.help()

    assert (rendered["epochs"].kind, rendered["epochs"].minimum, rendered["epochs"].maximum) == (
        "int",
        1,
        1000,
    )
    assert rendered["grad_clip"].kind == "float" and rendered["grad_clip"].optional
    assert rendered["grad_clip"].minimum == 0  # gt=0: the spec refuses 0 with a message
    assert rendered["lr"].kind == "float" and rendered["lr"].words == ("find",)
    assert rendered["arch"].choices == JobSpec.model_fields["arch"].annotation.__args__
    assert rendered["time_limit"].optional and rendered["time_limit"].kind == "int"
    assert rendered["augment"].kind == "bool"


# --- downloads ------------------------------------------------------------------------------


@pytest.fixture
def client() -> TestClient:
    return TestClient(Starlette(routes=downloads.routes()))


def test_a_download_link_streams_the_file_with_its_digest(client: TestClient, tmp_path: Path):
    model = tmp_path / "export.pkl"
    model.write_bytes(b"weights" * 100_000)
    digest = hashlib.sha256(model.read_bytes()).hexdigest()

    url = downloads.link_for(model, "job3-export.pkl", digest)
    assert url == downloads.link_for(model, "job3-export.pkl", digest)  # one link per file

    response = client.get(url)
    assert response.status_code == 200
    assert response.content == model.read_bytes()
    assert 'filename="job3-export.pkl"' in response.headers["content-disposition"]
    expected = base64.b64encode(bytes.fromhex(digest)).decode()
    assert response.headers["repr-digest"] == f"sha-256=:{expected}:"


def test_unknown_links_and_vanished_files_get_a_clear_answer(client: TestClient, tmp_path: Path):
    response = client.get(downloads.ROUTE_PREFIX + "not-a-token")
    assert response.status_code == 404
    assert "reload the job page" in response.text

    model = tmp_path / "gone.pkl"
    model.write_bytes(b"x")
    url = downloads.link_for(model, "gone.pkl", hashlib.sha256(b"x").hexdigest())
    model.unlink()
    response = client.get(url)
    assert response.status_code == 410
    assert "no longer on this machine" in response.text

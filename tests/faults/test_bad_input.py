"""Bad input, through the CLI and through the dashboard's forms: every spec field out of bounds,
wrong types, huge strings, SQL metacharacters in names, unicode names and class names.

Each bad value is refused with one line (CLI) or a message on the page (dashboard) that names
the field, and nothing is stored: no job row, no dataset row, no unpacked files. Names full of
quotes, semicolons and non-Latin letters are not bad: they are stored and read back verbatim.
The CLI runs in-process (`traindeck.cli.main`, the function `python -m db` calls) on SQLite and
Postgres; a few cases also go through a real `python -m db` process to show the exit code and
that no traceback reaches the terminal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select
from streamlit.testing.v1 import AppTest

from common.entry import EXIT_DATA_FOLDER
from datasets.register import register_folder
from db import queue
from db.datasets import get_dataset, list_datasets
from db.engine import dispose_engines, read_tx
from db.models import Dataset, Job
from db.spec import MAX_NAME_LENGTH
from tests.support.images import colour_for, make_folder_dataset, write_image
from tests.support.markdown import shown
from traindeck import cli

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "dashboard" / "app.py")
DATASETS_PAGE = str(ROOT / "dashboard" / "pages" / "datasets.py")

SQL_NAMES = [
    "Robert'); DROP TABLE jobs;--",
    '" OR 1=1 --',
    "x'; DELETE FROM datasets WHERE '1'='1",
    "%_\\ LIKE patterns",
]
UNICODE_NAMES = ["猫の分類 🐱", "ñandú — Ελληνικά", "עברית RTL", "e\u0301 (combining)"]
UNICODE_CLASSES = ["猫", "犬 dog", "ñandú", "Ελληνικά", "O'Brien; DROP TABLE datasets;--"]


def _count(engine: Engine, model) -> int:
    with read_tx(engine) as session:
        return session.scalar(select(func.count()).select_from(model))


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _refused(capsys, argv: list[str], words: str) -> str | None:
    """None if the CLI refused `argv` with one line holding `words`, else what went wrong."""
    try:
        code, out, err = _cli(capsys, *argv)
    except SystemExit as exc:  # argparse's own refusals
        code, out, err = exc.code, *capsys.readouterr()
    lines = err.strip().splitlines()
    if code != cli.EXIT_USER_ERROR:
        return f"{argv!r:.120}: exit {code}, out {out!r:.200}, err {err!r:.200}"
    if len(lines) != 1 or not lines[0].startswith("error: ") or words not in lines[0]:
        return f"{argv!r:.120}: expected one line with {words!r}, got {err!r:.300}"
    return None


# (flags, words in the message): every spec field out of bounds or of the wrong type.
SUBMIT_REFUSALS: list[tuple[list[str], str]] = [
    (["--epochs", "0"], "epochs: must be at least 1"),
    (["--epochs", "1001"], "epochs: must be at most 1000"),
    (["--epochs", "three"], "epochs: must be a whole number"),
    (["--epochs", "2.5"], "epochs: must be a whole number"),
    (["--epochs", "nan"], "epochs: must be a whole number"),
    (["--epochs", "9" * 5000], "epochs: is far too large a number"),
    (["--lr", "0"], "lr: must be greater than 0"),
    (["--lr", "-0.1"], "lr: must be greater than 0"),
    (["--lr", "11"], "lr: must be at most 10"),
    (["--lr", "nan"], "lr: must be greater than 0"),
    (["--lr", "inf"], "lr: must be at most 10"),
    (["--lr", "fast"], "lr: must be a positive number or 'find'"),
    (["--bs", "0"], "bs: must be at least 1"),
    (["--bs", "4097"], "bs: must be at most 4096"),
    (["--img-size", "7"], "img_size: must be at least 8"),
    (["--img-size", "1025"], "img_size: must be at most 1024"),
    (["--valid-pct", "0.01"], "valid_pct: must be at least 0.05"),
    (["--valid-pct", "0.9"], "valid_pct: must be at most 0.5"),
    (["--valid-pct", "nan"], "valid_pct: must be"),
    (["--seed", "-1"], "seed: must be at least 0"),
    (["--seed", str(2**31)], "seed: must be at most 2147483647"),
    (["--grad-accum", "0"], "grad_accum: must be at least 1"),
    (["--grad-accum", "1025"], "grad_accum: must be at most 1024"),
    (["--grad-clip", "0"], "grad_clip: must be greater than 0"),
    (["--grad-clip", "1e7"], "grad_clip: must be at most 1000000"),
    (["--wd", "-0.01"], "wd: must be at least 0"),
    (["--wd", "2"], "wd: must be at most 1"),
    (["--cores", "0"], "cores: must be at least 1"),
    (["--priority", "101"], "priority: must be at most 100"),
    (["--priority", "-101"], "priority: must be at least -100"),
    (["--max-attempts", "0"], "max_attempts: must be at least 1"),
    (["--max-attempts", "21"], "max_attempts: must be at most 20"),
    (["--time-limit", "0"], "time_limit: must be at least 1"),
    (["--time-limit", str(30 * 24 * 3600 + 1)], "time_limit: must be at most 2592000"),
    (["--arch", "resnet9000"], "arch: must be one of"),
    (["--arch", "resnet18'; DROP TABLE jobs;--"], "arch: must be one of"),
    (["--schedule", "cosine"], "schedule: must be one of"),
    (["--mixed-precision", "fp8"], "mixed_precision: must be one of"),
    (["--device", "gpu"], "device: must be one of"),
    (["--device", "xla", "--mixed-precision", "fp16"], "fp16 runs on CUDA only"),
    (["--device", "cpu", "--cores", "2"], "cores: only XLA jobs"),
    (["--name", "x" * (MAX_NAME_LENGTH + 1)], "name: must be at most 200 characters"),
    (["--name", "猫" * (MAX_NAME_LENGTH + 1)], "name: must be at most 200 characters"),
    (["--name", "x" * 1_000_000], "name: must be at most 200 characters"),
    (["--name", "tab\there"], "name: must not contain control characters"),
    (["--name", "nul\x00byte"], "name: must not contain control characters"),
    (["--name", "\udcff\udcfe"], "name: must be valid Unicode text"),
    (["--dataset", "nope"], "dataset: unknown dataset 'nope'"),
    (["--dataset", "x'; DROP TABLE datasets;--"], "dataset: unknown dataset"),
    (["--dataset", "d" * 101], "dataset: must be at most 100 characters"),
    (["--dataset", " "], "dataset: unknown dataset ''"),
    (["--spec", "/no/such/spec.json"], "--spec: cannot read /no/such/spec.json"),
]

# (contents of a --spec file, words in the message): wrong JSON types and shapes.
SPEC_FILE_REFUSALS: list[tuple[str, str]] = [
    ("{not json", "spec: is not valid JSON"),
    ("[1, 2, 3]", "must hold a JSON object"),
    ('"a string"', "must hold a JSON object"),
    ("[" * 100_000, "spec: is nested too deeply"),
    ('{"epochs": true}', "epochs: must be a number, not true or false"),
    ('{"lr": false}', "lr: must be a number, not true or false"),
    ('{"epochs": "three"}', "epochs: must be a whole number"),
    ('{"epochs": [1]}', "epochs: must be a whole number"),
    ('{"epochs": {"value": 1}}', "epochs: must be a whole number"),
    ('{"epochs": 1e400}', "epochs:"),
    ('{"lr": null}', "lr: must be a number"),
    ('{"name": 5}', "name: must be text"),
    ('{"name": null}', "name: must be text"),
    ('{"name": ["a"]}', "name: must be text"),
    ('{"pretrained": 2}', "pretrained: must be true or false"),
    ('{"augment": "sometimes"}', "augment: must be true or false"),
    ('{"seed": 123456789012345678901234567890}', "seed: must be at most 2147483647"),
    ('{"name": "\\ud800"}', "name: must be valid Unicode text"),
    ('{"name": "a\\u0000b"}', "name: must not contain control characters"),
    ('{"epochs": 2, "gpus": 8}', "gpus: is not a spec field"),
    ('{"__class__": "x"}', "__class__: is not a spec field"),
    (json.dumps({"name": "n" * 5_000_000}), "name: must be at most 200 characters"),
]


def test_the_cli_refuses_every_bad_spec_and_stores_nothing(
    engine: Engine, capsys: pytest.CaptureFixture[str], tmp_path: Path
):
    wrong = [_refused(capsys, ["submit", *flags], words) for flags, words in SUBMIT_REFUSALS]
    spec_file = tmp_path / "spec.json"
    for text, words in SPEC_FILE_REFUSALS:
        spec_file.write_text(text, encoding="utf-8", errors="surrogatepass")
        wrong.append(_refused(capsys, ["submit", "--spec", str(spec_file)], words))
    spec_file.write_bytes(b'{"name": "\xff\xfe"}')
    wrong.append(_refused(capsys, ["submit", "--spec", str(spec_file)], "is not UTF-8 text"))
    assert [problem for problem in wrong if problem] == []
    assert _count(engine, Job) == 0


def test_sql_metacharacters_and_unicode_in_names_are_stored_verbatim(
    engine: Engine, capsys: pytest.CaptureFixture[str]
):
    names = [*SQL_NAMES, *UNICODE_NAMES, "猫" * MAX_NAME_LENGTH]
    for name in names:
        code, out, err = _cli(capsys, "submit", "--name", name, "--json")
        assert (code, err) == (0, ""), name
        job_id = json.loads(out)["id"]
        code, out, _ = _cli(capsys, "show", str(job_id), "--json")
        assert json.loads(out)["name"] == name
    assert [job.name for job in queue.list_jobs(engine)] == names[::-1]
    code, out, _ = _cli(capsys, "jobs", "--json")
    assert {job["name"] for job in json.loads(out)} == set(names)


def test_the_cli_refuses_bad_datasets_and_stores_nothing(
    engine: Engine, capsys: pytest.CaptureFixture[str], data_dir: Path, tmp_path: Path
):
    good = make_folder_dataset(data_dir / "animals", ("cat", "dog"), per_class=3)
    not_a_zip = data_dir / "images.zip"
    not_a_zip.write_bytes(b"PK but not really a zip")
    outside = tmp_path / "outside"
    outside.mkdir()
    cases: list[tuple[list[str], str]] = [
        (["x'; DROP TABLE datasets;--", "--folder", str(good)], "dataset name"),
        (["猫 狗", "--folder", str(good)], "dataset name"),
        (["猫\u200b狗", "--folder", str(good)], "dataset name"),
        (["a" * 101, "--folder", str(good)], "longer than 100 characters"),
        (["", "--folder", str(good)], "name"),
        (["a\x00b", "--folder", str(good)], "dataset name"),
        (["digits", "--folder", str(good)], "digits"),
        (["pets", "--folder", str(outside)], "outside the allowed data roots"),
        (["pets", "--folder", "/etc"], "outside the allowed data roots"),
        (["pets", "--folder", str(data_dir / "missing")], "does not exist"),
        (["pets", "--folder", str(good) + "\x00/x"], "is not a usable path"),
        (["pets", "--folder", str(good), "--label-regex", "("], "label regex '(' is not valid"),
        (["pets", "--folder", str(good), "--label-regex", "no_group"], "needs a group"),
        (["pets", "--csv", str(data_dir / "labels.csv")], "does not exist"),
        (["pets", "--zip", str(not_a_zip)], "not a readable zip archive"),
        (["pets", "--url", "file:///etc/passwd"], "nor an http(s) URL"),
        (["pets", "--url", "javascript:alert(1)"], "nor an http(s) URL"),
        (["pets", "--csv", str(good), "--label-regex", "(.+)"], "does not apply to --csv"),
    ]
    wrong = [_refused(capsys, ["dataset", "add", *args], words) for args, words in cases]
    assert [problem for problem in wrong if problem] == []
    assert _count(engine, Dataset) == 0
    assert not (data_dir / "datasets" / "uploads").exists() or not any(
        (data_dir / "datasets" / "uploads").iterdir()
    )


def test_unicode_and_sql_class_names_are_registered_and_trained_on_verbatim(
    engine: Engine, capsys: pytest.CaptureFixture[str], data_dir: Path
):
    root = data_dir / "unicode-classes"
    for index, label in enumerate(UNICODE_CLASSES):
        for number in range(3):
            write_image(root / label / f"{number}.png", colour_for(index))
    code, out, err = _cli(capsys, "dataset", "add", "unicode-set", "--folder", str(root), "--json")
    assert (code, err) == (0, "")
    assert sorted(json.loads(out)["class_counts"]) == sorted(UNICODE_CLASSES)
    stored = get_dataset(engine, "unicode-set")
    assert sorted(stored.classes) == sorted(UNICODE_CLASSES)
    assert stored.class_counts == dict.fromkeys(UNICODE_CLASSES, 3)
    code, out, err = _cli(capsys, "submit", "--dataset", "unicode-set", "--bs", "8", "--json")
    assert (code, err) == (0, "")
    assert queue.get_job(engine, json.loads(out)["id"]).spec["dataset"] == "unicode-set"


def _python_m_db(*argv: str | bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "db", *argv], capture_output=True, cwd=ROOT, timeout=120
    )


@pytest.mark.slow  # starts several real processes, one after another
def test_a_real_cli_process_exits_2_with_one_line_and_no_traceback(
    sqlite_engine: Engine, tmp_path: Path
):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    runs = [
        (_python_m_db("submit", "--epochs", "0"), b"epochs: must be at least 1"),
        (_python_m_db("submit", "--spec", str(deep)), b"nested too deeply"),
        # Bytes that are not UTF-8, as a terminal can pass them.
        (_python_m_db("submit", "--name", b"\xff\xfe"), b"name: must be valid Unicode text"),
        (_python_m_db("dataset", "add", "x", "--folder", b"/tmp/\xff"), b"error: "),
        (_python_m_db("submit", "--epochs"), b"expected one argument"),
    ]
    for result, words in runs:
        assert result.returncode == cli.EXIT_USER_ERROR, result.stderr
        assert b"Traceback" not in result.stderr
        assert words in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert _count(sqlite_engine, Job) == 0
    assert _count(sqlite_engine, Dataset) == 0


@pytest.mark.slow  # starts several real processes, one after another
def test_an_unusable_data_folder_is_one_line_from_every_command(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("TRAINDECK_DATA", "/proc/nope")
    reason = "cannot create the data folder /proc/nope (TRAINDECK_DATA): No such file or directory"
    # SQLite in the data folder, then a Postgres database (never reached) beside it.
    for database_url in ("", "postgresql://traindeck@127.0.0.1:1/none"):
        monkeypatch.setenv("DATABASE_URL", database_url)
        for command in (
            ["db", "jobs"],
            ["db", "dataset", "builtin"],
            ["worker", "--once"],
        ):
            if database_url and command == ["db", "jobs"]:
                continue  # needs no data folder when the database is elsewhere
            result = subprocess.run(
                [sys.executable, "-m", *command], capture_output=True, cwd=ROOT, timeout=120
            )
            assert result.returncode == EXIT_DATA_FOLDER, (command, result.stderr)
            assert result.stderr.decode().splitlines() == [f"traindeck: {reason}"], command

    monkeypatch.setenv("DATABASE_URL", "")
    dispose_engines()
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert "traindeck cannot use its data folder:" in _errors(at)
    assert [code.value for code in at.code] == [reason]


# --- the dashboard's New job form (AppTest) ----------------------------------------------------


@pytest.fixture
def _fresh_dashboard_engine():
    dispose_engines()
    yield
    dispose_engines()


def _new_job_form() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/new_job.py")
    at.run()
    assert not at.exception
    return at


def _widget(widgets, key: str):
    return next(widget for widget in widgets if widget.key == key)


def _queue(at: AppTest) -> AppTest:
    next(button for button in at.button if button.label == "Queue job").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _errors(at: AppTest) -> list[str]:
    """The error messages as a person reads them (outside text in them is escaped)."""
    return [shown(error.value) for error in at.error]


@pytest.mark.usefixtures("_fresh_dashboard_engine")
def test_the_new_job_form_refuses_bad_names_and_datasets_with_a_message(engine: Engine):
    cases = [
        ("x" * 10_000, "must be at most 200 characters"),
        ("bell\x07", "must not contain control characters"),
        ("line\nbreak", "must not contain control characters"),
    ]
    for value, words in cases:
        at = _new_job_form()
        _widget(at.text_input, "spec.name").input(value)
        _queue(at)
        assert words in _errors(at), (value[:20], _errors(at))
        assert "Nothing was queued: fix the fields marked above." in _errors(at)
        assert not at.success

    # A copied job whose dataset was removed since (or a forged session value).
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/new_job.py")
    at.session_state["spec.dataset"] = "x'; DROP TABLE datasets;--"
    at.run()
    _queue(at)
    assert any("unknown dataset" in error for error in _errors(at)), _errors(at)

    at = _new_job_form()
    _widget(at.selectbox, "spec.device").select("xla")
    _widget(at.selectbox, "spec.mixed_precision").select("fp16")
    _queue(at)
    assert any("fp16 runs on CUDA only" in error for error in _errors(at)), _errors(at)
    assert _count(engine, Job) == 0


@pytest.mark.usefixtures("_fresh_dashboard_engine")
def test_the_form_never_sends_a_number_out_of_bounds(engine: Engine):
    # The browser's number inputs stop at the spec's bounds; a value forged past them is put
    # back to the widget's default by Streamlit, so the spec never sees it.
    at = _new_job_form()
    for key, value in (("spec.epochs", 5000), ("spec.bs", 0), ("spec.valid_pct", 0.99)):
        _widget(at.number_input, key).set_value(value)
    at.run()
    _queue(at)
    spec = queue.get_job(engine, 1).spec
    assert 1 <= spec["epochs"] <= 1000 and 1 <= spec["bs"] <= 4096
    assert 0.05 <= spec["valid_pct"] <= 0.5


@pytest.mark.usefixtures("_fresh_dashboard_engine")
def test_the_form_stores_sql_and_unicode_names_verbatim(engine: Engine):
    for name in [*SQL_NAMES, *UNICODE_NAMES]:
        at = _new_job_form()
        _widget(at.text_input, "spec.name").input(name)
        _queue(at)
        assert not _errors(at), _errors(at)
        assert at.success[0].value.startswith("Queued job #")
    assert [job.name for job in queue.list_jobs(engine)] == [*SQL_NAMES, *UNICODE_NAMES][::-1]


@pytest.mark.usefixtures("_fresh_dashboard_engine")
def test_a_batch_larger_than_the_training_images_is_refused_at_submit(
    sqlite_engine: Engine, capsys: pytest.CaptureFixture[str], data_dir: Path
):
    # 48 images, of which a random split by the default valid_pct 0.2 trains on 39.
    folder = make_folder_dataset(data_dir / "small", ("cat", "dog"), per_class=24)
    register_folder(sqlite_engine, "small", folder)
    message = "batch size 64 is larger than the 39 training images of dataset 'small'; lower bs"

    result = _python_m_db("submit", "--dataset", "small", "--bs", "64")
    assert result.returncode == cli.EXIT_USER_ERROR
    assert result.stderr.decode().splitlines() == [f"error: bs: {message}"]
    assert (
        _refused(capsys, ["submit", "--dataset", "small", "--bs", "40"], "the 39 training") is None
    )
    assert _cli(capsys, "submit", "--dataset", "small", "--bs", "39")[0] == 0

    at = _new_job_form()
    _widget(at.selectbox, "spec.dataset").select("small")
    _widget(at.number_input, "spec.bs").set_value(64)
    at.run()
    assert "Training images: 39 of 48 (20% held out for validation)." in [
        caption.value for caption in at.caption
    ]
    _queue(at)
    assert message in _errors(at), _errors(at)
    assert _count(sqlite_engine, Job) == 1


# --- the dashboard's Datasets page (AppTest) ---------------------------------------------------


def _register_folder(name: str, folder: str, regex: str = "") -> AppTest:
    at = AppTest.from_file(DATASETS_PAGE, default_timeout=60)
    at.run()
    _widget(at.text_input, "datasets.folder.name").input(name)
    _widget(at.text_input, "datasets.folder.path").input(folder)
    _widget(at.text_input, "datasets.folder.regex").input(regex)
    next(b for b in at.button if b.proto.form_id == "datasets.folder").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.usefixtures("_fresh_dashboard_engine")
def test_the_datasets_page_refuses_bad_registrations_with_a_message(engine: Engine, data_dir: Path):
    good = make_folder_dataset(data_dir / "animals", ("cat", "dog"), per_class=3)
    cases = [
        ("x'; DROP TABLE datasets;--", str(good), "", "dataset name"),
        ("n" * 101, str(good), "", "longer than 100 characters"),
        ("pets", "/etc", "", "outside the allowed data roots"),
        ("pets", str(good) + "\x00", "", "is not a usable path"),
        ("pets", str(good), "(", "is not valid"),
    ]
    for name, folder, regex, words in cases:
        at = _register_folder(name, folder, regex)
        assert any(words in error for error in _errors(at)), (name[:20], _errors(at))
    assert list_datasets(engine) == []


@pytest.mark.usefixtures("_fresh_dashboard_engine")
def test_the_datasets_page_registers_unicode_class_names(engine: Engine, data_dir: Path):
    root = data_dir / "unicode-classes"
    for index, label in enumerate(UNICODE_CLASSES):
        for number in range(3):
            write_image(root / label / f"{number}.png", colour_for(index))
    at = _register_folder("unicode-set", str(root))
    assert not _errors(at)
    assert sorted(get_dataset(engine, "unicode-set").classes) == sorted(UNICODE_CLASSES)
    # The class chart names every class as it is.
    charts = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    drawn = json.dumps(charts, ensure_ascii=False)
    assert all(label in drawn for label in UNICODE_CLASSES), drawn[:500]

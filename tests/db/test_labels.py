"""Tags and notes (issue 18): set at submit by spec, CLI and form, edited later, validated by one
set of rules, and filtered in SQL with the other filters."""

from __future__ import annotations

import json

import pytest

from db import queue
from db.engine import read_tx
from db.joblist import JobFilter, count
from db.jobs_table import job_page
from db.jobview import describe_job, iter_jobs
from db.labels import all_tags, job_labels, set_labels
from db.spec import MAX_TAGS, SpecError, parse_labels, parse_spec
from traindeck.cli import main


def test_tags_are_trimmed_kept_once_and_in_order_from_a_list_or_a_comma_separated_string():
    assert parse_spec({"tags": " b , a,b,, "}).tags == ("b", "a")
    assert parse_spec({"tags": ["b", " a ", "b"]}).tags == ("b", "a")
    assert parse_spec({"note": "line 1\r\nline 2 \n"}).note == "line 1\nline 2"


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"tags": 5}, "tags", "must be a list of tags, or tags separated by commas"),
        ({"tags": [1]}, "tags", "must be a list of tags, or tags separated by commas"),
        ({"tags": ["a,b"]}, "tags", "a tag must not contain a comma ('a,b')"),
        ({"tags": ["a\x07"]}, "tags", "a tag must not contain control characters"),
        ({"tags": ["x" * 51]}, "tags", "a tag must be at most 50 characters"),
        ({"tags": [str(i) for i in range(MAX_TAGS + 1)]}, "tags", "at most 20 tags, not 21"),
        ({"note": "a\x00b"}, "note", "must not contain control characters"),
        ({"note": "x" * 20_001}, "note", "must be at most 20000 characters"),
        ({"note": 3}, "note", "must be text"),
    ],
)
def test_bad_tags_and_notes_are_refused_naming_the_field(data, field, message):
    for parse in (parse_spec, parse_labels):
        with pytest.raises(SpecError) as refused:
            parse(data)
        assert refused.value.problems[field].startswith(message)


def test_submit_keeps_tags_and_note_beside_the_spec_and_a_retry_carries_them(engine):
    job_id = queue.submit(engine, {"name": "a", "tags": ["baseline", "lr"], "note": "**why**"})
    job = describe_job(engine, job_id)
    assert (job["tags"], job["note"]) == (["baseline", "lr"], "**why**")
    assert "tags" not in job["spec"] and "note" not in job["spec"]  # the worker's spec
    queue.cancel(engine, job_id)
    retried = describe_job(engine, queue.retry(engine, job_id))
    assert (retried["tags"], retried["note"]) == (["baseline", "lr"], "**why**")


def test_labels_are_edited_alone_or_together_and_a_bad_edit_changes_nothing(engine):
    job_id = queue.submit(engine, {"tags": "a, b", "note": "first"})
    assert set_labels(engine, job_id, {"note": "second"}).tags == ("a", "b")
    assert job_labels(engine, job_id).note == "second"
    set_labels(engine, job_id, {"tags": ["c"]})
    assert job_labels(engine, job_id).model_dump() == {"tags": ("c",), "note": "second"}
    with pytest.raises(SpecError) as refused:
        set_labels(engine, job_id, {"tags": ["ok"], "note": "bad\x00"})
    assert set(refused.value.problems) == {"note"}
    assert job_labels(engine, job_id).model_dump() == {"tags": ("c",), "note": "second"}
    with pytest.raises(SpecError) as refused:
        set_labels(engine, job_id, {"colour": "red"})
    assert refused.value.problems == {"colour": "is not a spec field"}
    with pytest.raises(queue.JobNotFound):
        set_labels(engine, job_id + 1, {"note": "x"})


def test_filters_by_tag_status_dataset_arch_and_text_are_sql_conditions(engine):
    ids = {
        "a": queue.submit(engine, {"name": "alpha", "tags": ["x", "y"], "arch": "resnet34"}),
        "b": queue.submit(engine, {"name": "beta", "tags": ["x"], "note": "try 50% less LR"}),
        "c": queue.submit(engine, {"name": "gamma", "tags": ["y"], "arch": "resnet34"}),
        "d": queue.submit(engine, {"name": "delta"}),
    }
    queue.cancel(engine, ids["c"])

    def listed(**filters) -> list[int]:
        return [row.id for row in job_page(engine, JobFilter(**filters), limit=10).rows]

    assert listed(tags=("x",)) == [ids["b"], ids["a"]]
    assert listed(tags=("x", "y")) == [ids["a"]]  # every tag named
    assert listed(tags=("y",), statuses=("queued",)) == [ids["a"]]
    assert listed(arch="resnet34") == [ids["c"], ids["a"]]
    assert listed(dataset="digits", arch="resnet18") == [ids["d"], ids["b"]]
    assert listed(search="50% LESS") == [ids["b"]]  # the note, any case, % taken as text
    assert listed(search="GAM") == [ids["c"]]
    assert listed(tags=("nope",)) == []
    with read_tx(engine) as connection:
        assert count(connection, JobFilter(tags=("x",))) == 2
    assert all_tags(engine) == {"x": 2, "y": 2}
    rows = {row.id: row for row in job_page(engine, limit=10).rows}
    assert rows[ids["a"]].tags == ("x", "y") and rows[ids["b"]].note == "try 50% less LR"
    listed_dicts = list(iter_jobs(engine, JobFilter(tags=("y",))))
    assert [(job["id"], job["tags"]) for job in listed_dicts] == [
        (ids["c"], ["y"]),
        (ids["a"], ["x", "y"]),
    ]


def test_the_cli_sets_tags_and_note_lists_by_tag_and_shows_them(engine, capsys, tmp_path):
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps({"tags": ["from-file"], "note": "in the file"}))
    assert main(["submit", "--spec", str(spec_file), "--tag", "a", "--tag", "b c", "--json"]) == 0
    job_id = json.loads(capsys.readouterr().out)["id"]
    assert main(["submit", "--spec", str(spec_file), "--note", "flag wins", "--json"]) == 0
    other = json.loads(capsys.readouterr().out)["id"]

    assert main(["show", str(job_id), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["tags"], shown["note"]) == (["a", "b c"], "in the file")  # --tag replaces
    assert describe_job(engine, other)["note"] == "flag wins"

    assert main(["jobs", "--tag", "b c", "--json"]) == 0
    assert [job["id"] for job in json.loads(capsys.readouterr().out)] == [job_id]
    assert main(["show", str(job_id)]) == 0
    out = capsys.readouterr().out
    assert "tags:      a, b c" in out and "note:\n    in the file" in out

    assert main(["submit", "--tag", "a,b"]) == 2
    assert capsys.readouterr().err == "error: tags: a tag must not contain a comma ('a,b')\n"

"""Alerts (issue 18): destinations checked and masked with Apprise; each event queued in the
outbox with the change that caused it; each alert sent once however many processes drain the
outbox (three workers and two dashboards); retried with back-off while the receiver is down
and sent once it is back; every outcome in the job's log. Against a JSON receiver on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from alerts.destinations import masked_url, save_destination
from alerts.drain import Drainer, drain
from db import alerts, queue
from db.alerts import list_destinations, recent_alerts, remove_destination
from db.engine import read_tx, write_tx
from db.inputs import FieldError
from db.models import ALERT_EVENTS, AlertOutbox, Job, utcnow
from db.telemetry import add_events, events_since
from tests.support.receiver import Receiver
from worker.input_wait import input_bound_warning
from worker.xla_report import compile_growth_warning

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def receiver():
    receiver = Receiver().up()
    yield receiver
    receiver.down()


def finished(engine, status: str = "succeeded", error: str | None = None, name: str = "j") -> int:
    queue.submit(engine, {"name": name})
    claimed = queue.claim(engine, "worker-a")
    assert queue.finish(engine, claimed.lease, status, error)
    return claimed.id


def outbox(engine) -> list[tuple[str, int | None]]:
    with read_tx(engine) as connection:
        rows = connection.execute(
            select(AlertOutbox.event, AlertOutbox.job_id).order_by(AlertOutbox.id)
        )
        return [tuple(row) for row in rows]


def test_a_destination_is_checked_by_apprise_and_never_shown_whole(engine):
    url = "json://ada:s3cret-pass@127.0.0.1:9/hook"
    assert "s3cret-pass" not in masked_url(url)
    save_destination(engine, "hook", url, ["succeeded", "failed"])
    [shown] = list_destinations(engine)
    assert (shown.name, shown.events) == ("hook", ("succeeded", "failed"))
    assert "s3cret" not in shown.shown_url and "127.0.0.1" in shown.shown_url
    bad = [
        (("other", "nothing://here", ["failed"]), "url"),
        (("other", "", ["failed"]), "url"),
        (("hook", url, ["failed"]), "name"),
        (("other", url, ["exploded"]), "events"),
        (("other", url, []), "events"),
        (("bad\nname", url, ["failed"]), "name"),
    ]
    for arguments, field in bad:
        with pytest.raises(FieldError) as refused:
            save_destination(engine, *arguments)
        assert refused.value.field == field
    assert len(list_destinations(engine)) == 1
    assert remove_destination(engine, "hook") and not remove_destination(engine, "hook")


def test_each_event_is_queued_once_with_the_change_that_caused_it(engine):
    save_destination(engine, "all", "json://127.0.0.1:9/all", ALERT_EVENTS)
    save_destination(engine, "failures", "json://127.0.0.1:9/f", ["failed", "diverged"])
    succeeded = finished(engine)
    failed = finished(engine, "failed", "Traceback…\nRuntimeError: out of memory")
    diverged = finished(engine, "failed", "training diverged: the loss is nan in epoch 2/3")
    finished(engine, "cancelled", "cancelled")
    pruned = finished(engine, "pruned", "trial 3 of sweep 1 pruned at epoch 2")
    running = queue.submit(engine, {})
    queue.claim(engine, "worker-gone")
    with write_tx(engine) as connection:
        connection.execute(update(Job).where(Job.id == running).values(
            heartbeat_at=utcnow() - timedelta(hours=1)))  # fmt: skip
    assert queue.requeue_stale(engine, 60) == [(running, "queued")]
    growth = compile_growth_warning(2, False, {"compile_count": 3}, {"compile_count": 5})
    bound = input_bound_warning(1, waited_s=6.0, pass_s=10.0)
    assert input_bound_warning(1, waited_s=5.0, pass_s=10.0) is None
    for _ in range(2):  # the same event twice: one alert
        add_events(engine, running, [("warning", growth), ("info", "epoch 3 done")])
        add_events(engine, running, [("warning", bound)])
        add_events(engine, running, [("info", "stopped early at epoch 4/10: valid_loss did not "
                                      "improve by more than 0 for 2 epoch(s)")])  # fmt: skip
    assert outbox(engine) == [
        ("succeeded", succeeded),
        ("failed", failed), ("failed", failed),
        ("diverged", diverged), ("diverged", diverged),
        ("stopped_early", pruned),
        ("worker_lost", running),
        ("recompiling", running),
        ("input_bound", running),
        ("stopped_early", running),
    ]  # fmt: skip


@pytest.mark.slow  # starts several real processes, one after another
def test_an_alert_is_sent_once_per_event_by_three_workers_and_two_dashboards(engine, receiver):
    save_destination(engine, "hook", receiver.url, ["succeeded"])
    jobs = [finished(engine, name=f"job {i}") for i in range(24)]
    drainers = [
        subprocess.Popen(
            [sys.executable, "-m", "alerts.drain", "--once", "--owner", owner],
            cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        for owner in ("worker-1", "worker-2", "worker-3", "dashboard-1", "dashboard-2")
    ]  # fmt: skip
    outputs = [drainer.communicate(timeout=120)[0] for drainer in drainers]
    assert all(drainer.returncode == 0 for drainer in drainers), outputs
    sent = sum(int(output.split("sent ")[-1].split()[0]) for output in outputs)
    expected = sorted(
        f"traindeck: job #{job_id} (job {i}): succeeded" for i, job_id in enumerate(jobs)
    )
    assert sorted(receiver.titles()) == expected and sent == len(jobs)
    assert {row.outcome for row in recent_alerts(engine)} == {"sent"}
    log = [event.message for event in events_since(engine, jobs[0])]
    assert "alert 'succeeded' sent to hook" in log
    assert drain(engine, "worker-1") == 0 and len(receiver.titles()) == len(jobs)


def test_a_down_receiver_gets_the_alert_once_after_it_comes_back(engine, receiver):
    save_destination(engine, "hook", receiver.url, ["failed"])
    receiver.down()
    job_id = finished(engine, "failed", "RuntimeError: boom")
    start = utcnow()
    assert drain(engine, "worker-1", now=start) == 0
    [row] = recent_alerts(engine)
    assert (row.outcome, row.attempts) == ("pending", 1)
    assert row.next_attempt_at == start + timedelta(seconds=10)
    assert "Connection error" in row.last_error
    assert drain(engine, "worker-2", now=start + timedelta(seconds=9)) == 0  # not due yet
    assert drain(engine, "worker-2", now=start + timedelta(seconds=10)) == 0  # still down
    assert recent_alerts(engine)[0].next_attempt_at == start + timedelta(seconds=30)

    receiver.up()
    assert drain(engine, "dashboard-1", now=start + timedelta(seconds=30)) == 1
    assert receiver.titles() == [f"traindeck: job #{job_id} (j): failed"]
    assert receiver.received[0]["message"] == f"Job #{job_id} failed: RuntimeError: boom"
    assert drain(engine, "dashboard-2", now=start + timedelta(hours=1)) == 0
    assert len(receiver.received) == 1
    log = [event.message for event in events_since(engine, job_id)]
    assert any(line.startswith("alert 'failed' to hook failed (") and "retrying in 10 s" in line
               for line in log)  # fmt: skip
    assert log[-1] == "alert 'failed' sent to hook"


def test_an_alert_is_given_up_after_its_attempts(sqlite_engine, receiver):
    save_destination(sqlite_engine, "hook", receiver.url, ["succeeded"])
    receiver.down()
    finished(sqlite_engine)
    moment = utcnow()
    for _ in range(alerts.MAX_ATTEMPTS):
        drain(sqlite_engine, "worker-1", now=moment)
        moment += timedelta(seconds=alerts.MAX_RETRY_S)
    [row] = recent_alerts(sqlite_engine)
    assert (row.outcome, row.attempts) == ("gave up", alerts.MAX_ATTEMPTS)
    receiver.up()
    assert drain(sqlite_engine, "worker-1", now=moment + timedelta(days=1)) == 0
    assert receiver.received == []


def test_alerts_sent_or_given_up_on_are_deleted_after_the_retention(
    sqlite_engine, receiver, monkeypatch
):
    engine = sqlite_engine
    monkeypatch.setenv("TRAINDECK_ALERT_RETENTION_DAYS", "7")
    save_destination(engine, "hook", receiver.url, ["succeeded", "failed"])
    old_sent, old_gave_up, old_pending, new_sent = (finished(engine) for _ in range(4))
    assert drain(engine, "worker-1") == 4
    long_ago = utcnow() - timedelta(days=8)
    with write_tx(engine) as connection:
        connection.execute(
            update(AlertOutbox).where(AlertOutbox.job_id == old_sent).values(sent_at=long_ago)
        )
        connection.execute(
            update(AlertOutbox)
            .where(AlertOutbox.job_id == old_gave_up)
            .values(sent_at=None, gave_up_at=long_ago)
        )
        connection.execute(
            update(AlertOutbox)
            .where(AlertOutbox.job_id == old_pending)
            .values(sent_at=None, created_at=long_ago, next_attempt_at=utcnow() + timedelta(days=1))
        )
    drainer = Drainer(lambda: engine, "worker-2")
    drainer.turn()
    assert sorted(job_id for _, job_id in outbox(engine)) == [old_pending, new_sent]
    assert len(receiver.received) == 4, "nothing was sent again"

    # Cleaned at the drainer's first turn, then at most once an hour.
    with write_tx(engine) as connection:
        connection.execute(
            update(AlertOutbox).where(AlertOutbox.job_id == new_sent).values(sent_at=long_ago)
        )
    drainer.turn()
    assert sorted(job_id for _, job_id in outbox(engine)) == [old_pending, new_sent]
    assert Drainer(lambda: engine, "worker-3").turn() is None
    assert [job_id for _, job_id in outbox(engine)] == [old_pending], "pending ones stay"


def test_the_settings_page_adds_a_destination_shows_it_masked_and_removes_it(sqlite_engine):
    from streamlit.testing.v1 import AppTest

    from tests.dashboard.test_job_lists import APP, run
    from tests.support.markdown import shown

    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/settings.py")
    run(at)

    def add(name: str, url: str, events: list[str]) -> None:
        at.text_input(key="settings.alert_name").input(name)
        at.text_input(key="settings.alert_url").input(url)
        at.multiselect(key="settings.alert_events").set_value(events)
        next(b for b in at.button if b.label == "Add destination").click()
        run(at)

    add("team", "nope://x", ["failed"])
    assert any(shown(e.value).startswith("url: nope:// is not a service") for e in at.error)
    add("team", "json://ada:s3cret@127.0.0.1:9/hook", ["failed", "worker_lost"])
    assert at.text_input(key="settings.alert_url").value == ""
    [table] = [frame.value for frame in at.dataframe if "URL (masked)" in frame.value]
    assert list(table["name"]) == ["team"] and list(table["events"]) == ["failed, worker_lost"]
    assert "s3cret" not in table["URL (masked)"][0]
    next(b for b in at.button if b.label == "Remove").click()
    run(at)
    assert list_destinations(sqlite_engine) == []


def test_the_cli_adds_lists_logs_and_removes_destinations(sqlite_engine, capsys):
    import json

    from traindeck.cli import main

    url = "json://ada:s3cret@127.0.0.1:9/hook"
    assert main(["alerts", "add", "hook", url, "--on", "failed", "--on", "diverged"]) == 0
    assert "s3cret" not in capsys.readouterr().out
    assert main(["alerts", "list", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert (listed["name"], listed["events"]) == ("hook", ["failed", "diverged"])
    assert "s3cret" not in listed["url"]
    finished(sqlite_engine, "failed", "boom")
    assert main(["alerts", "log", "--json"]) == 0
    assert [(a["event"], a["outcome"]) for a in json.loads(capsys.readouterr().out)] == [
        ("failed", "pending")
    ]
    assert main(["alerts", "add", "x", "nope://y", "--on", "failed"]) == 2
    assert capsys.readouterr().err.startswith("error: url: nope:// is not a service Apprise")
    assert main(["alerts", "remove", "hook"]) == 0
    assert main(["alerts", "remove", "hook"]) == 2
    assert capsys.readouterr().err.endswith("error: no alert destination named 'hook'\n")


@pytest.mark.slow
def test_real_workers_and_dashboards_send_each_alert_once(engine, receiver, tmp_path):
    """Three `python -m worker` and two `python -m dashboard`, all draining one outbox."""
    from tests.support.browser import start_dashboard, stop_dashboard
    from tests.support.workers import output_tail, start_worker, wait_for

    jobs = [finished(engine, name=f"job {i}") for i in range(24)]  # before any worker runs
    save_destination(engine, "hook", receiver.url, ["succeeded"])
    workers = [start_worker("--poll-interval", "1", "--worker-id", f"w{i}") for i in range(3)]
    dashboards = []
    try:
        for i in range(2):
            log = tmp_path / f"dashboard{i}.log"
            dashboards.append(start_dashboard("127.0.0.1", dict(os.environ), log)[0])
        with write_tx(engine) as connection:  # the jobs' ends, recorded while all five run
            for job_id in jobs:
                alerts.record_finish(connection, job_id, 1, "succeeded", None)

        def all_sent() -> bool:
            with read_tx(engine) as connection:
                pending = select(AlertOutbox.id).where(AlertOutbox.sent_at.is_(None))
                return connection.execute(pending).first() is None

        wait_for(all_sent, 120, "every alert to be sent")
    finally:
        for server in dashboards:
            stop_dashboard(server)
        for worker in workers:
            worker.terminate()
        tails = [output_tail(worker) for worker in workers]
    expected = sorted(
        f"traindeck: job #{job_id} (job {i}): succeeded" for i, job_id in enumerate(jobs)
    )
    assert sorted(receiver.titles()) == expected, tails
    with read_tx(engine) as connection:
        senders = set(connection.execute(select(AlertOutbox.claimed_by)).scalars())
    assert senders <= {
        *(f"worker:w{i}" for i in range(3)),
        *(s for s in senders if s.startswith("dashboard:")),
    }


def test_a_drainer_without_its_database_says_so_once_and_again_when_it_is_back(
    sqlite_engine, caplog
):
    from alerts.drain import Drainer
    from db.engine import create_db_engine

    caplog.set_level("INFO", logger="alerts.drain")
    unmigrated = create_db_engine(f"sqlite:///{sqlite_engine.url.database}-empty")
    source = [unmigrated]
    drainer = Drainer(lambda: source[0], "worker-1")
    for _ in range(3):
        drainer.turn()
    source[0] = sqlite_engine
    drainer.turn()
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2 and lines[0].startswith("cannot drain the alert outbox: no such table")
    assert lines[1] == "the alert outbox can be drained again"
    unmigrated.dispose()

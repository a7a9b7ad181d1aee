"""Sweeps: a hyperparameter search whose every trial is an ordinary job.

A sweep row holds the checked definition (`db.sweep_spec`) and the name of its Optuna study
(`db.study`, in this same database). Its trials are jobs tagged `sweep-ID`, with `sweep_id`
and Optuna's `trial_number` in their own columns; any worker claims them, and they resume
after a crash like any job.

Who asks Optuna for the next trial: the *driver*, whichever process holds the sweep's claim
(`drive`). Every worker tries at each poll; the claim is a conditional UPDATE with a lease,
like a job's, and bumps `driver_token`. Each trial is enqueued in a transaction that first
checks the token is still the one it claimed with (on Postgres that UPDATE also locks the
sweep's row until commit) and counts the sweep's jobs again, so two drivers never enqueue a
trial too many, even when a claim lapses mid-ask; the unique (sweep_id, trial_number) index
is the last guard. A trial is made whenever there is room: fewer than `max_concurrent` trials
queued or running and fewer than `trials` made, so a pruned or finished trial makes room.

The worker reports each epoch's objective (`report_epoch`; the pruner may answer stop) and
ends its trial in Optuna itself (`end_trial`), so the next trial's pruner sees it at once;
the driver settles any trial whose job ended without that (failed, cancelled, a lost worker).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, func, or_, select, update
from sqlalchemy.orm import Session

from db import study
from db.engine import read_tx, write_tx
from db.models import FINISHED_STATUSES, Job, Sweep, utcnow
from db.queue import (
    JobStateError,
    _event,
    cancel,
    insert_job,
    known_dataset_names,
)
from db.spec import MAX_TAGS, Labels, SpecError, parse_labels, parse_spec
from db.sweep_spec import SweepSpec, parse_sweep

# How long a driver's claim lasts without being renewed (each enqueue renews it).
DRIVER_LEASE_S = 60.0
ACTIVE_STATUSES = ("queued", "running")


class SweepNotFound(LookupError):
    def __init__(self, sweep_id: int):
        super().__init__(f"no sweep with id {sweep_id}")
        self.sweep_id = sweep_id


@dataclass(frozen=True)
class Trial:
    """A running job's trial, as its worker sees it."""

    sweep_id: int
    study_name: str
    number: int
    sweep: SweepSpec


@dataclass(frozen=True)
class TrialRow:
    number: int
    job_id: int
    status: str
    params: dict[str, Any]
    # The objective of a finished trial; else the newest reported epoch's value.
    objective: float | None
    final: bool
    epochs_reported: int


@dataclass(frozen=True)
class SweepSummary:
    sweep: Sweep
    spec: SweepSpec
    trials: list[TrialRow]

    @property
    def best(self) -> TrialRow | None:
        done = [row for row in self.trials if row.final and row.objective is not None]
        if not done:
            return None
        pick = min if self.spec.direction == "minimize" else max
        return pick(done, key=lambda row: row.objective)  # type: ignore[arg-type,return-value]


# --- submit, read, cancel -------------------------------------------------------------------


def submit_sweep(engine: Engine, data: Any) -> int:
    """Check a definition (raising SpecError naming each problem), create its study and
    queue its first trials. Returns the sweep's id."""
    from db.datasets import get_dataset, training_images_of

    known = known_dataset_names(engine)
    spec = parse_sweep(data, known)
    count = training_images_of(get_dataset(engine, spec.base.dataset), spec.base.valid_pct)
    if count is not None:
        spec = parse_sweep(data, known, training_images=count)
    # The study exists, with its first trials, before any driver can see the sweep.
    study_name = f"traindeck-sweep-{uuid.uuid4().hex}"
    study.create(engine, study_name, spec)
    try:
        with write_tx(engine) as connection:
            sweep_id = connection.execute(
                Sweep.__table__.insert()
                .values(
                    name=spec.display_name,
                    definition=spec.as_json(),
                    study_name=study_name,
                    status="running",
                    created_at=utcnow(),
                    driver_token=0,
                    tags=list(spec.labels.tags),
                    note=spec.labels.note,
                )
                .returning(Sweep.id)
            ).scalar_one()
    except BaseException:
        study.delete(engine, study_name)
        raise
    drive(engine, sweep_id, "submit")
    return sweep_id


def _sweeps(engine: Engine, statement: Any) -> list[Sweep]:
    with read_tx(engine) as connection, Session(bind=connection) as session:
        rows = list(session.scalars(statement))
        session.expunge_all()
    return rows


def get_sweep(engine: Engine, sweep_id: int) -> Sweep:
    rows = _sweeps(engine, select(Sweep).where(Sweep.id == sweep_id))
    if not rows:
        raise SweepNotFound(sweep_id)
    return rows[0]


def list_sweeps(engine: Engine) -> list[Sweep]:
    return _sweeps(engine, select(Sweep).order_by(Sweep.id.desc()))


def set_labels(engine: Engine, sweep_id: int, changes: Any) -> Labels:
    """Change a sweep's tags and/or note (`changes` holds either or both), by the rules of a
    job's (SpecError naming the field). Returns the labels now stored."""
    if not isinstance(changes, dict):
        return parse_labels(changes)  # raises SpecError: not an object
    sweep = get_sweep(engine, sweep_id)
    labels = parse_labels({"tags": sweep.tags, "note": sweep.note, **changes})
    with write_tx(engine) as connection:
        changed = connection.execute(
            update(Sweep)
            .where(Sweep.id == sweep_id)
            .values(tags=list(labels.tags), note=labels.note)
        ).rowcount
    if not changed:
        raise SweepNotFound(sweep_id)
    return labels


def summary(engine: Engine, sweep_id: int) -> SweepSummary:
    """The sweep with each trial: its job, state, values and objective."""
    sweep = get_sweep(engine, sweep_id)
    spec = parse_sweep(sweep.definition)
    with read_tx(engine) as connection:
        jobs = connection.execute(
            select(Job.id, Job.trial_number, Job.status, Job.spec)
            .where(Job.sweep_id == sweep_id)
            .order_by(Job.trial_number)
        ).all()
    frozen = {trial.number: trial for trial in study.trials(engine, sweep.study_name)}
    rows = []
    for job in jobs:
        trial = frozen.get(job.trial_number)
        reported = trial.intermediate_values if trial is not None else {}
        final = trial is not None and trial.state.name == "COMPLETE"
        latest = reported[max(reported)] if reported else None
        rows.append(
            TrialRow(
                number=job.trial_number,
                job_id=job.id,
                status=job.status,
                params={param.field: job.spec.get(param.field) for param in spec.space},
                objective=trial.value if final else latest,  # type: ignore[union-attr]
                final=final,
                epochs_reported=len(reported),
            )
        )
    return SweepSummary(sweep, spec, rows)


def _trial_json(row: TrialRow) -> dict[str, Any]:
    return {
        "trial": row.number,
        "job": row.job_id,
        "status": row.status,
        "params": row.params,
        "objective": row.objective,
        "final": row.final,
        "epochs_reported": row.epochs_reported,
    }


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def describe(summary: SweepSummary) -> dict[str, Any]:
    """A sweep as JSON: what `traindeck sweep show ID --json` prints and the API answers."""
    sweep, best = summary.sweep, summary.best
    return {
        "id": sweep.id,
        "name": sweep.name,
        "status": sweep.status,
        "created_at": _iso(sweep.created_at),
        "finished_at": _iso(sweep.finished_at),
        "tags": list(sweep.tags),
        "note": sweep.note,
        "objective": {"metric": summary.spec.metric, "direction": summary.spec.direction},
        "trials_planned": summary.spec.trials,
        "trials": [_trial_json(row) for row in summary.trials],
        "best": _trial_json(best) if best is not None else None,
        "definition": sweep.definition,
    }


def describe_all(engine: Engine) -> list[dict[str, Any]]:
    """Every sweep as `describe` writes it, newest first."""
    return [describe(summary(engine, sweep.id)) for sweep in list_sweeps(engine)]


def importances(engine: Engine, sweep_id: int) -> dict[str, float]:
    """How much each varied field explains of the objective (Optuna's), largest first."""
    return study.importances(engine, get_sweep(engine, sweep_id).study_name)


def cancel_sweep(engine: Engine, sweep_id: int) -> int:
    """Stop a sweep: no new trial; queued trials cancelled, running ones asked to stop.
    Returns how many trials were cancelled or asked to stop. The sweep's `finished_at` is set
    once its last trial has stopped and been ended in Optuna (`settle_cancelled`)."""
    with write_tx(engine) as connection:
        changed = connection.execute(
            update(Sweep)
            .where(Sweep.id == sweep_id, Sweep.status == "running")
            .values(status="cancelled")
        ).rowcount
        active = connection.execute(
            select(Job.id).where(Job.sweep_id == sweep_id, Job.status.in_(ACTIVE_STATUSES))
        ).scalars()
        active = list(active)
    if not changed:
        raise JobStateError(f"sweep {sweep_id} is already {get_sweep(engine, sweep_id).status}")
    stopped = 0
    for job_id in active:
        try:
            cancel(engine, job_id)
            stopped += 1
        except JobStateError:
            continue  # it finished meanwhile
    settle_cancelled(engine, sweep_id)  # the trials cancelled while queued
    return stopped


def settle_cancelled(engine: Engine, sweep_id: int) -> None:
    """End in Optuna the trials of a cancelled sweep whose jobs have stopped, and once none is
    left queued or running, set the sweep's `finished_at`. A trial stopped by the cancel ends
    as FAIL, as Optuna ends a trial that `optimize` was interrupted in: it was stopped from
    outside, not judged by the pruner, so no sampler should read its partial values as a
    verdict on its parameters (PRUNED trials are ranked by TPE; FAIL ones are left out)."""
    sweep = get_sweep(engine, sweep_id)
    with read_tx(engine) as connection:
        _, active = _counts(connection, sweep_id)  # counted first: a job ending after the
    _settle(engine, sweep, parse_sweep(sweep.definition))  # count is settled here
    if active == 0:
        with write_tx(engine) as connection:
            connection.execute(
                update(Sweep)
                .where(
                    Sweep.id == sweep_id,
                    Sweep.status == "cancelled",
                    Sweep.finished_at.is_(None),
                )
                .values(finished_at=utcnow())
            )


# --- the driver -----------------------------------------------------------------------------


def drive_all(engine: Engine, holder: str) -> int:
    """Drive every running sweep this process can claim, and settle the trials of cancelled
    sweeps whose trials are still stopping. Returns the trials it queued."""
    with read_tx(engine) as connection:
        rows = connection.execute(
            select(Sweep.id, Sweep.status)
            .where(
                or_(
                    Sweep.status == "running",
                    (Sweep.status == "cancelled") & Sweep.finished_at.is_(None),
                )
            )
            .order_by(Sweep.id)
        ).all()
    queued = 0
    for sweep_id, status in rows:
        if status == "running":
            queued += drive(engine, sweep_id, holder)
        else:
            settle_cancelled(engine, sweep_id)
    return queued


def drive(engine: Engine, sweep_id: int, holder: str) -> int:
    """If no other process drives the sweep: settle its ended trials, queue trials while
    there is room, finish it once every trial has ended. Returns the trials it queued."""
    token = take_driver(engine, sweep_id, holder)
    if token is None:
        return 0
    try:
        sweep = get_sweep(engine, sweep_id)
        spec = parse_sweep(sweep.definition)
        _settle(engine, sweep, spec)
        queued = 0
        while True:
            with read_tx(engine) as connection:
                made, active = _counts(connection, sweep_id)
            if made >= spec.trials or active >= spec.max_concurrent:
                break
            asked = study.ask(engine, sweep.study_name, spec, made)
            if asked is None:
                break
            number, params = asked
            if not enqueue_trial(engine, sweep, spec, token, number, params):
                study.tell(engine, sweep.study_name, spec, number, "fail", None)
                break
            queued += 1
        _finish_if_done(engine, sweep_id, spec)
        return queued
    finally:
        _let_go(engine, sweep_id, token)


def take_driver(engine: Engine, sweep_id: int, holder: str) -> int | None:
    """Claim the right to enqueue the sweep's trials: its token, or None when another
    process holds an unexpired claim or the sweep is not running."""
    now = utcnow()
    with write_tx(engine) as connection:
        return connection.execute(
            update(Sweep)
            .where(
                Sweep.id == sweep_id,
                Sweep.status == "running",
                or_(Sweep.driver_until.is_(None), Sweep.driver_until < now),
            )
            .values(
                driver=holder,
                driver_until=now + timedelta(seconds=DRIVER_LEASE_S),
                driver_token=Sweep.driver_token + 1,
            )
            .returning(Sweep.driver_token)
        ).scalar_one_or_none()


def _let_go(engine: Engine, sweep_id: int, token: int) -> None:
    with write_tx(engine) as connection:
        connection.execute(
            update(Sweep)
            .where(Sweep.id == sweep_id, Sweep.driver_token == token)
            .values(driver=None, driver_until=None)
        )


def _counts(connection: Any, sweep_id: int) -> tuple[int, int]:
    """(trials made, trials queued or running) of a sweep."""
    rows = connection.execute(
        select(Job.status, func.count()).where(Job.sweep_id == sweep_id).group_by(Job.status)
    ).all()
    made = sum(count for _, count in rows)
    active = sum(count for status, count in rows if status in ACTIVE_STATUSES)
    return made, active


def enqueue_trial(
    engine: Engine,
    sweep: Sweep,
    spec: SweepSpec,
    token: int,
    number: int,
    params: dict[str, Any],
) -> bool:
    """Queue trial `number` as a job, if the claim `token` still holds and there is room.
    The check and the insert are one transaction (see the module's comment)."""
    job_spec = _trial_spec(sweep.id, spec, number, params)
    with write_tx(engine) as connection:
        held = connection.execute(
            update(Sweep)
            .where(Sweep.id == sweep.id, Sweep.driver_token == token, Sweep.status == "running")
            .values(driver_until=utcnow() + timedelta(seconds=DRIVER_LEASE_S))
        ).rowcount
        if not held:
            return False
        made, active = _counts(connection, sweep.id)
        if made >= spec.trials or active >= spec.max_concurrent:
            return False
        job_id = insert_job(connection, job_spec, sweep_id=sweep.id, trial_number=number)
        values = ", ".join(f"{field} {value}" for field, value in params.items())
        connection.execute(_event(job_id, "info", f"trial {number} of sweep {sweep.id}: {values}"))
    return True


def _trial_spec(sweep_id: int, spec: SweepSpec, number: int, params: dict[str, Any]):
    data = spec.trial_spec(params)
    data["name"] = f"sweep {sweep_id} trial {number}: {spec.display_name}"[:200]
    data["tags"] = [*list(data.get("tags", []))[: MAX_TAGS - 1], f"sweep-{sweep_id}"]
    try:
        return parse_spec(data)
    except SpecError as exc:  # each value was checked against the base at submit
        raise RuntimeError(f"sweep {sweep_id}: trial {number}'s spec was refused: {exc}") from exc


def _settle(engine: Engine, sweep: Sweep, spec: SweepSpec) -> None:
    """End in Optuna the trials whose job ended without saying so (failed, cancelled, lost),
    and any trial asked for by a driver that never queued it."""
    running = study.running_trial_numbers(engine, sweep.study_name)
    if not running:
        return
    with read_tx(engine) as connection:
        statuses = dict(
            connection.execute(
                select(Job.trial_number, Job.status).where(
                    Job.sweep_id == sweep.id, Job.trial_number.in_(running)
                )
            ).all()
        )
    for number in running:
        status = statuses.get(number)
        if status is None or status in FINISHED_STATUSES:
            outcome = {"succeeded": "complete", "pruned": "pruned"}.get(status or "", "fail")
            last = study.last_value(engine, sweep.study_name, number)
            if outcome == "complete" and last is None:
                outcome = "fail"
            study.tell(engine, sweep.study_name, spec, number, outcome, last)


def _finish_if_done(engine: Engine, sweep_id: int, spec: SweepSpec) -> None:
    with write_tx(engine) as connection:
        made, active = _counts(connection, sweep_id)
        if made >= spec.trials and active == 0:
            connection.execute(
                update(Sweep)
                .where(Sweep.id == sweep_id, Sweep.status == "running")
                .values(status="finished", finished_at=utcnow())
            )


# --- what the worker calls ------------------------------------------------------------------


def trial_of(engine: Engine, job_id: int) -> Trial | None:
    """The trial a job is, or None for a job outside any sweep."""
    with read_tx(engine) as connection:
        row = connection.execute(
            select(Job.sweep_id, Job.trial_number, Sweep.study_name, Sweep.definition)
            .join(Sweep, Sweep.id == Job.sweep_id)
            .where(Job.id == job_id)
        ).one_or_none()
    if row is None:
        return None
    return Trial(row.sweep_id, row.study_name, row.trial_number, parse_sweep(row.definition))


def report_epoch(
    engine: Engine, trial: Trial, epoch: int, value: float, last: bool = False
) -> bool:
    """Record the objective after `epoch` (0-based); whether the pruner says stop. After the
    trial's `last` epoch the pruner is not asked: stopping then would save no training (only
    the export) and would throw away a finished trial's result, so the trial completes. (With
    ASHA's default reduction factor 3 the second rung falls on epoch 3: every trial of a
    3-epoch sweep reaching it was trained whole, and those it pruned there saved nothing.)"""
    return study.report(
        engine, trial.study_name, trial.sweep, trial.number, epoch, value, ask_pruner=not last
    )


def end_trial(engine: Engine, trial: Trial, state: str, kept_epoch: int | None = None) -> None:
    """End the trial in Optuna: `complete` with the objective of `kept_epoch` (the epoch
    whose model was exported), or `pruned`."""
    value = None
    if state == "complete" and kept_epoch is not None:
        value = study.intermediate_value(engine, trial.study_name, trial.number, kept_epoch)
    if state == "complete" and value is None:
        state = "fail"
    study.tell(engine, trial.study_name, trial.sweep, trial.number, state, value)

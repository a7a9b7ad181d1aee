"""The Optuna side of a sweep: its study, kept in the jobs' own database by Optuna's RDB
storage; the sampler and the pruner a definition names; ask, report and tell.

Optuna's storage makes its own tables (`studies`, `trials`, `trial_*`, `version_info`, …)
and runs its own Alembic, whose version table is Alembic's default `alembic_version`;
traindeck's migrations keep their revision in `traindeck_alembic_version` (`db.migrate`), so
the two histories never read each other's. `set_up` creates Optuna's tables or brings them to
the installed Optuna's schema; `python -m db upgrade` calls it, so one command still sets a
database up (tests/db/test_study_storage.py checks that no table is shared).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.exceptions import UpdateFinishedTrialError
from optuna.pruners import (
    BasePruner,
    HyperbandPruner,
    MedianPruner,
    NopPruner,
    SuccessiveHalvingPruner,
)
from optuna.samplers import BaseSampler, GridSampler, RandomSampler, TPESampler
from optuna.storages import RDBStorage
from optuna.trial import TrialState
from sqlalchemy import Engine

from common import config
from db.engine import is_sqlite
from db.sweep_spec import Param, SweepSpec

optuna.logging.set_verbosity(logging.WARNING)  # no "Trial N finished" line per trial
TRIAL_STATES = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED}

_storages: dict[str, RDBStorage] = {}


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def _engine_options(engine: Engine) -> dict[str, Any]:
    if is_sqlite(engine):
        # Several processes share the file: wait for the writer as traindeck's engine does.
        return {"connect_args": {"timeout": config.sqlite_busy_timeout_s()}}
    return {"pool_pre_ping": True}


def set_up(engine: Engine) -> None:
    """Create Optuna's tables in this database, or upgrade them to this Optuna's schema."""
    storage = RDBStorage(
        _url(engine), engine_kwargs=_engine_options(engine), skip_compatibility_check=True
    )
    try:
        if storage.get_current_version() != storage.get_head_version():
            storage.upgrade()
    finally:
        storage.remove_session()
        storage.engine.dispose()


def storage(engine: Engine) -> RDBStorage:
    """Optuna's storage on this database, one per process (its tables made by `set_up`)."""
    url = _url(engine)
    if url not in _storages:
        _storages[url] = RDBStorage(
            url, engine_kwargs=_engine_options(engine), skip_table_creation=True
        )
    return _storages[url]


def table_names() -> set[str]:
    """Every table Optuna's storage makes, for the check that none is traindeck's."""
    from optuna.storages._rdb.models import BaseModel

    return set(BaseModel.metadata.tables)


# --- what a definition names ----------------------------------------------------------------


def distributions(sweep: SweepSpec) -> dict[str, BaseDistribution]:
    return {param.field: _distribution(param) for param in sweep.space}


def _distribution(param: Param) -> BaseDistribution:
    if param.kind == "choice":
        return CategoricalDistribution(list(param.values))
    assert param.low is not None and param.high is not None
    if param.kind == "int":
        step = None if param.log else param.step
        return IntDistribution(int(param.low), int(param.high), log=param.log, step=step or 1)
    return FloatDistribution(param.low, param.high, log=param.kind == "log_uniform")


def sampler(sweep: SweepSpec, salt: int) -> BaseSampler:
    """The definition's sampler. A sampler object lives for one ask (a driver may be any
    process), so its seed is the sweep's plus `salt` (the trials asked so far): each trial
    draws anew, the same way whichever process asks."""
    seed = sweep.seed + salt
    if sweep.sampler == "grid":
        # The grid's order is shuffled by the seed and trial N takes point N of it: the same
        # seed at every ask, or two trials could take the same point.
        grid = {p.field: list(p.grid_values()) for p in sweep.space}
        return GridSampler(grid, seed=sweep.seed)
    if sweep.sampler == "random":
        return RandomSampler(seed=seed)
    return TPESampler(seed=seed)


def pruner(sweep: SweepSpec) -> BasePruner:
    """The definition's pruner; its steps are epochs (1 after the first)."""
    options = sweep.pruner_options
    if sweep.pruner == "median":
        return MedianPruner(
            n_startup_trials=options["startup_trials"], n_warmup_steps=options["warmup_epochs"]
        )
    if sweep.pruner == "asha":
        return SuccessiveHalvingPruner(
            min_resource=options["min_epochs"], reduction_factor=options["reduction_factor"]
        )
    if sweep.pruner == "hyperband":
        return HyperbandPruner(
            min_resource=options["min_epochs"],
            max_resource=sweep.base.epochs,
            reduction_factor=options["reduction_factor"],
        )
    return NopPruner()


# --- the study ------------------------------------------------------------------------------


def create(engine: Engine, name: str, sweep: SweepSpec) -> None:
    """A new study for the sweep, with its first trials (if the definition lists any) queued
    in Optuna so that they are asked for before the sampler draws."""
    study = optuna.create_study(storage=storage(engine), study_name=name, direction=sweep.direction)
    for params in sweep.first_trials:
        study.enqueue_trial(params)


def delete(engine: Engine, name: str) -> None:
    optuna.delete_study(study_name=name, storage=storage(engine))


def _load(engine: Engine, name: str, sweep: SweepSpec, salt: int = 0) -> optuna.Study:
    return optuna.load_study(
        study_name=name,
        storage=storage(engine),
        sampler=sampler(sweep, salt),
        pruner=pruner(sweep),
    )


def ask(
    engine: Engine, name: str, sweep: SweepSpec, asked_before: int
) -> tuple[int, dict[str, Any]] | None:
    """The next trial: its number and the values of the varied fields. None when another
    driver ended the trial while it was being asked for (it found it without a job: this
    process's claim had lapsed)."""
    study = _load(engine, name, sweep, salt=asked_before)
    with warnings.catch_warnings():
        # GridSampler warns when it is told the space again at every ask; it is the same one.
        warnings.simplefilter("ignore", UserWarning)
        try:
            trial = study.ask(distributions(sweep))
        except UpdateFinishedTrialError:
            return None
    return trial.number, dict(trial.params)


def report(
    engine: Engine,
    name: str,
    sweep: SweepSpec,
    number: int,
    epoch: int,
    value: float,
    ask_pruner: bool = True,
) -> bool:
    """Record the objective after `epoch` (global, 0-based) of trial `number`; whether the
    pruner says to stop it (False without asking it unless `ask_pruner`). A trial already
    ended (a repeated report after a resume) is asked to stop only when it was pruned."""
    study = _load(engine, name, sweep)
    store = storage(engine)
    trial_id = store.get_trial_id_from_study_id_trial_number(
        store.get_study_id_from_name(name), number
    )
    state = store.get_trial(trial_id).state
    if state != TrialState.RUNNING:
        return state == TrialState.PRUNED
    trial = optuna.trial.Trial(study, trial_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a step reported again after a resume
        trial.report(value, epoch + 1)
    return ask_pruner and trial.should_prune()


def _reported(engine: Engine, name: str, number: int) -> dict[int, float]:
    """Trial `number`'s reported values by step (epoch + 1)."""
    store = storage(engine)
    trial_id = store.get_trial_id_from_study_id_trial_number(
        store.get_study_id_from_name(name), number
    )
    return store.get_trial(trial_id).intermediate_values


def intermediate_value(engine: Engine, name: str, number: int, epoch: int) -> float | None:
    return _reported(engine, name, number).get(epoch + 1)


def last_value(engine: Engine, name: str, number: int) -> float | None:
    reported = _reported(engine, name, number)
    return reported[max(reported)] if reported else None


def tell(
    engine: Engine, name: str, sweep: SweepSpec, number: int, state: str, value: float | None
) -> None:
    """End trial `number` as complete (with its objective), pruned or failed; a trial already
    ended stays as it is."""
    # Not the sweep's sampler: a GridSampler calls `study.stop()` after the last point is
    # told, which Optuna allows only inside `optimize`; nothing else of a sampler acts on tell.
    study = optuna.load_study(study_name=name, storage=storage(engine), sampler=RandomSampler())
    outcome = TRIAL_STATES.get(state, TrialState.FAIL)
    values = value if outcome == TrialState.COMPLETE else None
    # Another process may end it between Optuna's check and its write.
    with contextlib.suppress(UpdateFinishedTrialError):
        study.tell(number, values, state=outcome, skip_if_finished=True)


def trials(engine: Engine, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=storage(engine)).get_trials(deepcopy=False)


def importances(engine: Engine, name: str) -> dict[str, float]:
    """Optuna's parameter importances (its default evaluator, PED-ANOVA), largest first; empty
    until the finished trials let it judge (at least two, with values that differ)."""
    study = optuna.load_study(study_name=name, storage=storage(engine))
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2:
        return {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna's experimental-feature notices
            found = optuna.importance.get_param_importances(study)
    except (ValueError, RuntimeError):  # e.g. every trial has the same values
        return {}
    return {field: float(value) for field, value in found.items()}


def running_trial_numbers(engine: Engine, name: str) -> set[int]:
    study = optuna.load_study(study_name=name, storage=storage(engine))
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    return {trial.number for trial in running}

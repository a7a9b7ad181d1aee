"""`traindeck sweep …` (or `python -m db sweep …`): submit a sweep from a YAML or JSON file,
list sweeps, show one with its trials and the best, cancel one. Each takes `--json`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from common.cliargs import command_group, positive_int
from db import sweeps
from db.engine import Engine
from db.sweep_spec import definition_from_text


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def _read(path_text: str) -> Any:
    from traindeck.cli import UserError

    path = Path(path_text).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text") from None
    return definition_from_text(text)


def cmd_submit(engine: Engine, args: argparse.Namespace) -> None:
    definition = _read(args.file)
    if isinstance(definition, dict):
        if args.tags is not None:
            definition["tags"] = args.tags
        if args.note is not None:
            definition["note"] = args.note
    sweep_id = sweeps.submit_sweep(engine, definition)
    summary = sweeps.summary(engine, sweep_id)
    if args.json:
        _print_json({"id": sweep_id, "queued_trials": [row.job_id for row in summary.trials]})
        return
    print(f"sweep {sweep_id}: {summary.spec.display_name}")
    print(f"  queued {len(summary.trials)} of {summary.spec.trials} trials; workers run them")


def cmd_list(engine: Engine, args: argparse.Namespace) -> None:
    summaries = [sweeps.summary(engine, sweep.id) for sweep in sweeps.list_sweeps(engine)]
    if args.json:
        _print_json([sweeps.describe(summary) for summary in summaries])
        return
    if not summaries:
        print("no sweeps")
        return
    print(f"{'ID':>5}  {'STATUS':<10} {'TRIALS':>7}  {'BEST':>10}  NAME")
    for summary in summaries:
        best = summary.best
        shown = f"{best.objective:.4g}" if best is not None else "-"
        ended = sum(row.status not in sweeps.ACTIVE_STATUSES for row in summary.trials)
        print(
            f"{summary.sweep.id:>5}  {summary.sweep.status:<10} "
            f"{f'{ended}/{summary.spec.trials}':>7}  {shown:>10}  {summary.sweep.name}"
        )


def cmd_show(engine: Engine, args: argparse.Namespace) -> None:
    summary = sweeps.summary(engine, args.id)
    if args.json:
        _print_json(sweeps.describe(summary))
        return
    spec, sweep = summary.spec, summary.sweep
    print(f"sweep {sweep.id}: {sweep.name}")
    print(f"  status:    {sweep.status}")
    print(f"  objective: {spec.direction} {spec.metric}")
    print(f"  sampler:   {spec.sampler}   pruner: {spec.pruner}")
    if sweep.tags:
        print(f"  tags:      {', '.join(sweep.tags)}")
    if sweep.note:
        print(f"  note:      {sweep.note.splitlines()[0]}")
    print(
        f"  trials:    {len(summary.trials)} made of {spec.trials}, {spec.max_concurrent} at once"
    )
    best = summary.best
    if best is not None:
        where = f"trial {best.number} (job {best.job_id})"
        print(f"  best:      {where} {spec.metric} {best.objective:.4g}")
    print(f"  {'TRIAL':>5}  {'JOB':>5}  {'STATUS':<10} {spec.metric:>12}  PARAMS")
    for row in summary.trials:
        value = "-" if row.objective is None else f"{row.objective:.4g}"
        if row.objective is not None and not row.final:
            value += f" @{row.epochs_reported}"
        params = ", ".join(f"{field}={_value(value)}" for field, value in row.params.items())
        print(f"  {row.number:>5}  {row.job_id:>5}  {row.status:<10} {value:>12}  {params}")


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def cmd_cancel(engine: Engine, args: argparse.Namespace) -> None:
    stopped = sweeps.cancel_sweep(engine, args.id)
    if args.json:
        _print_json({"id": args.id, "status": "cancelled", "trials_stopped": stopped})
    else:
        print(f"cancelled sweep {args.id}; {stopped} queued or running trial(s) stopped")


def add_commands(commands: Any) -> None:
    """The `sweep` command and its sub-commands, on the main parser's sub-parsers."""
    parsers = command_group(
        commands,
        "sweep",
        "hyperparameter sweeps over jobs (Optuna)",
        "sweep_command",
        (
            ("submit", cmd_submit, "check a sweep definition (YAML or JSON) and queue its trials"),
            ("list", cmd_list, "sweeps, newest first, with their trials done and best objective"),
            ("show", cmd_show, "one sweep: its trials with values, state and objective; the best"),
            ("cancel", cmd_cancel, "stop a sweep: queued trials cancelled, running ones stopped"),
        ),
    )
    parsers["submit"].add_argument(
        "file", metavar="FILE", help="the definition, a .yaml or .json file"
    )
    parsers["submit"].add_argument(
        "--tag", dest="tags", action="append", default=None, metavar="TAG",
        help="a tag of the sweep (repeatable; replaces the file's tags)",
    )  # fmt: skip
    parsers["submit"].add_argument(
        "--note", default=None, metavar="TEXT", help="the sweep's note (replaces the file's)"
    )
    for name in ("show", "cancel"):
        parsers[name].add_argument("id", type=positive_int, help="sweep id")

"""`traindeck` (or `python -m db`): migrate, submit and inspect jobs, manage datasets, start
the dashboard and a worker.

Every command takes `--json` for scripts. A mistake by the person typing (a bad flag, a
spec out of bounds, an unknown job) exits non-zero with one line naming the problem.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import config
from common.cliargs import EXIT_USER_ERROR, Parser, command_group, job_id, positive_int
from common.entry import run_main
from datasets.builtin import register_builtin_datasets
from datasets.labelling import DatasetError
from datasets.register import (
    Registration,
    register_csv,
    register_folder,
    register_url,
    register_zip,
    unregister_dataset,
)
from datasets.validation import normalize_dataset_name
from db import alerts, queue
from db.datasets import list_datasets
from db.engine import DatabaseError, Engine, database_problem, get_engine
from db.inputs import FieldError
from db.joblist import ORDERS, Cursor, JobFilter
from db.jobview import describe_job, iter_jobs
from db.migrate import upgrade
from db.models import ALERT_EVENTS, JOB_STATUSES
from db.spec import JobSpec, SpecError, spec_from_json
from db.sweeps import SweepNotFound
from traindeck import diagnostics_cli, sweep_cli

EXIT_DATABASE_ERROR = 3
DESCRIPTION = (
    "Migrate the database, submit and inspect training jobs, manage datasets, start the "
    "dashboard and a worker."
)


class UserError(Exception):
    """A problem the person can fix; printed as one line, no traceback."""


def _field_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _optional_field(name: str) -> bool:
    return type(None) in getattr(JobSpec.model_fields[name].annotation, "__args__", ())


def _add_spec_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("job spec (each flag overrides --spec)")
    for name, field in JobSpec.model_fields.items():
        default = field.default
        help_text = f"{field.description} (default: {default})"
        if name == "tags":
            group.add_argument(
                "--tag", dest="tags", action="append", default=None, metavar="TAG",
                help="a tag to find the job by (repeatable; replaces the file's tags)",
            )  # fmt: skip
        elif field.annotation is bool:
            group.add_argument(
                _field_flag(name),
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            group.add_argument(
                _field_flag(name), dest=name, default=None, metavar="VALUE", help=help_text
            )


def _spec_from_args(args: argparse.Namespace) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if args.spec:
        path = Path(args.spec)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(f"--spec: cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise UserError(f"--spec: {path} is not UTF-8 text") from None
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            spec_from_json(text)  # raises SpecError naming the mistake
        if not isinstance(data, dict):
            raise SpecError({"spec": f"{path} must hold a JSON object of field: value"})
    for name in JobSpec.model_fields:
        value = getattr(args, name)
        if value is None:
            continue
        if (
            isinstance(value, str)
            and _optional_field(name)
            and value.strip().lower() in ("", "none")
        ):
            value = None
        data[name] = value
    return data


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def _age(iso_time: str | None) -> str:
    if not iso_time:
        return "-"
    seconds = (datetime.now(UTC) - datetime.fromisoformat(iso_time)).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


# --- commands -------------------------------------------------------------------------------


def cmd_upgrade(engine: Engine, args: argparse.Namespace) -> None:
    upgrade(engine)
    if args.json:
        _print_json({"upgraded": True})
    else:
        print("database is up to date")


def cmd_submit(engine: Engine, args: argparse.Namespace) -> None:
    job_id = queue.submit(engine, _spec_from_args(args))
    if args.json:
        _print_json({"id": job_id})
    else:
        print(f"queued job {job_id}")


DEFAULT_JOBS_SHOWN = 50


def _jobs_cursor(engine: Engine, args: argparse.Namespace) -> Cursor | None:
    if args.before is not None:
        if args.order != "newest":
            raise UserError(f"--before goes with --order newest; with --order {args.order} "
                            "use --after")  # fmt: skip
        return Cursor(args.before)
    if args.after is None:
        return None
    if args.order == "newest":
        raise UserError("--after goes with --order oldest or next; newest first, use --before")
    if args.order == "oldest":
        return Cursor(args.after)
    job = queue.get_job(engine, args.after)  # the queue's order needs its priority
    return Cursor(job.id, job.priority)


def _jobs_more_hint(args: argparse.Namespace, last: dict[str, Any]) -> str:
    """The command that lists the next page, with the same filters."""
    words = [args.prog, "jobs"]
    for status in args.status or ():
        words += ["--status", status]
    for flag, value in (("--name", args.name), ("--dataset", args.dataset), ("--arch", args.arch)):
        if value:
            words += [flag, value]
    for tag in args.tags or ():
        words += ["--tag", tag]
    if args.order != "newest":
        words += ["--order", args.order]
    if args.limit is not None:
        words += ["--limit", str(args.limit)]
    words += ["--before" if args.order == "newest" else "--after", str(last["id"])]
    if args.json:
        words.append("--json")
    return f"more jobs: {shlex.join(words)} (or --all for every job)"


def cmd_jobs(engine: Engine, args: argparse.Namespace) -> None:
    """Jobs a page at a time (`--limit`, default 50; `--all`), filtered in SQL, streamed: read
    and written 500 at a time (`db.jobview.iter_jobs`), as lines or as a JSON array written
    element by element, so that memory stays flat however many jobs there are."""
    limit = None if args.all else (args.limit or DEFAULT_JOBS_SHOWN)
    filters = JobFilter(
        tuple(args.status or ()),
        name=args.name or "",
        dataset=args.dataset or "",
        arch=args.arch or "",
        tags=tuple(args.tags or ()),
    )
    after = _jobs_cursor(engine, args)
    jobs = iter_jobs(engine, filters, order=args.order, after=after,
                     limit=None if limit is None else limit + 1)  # fmt: skip
    shown = 0
    last: dict[str, Any] | None = None
    more = False
    out = sys.stdout
    for job in jobs:
        if limit is not None and shown == limit:
            more = True
            break
        if args.json:
            out.write(("[\n  " if shown == 0 else ",\n  ") + _json_line(job))
        else:
            if shown == 0:
                out.write(_jobs_header(args.order) + "\n")
            out.write(_jobs_line(job, args.order) + "\n")
        shown += 1
        last = job
    if args.json:
        out.write("[]\n" if shown == 0 else "\n]\n")
    elif shown == 0:
        out.write("no jobs\n")
    if more and last is not None:
        print(_jobs_more_hint(args, last), file=sys.stderr if args.json else sys.stdout)


def _json_line(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def _jobs_header(order: str) -> str:
    priority = f"{'PRIO':>5}  " if order == "next" else ""
    return f"{'ID':>5}  {priority}{'STATUS':<10} {'EPOCH':>7}  {'ACCURACY':>8}  {'AGE':>5}  NAME"


def _jobs_line(job: dict[str, Any], order: str) -> str:
    progress = job["progress"]
    epochs = f"{progress['epoch']}/{progress['total_epochs']}"
    accuracy = job["final_metrics"].get("accuracy")
    shown = f"{accuracy:.3f}" if accuracy is not None else "-"
    priority = f"{job['priority']:>5}  " if order == "next" else ""
    return (
        f"{job['id']:>5}  {priority}{job['status']:<10} {epochs:>7}  {shown:>8}  "
        f"{_age(job['created_at']):>5}  {job['name']}"
    )


def cmd_show(engine: Engine, args: argparse.Namespace) -> None:
    job = describe_job(engine, args.id)
    if args.json:
        _print_json(job)
        return
    progress = job["progress"]
    print(f"job {job['id']}: {job['name']}")
    if job["tags"]:
        print(f"  tags:      {', '.join(job['tags'])}")
    print(
        f"  status:    {job['status']}" + (" (cancel requested)" if job["cancel_requested"] else "")
    )
    print(f"  attempts:  {job['attempts']}/{job['max_attempts']}")
    print(f"  worker:    {job['worker_id'] or '-'}   device: {job['device'] or '-'}")
    print(
        f"  progress:  epoch {progress['epoch']}/{progress['total_epochs']}, "
        f"step {progress['step']}/{progress['total_steps']}"
    )
    for name, value in sorted(job["final_metrics"].items()):
        print(f"  {name + ':':<11}{value:.4g}")
    for artifact in job["artifacts"]:
        print(
            f"  {artifact['kind']}: {artifact['path']} ({artifact['bytes']} bytes, "
            f"sha256 {artifact['sha256']})"
        )
    if job["error"]:
        print("  error:\n    " + job["error"].strip().replace("\n", "\n    "))
    print("  spec:    " + json.dumps(job["spec"]))
    if job["note"]:
        print("  note:\n    " + job["note"].replace("\n", "\n    "))


def cmd_cancel(engine: Engine, args: argparse.Namespace) -> None:
    outcome = queue.cancel(engine, args.id)
    if args.json:
        _print_json({"id": args.id, "status": outcome})
    elif outcome == "cancelled":
        print(f"cancelled job {args.id}")
    else:
        print(f"job {args.id} is running; it stops at its next batch")


def cmd_retry(engine: Engine, args: argparse.Namespace) -> None:
    new_id = queue.retry(engine, args.id)
    if args.json:
        _print_json({"id": new_id, "retry_of": args.id})
    else:
        print(f"queued job {new_id} (a retry of job {args.id})")


def cmd_dataset_list(engine: Engine, args: argparse.Namespace) -> None:
    datasets = list_datasets(engine)
    if args.json:
        _print_json(
            [
                {
                    "name": d.name,
                    "kind": d.kind,
                    "location": d.location,
                    "label_rule": d.label_rule,
                    "classes": d.classes,
                    "class_counts": d.class_counts,
                    "item_count": d.item_count,
                    "bad_files": d.bad_files,
                }
                for d in datasets
            ]
        )
        return
    if not datasets:
        print("no datasets; `python -m db dataset builtin` adds the digits set")
    for d in datasets:
        contents = f"{len(d.classes):>4} classes {d.item_count:>7} images"
        if d.kind == "url" and not d.item_count:
            contents = f"{'not fetched yet':>27}"
        print(f"{d.name:<20} {d.kind:<8} {contents}  {d.location}")


def cmd_dataset_builtin(engine: Engine, args: argparse.Namespace) -> None:
    config.ensure_data_dir()
    location = register_builtin_datasets(engine)
    if args.json:
        _print_json({"name": "digits", "location": str(location)})
    else:
        print(f"built-in dataset digits is at {location}")


def _cli_path(text: str) -> Path:
    """A path typed in a terminal is relative to the current folder."""
    return Path(text).expanduser().absolute()


def _register_from_args(engine: Engine, args: argparse.Namespace) -> Registration:
    if args.csv and args.label_regex:
        raise UserError("--label-regex does not apply to --csv: the CSV holds the labels")
    if args.folder:
        return register_folder(engine, args.name, _cli_path(args.folder), args.label_regex)
    if args.csv:
        return register_csv(engine, args.name, _cli_path(args.csv))
    if args.zip:
        return register_zip(engine, args.name, _cli_path(args.zip), args.label_regex)
    return register_url(engine, args.name, args.url, args.label_regex)


def cmd_dataset_add(engine: Engine, args: argparse.Namespace) -> None:
    config.ensure_data_dir()  # uploads and relative folders live in it
    try:
        registration = _register_from_args(engine, args)
    except DatasetError as exc:
        raise UserError(str(exc)) from None
    if not args.json:
        print(registration.summary())
        return
    report = registration.report
    _print_json(
        {
            "name": registration.name,
            "kind": registration.kind,
            "location": registration.location,
            "label_rule": report.label_rule if report else None,
            "class_counts": report.class_counts if report else {},
            "split_counts": report.split_counts if report else None,
            "bad_files": report.bad_files if report else {},
            "modes": report.modes if report else {},
            "skipped": (report.skipped if report else []) + registration.notes,
        }
    )


def cmd_dataset_remove(engine: Engine, args: argparse.Namespace) -> None:
    try:
        deleted = unregister_dataset(engine, args.name, force=args.force)
    except DatasetError as exc:
        raise UserError(str(exc)) from None
    name = normalize_dataset_name(args.name)
    if args.json:
        _print_json({"removed": name, "deleted": deleted})
        return
    print(f"removed dataset {name}")
    for path in deleted:
        print(f"  deleted {path}")


def cmd_alerts_add(engine: Engine, args: argparse.Namespace) -> None:
    from alerts.destinations import save_destination

    save_destination(engine, args.name, args.url, args.on)
    shown = next(d for d in alerts.list_destinations(engine) if d.name == args.name.strip())
    if args.json:
        _print_json({"name": shown.name, "url": shown.shown_url, "events": shown.events})
    else:
        print(f"alerts for {', '.join(shown.events)} go to {shown.name}: {shown.shown_url}")


def cmd_alerts_list(engine: Engine, args: argparse.Namespace) -> None:
    found = alerts.list_destinations(engine)
    if args.json:
        _print_json([{"name": d.name, "url": d.shown_url, "events": d.events} for d in found])
        return
    if not found:
        print("no alert destinations; `traindeck alerts add NAME URL --on failed` adds one")
    for d in found:
        print(f"{d.name:<20} {', '.join(d.events):<40} {d.shown_url}")


def cmd_alerts_remove(engine: Engine, args: argparse.Namespace) -> None:
    if not alerts.remove_destination(engine, args.name):
        raise UserError(f"no alert destination named {args.name!r}")
    if args.json:
        _print_json({"removed": args.name})
    else:
        print(f"removed alert destination {args.name}")


def cmd_alerts_log(engine: Engine, args: argparse.Namespace) -> None:
    rows = alerts.recent_alerts(engine, args.limit or DEFAULT_JOBS_SHOWN)
    items = [
        {"id": r.id, "event": r.event, "job": r.job_id, "destination": r.destination,
         "outcome": r.outcome, "attempts": r.attempts, "created_at": r.created_at.isoformat(),
         "error": r.last_error}
        for r in rows
    ]  # fmt: skip
    if args.json:
        _print_json(items)
        return
    if not items:
        print("no alerts yet")
    for item in items:
        error = f"  ({item['error']})" if item["error"] and item["outcome"] != "sent" else ""
        print(f"{item['id']:>5}  {item['event']:<14} job {item['job'] or '-':<6} "
              f"{item['destination']:<20} {item['outcome']} after {item['attempts']} "
              f"attempt(s){error}")  # fmt: skip


# --- parser ---------------------------------------------------------------------------------


def build_parser(prog: str = "traindeck") -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description=DESCRIPTION)
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser
    )

    def command(name: str, handler, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--json", action="store_true", help="print JSON for scripts")
        sub.set_defaults(handler=handler)
        return sub

    for name, help_text in (
        ("run", "migrate, write the built-in dataset, start the dashboard and a worker"),
        (
            "worker",
            "run a worker: claim queued jobs and train them (see `traindeck worker --help`)",
        ),
    ):
        # Parsed by their own commands (traindeck.run, worker.cli), which own their flags.
        commands.add_parser(name, help=help_text, add_help=False)
    command("upgrade", cmd_upgrade, "create or migrate the database schema")
    submit = command("submit", cmd_submit, "queue a training job")
    submit.add_argument("--spec", metavar="FILE.json", help="a JSON file with spec fields")
    _add_spec_flags(submit)
    jobs = command(
        "jobs",
        cmd_jobs,
        f"list jobs, newest first, {DEFAULT_JOBS_SHOWN} at a time (--before ID for the next "
        "page, --all for every job)",
    )
    jobs.add_argument(
        "--status",
        action="append",
        choices=JOB_STATUSES,
        help="only jobs in this status (repeatable)",
    )
    jobs.add_argument("--name", metavar="TEXT", help="only jobs whose name holds TEXT (any case)")
    jobs.add_argument("--dataset", metavar="NAME", help="only jobs training on this dataset")
    jobs.add_argument("--arch", metavar="NAME", help="only jobs of this architecture")
    jobs.add_argument(
        "--tag", dest="tags", action="append", metavar="TAG",
        help="only jobs tagged TAG (repeatable: jobs with every one)",
    )  # fmt: skip
    jobs.add_argument(
        "--order",
        choices=ORDERS,
        default="newest",
        help="newest first (the default), oldest first, or next: the queued jobs in the order "
        "workers take them (highest priority, then oldest)",
    )
    howmany = jobs.add_mutually_exclusive_group()
    howmany.add_argument(
        "--limit",
        type=positive_int,
        default=None,
        help=f"at most this many (default {DEFAULT_JOBS_SHOWN})",
    )
    howmany.add_argument("--all", action="store_true", help="every job, however many")
    start = jobs.add_mutually_exclusive_group()
    start.add_argument(
        "--before", type=job_id, metavar="ID", help="only jobs older than job ID (the next page)"
    )
    start.add_argument(
        "--after",
        type=job_id,
        metavar="ID",
        help="with --order oldest or next: the jobs that come after job ID (the next page)",
    )
    jobs.set_defaults(prog=prog)
    for name, handler, help_text in (
        ("show", cmd_show, "one job: status, progress, final metrics, artifacts, error"),
        ("cancel", cmd_cancel, "cancel a queued job, or stop a running one at its next batch"),
        ("retry", cmd_retry, "queue a finished job again with the same spec"),
    ):
        command(name, handler, help_text).add_argument("id", type=job_id, help="job id")

    sweep_cli.add_commands(commands)
    diagnostics_cli.add_commands(commands)
    dataset_subs = command_group(
        commands,
        "dataset",
        "register and list image datasets",
        "dataset_command",
        (
            ("list", cmd_dataset_list, "registered datasets with their classes and image counts"),
            ("builtin", cmd_dataset_builtin, "write the built-in digits set and register it"),
            ("add", cmd_dataset_add, "check and register a folder, CSV, zip or URL dataset"),
            ("remove", cmd_dataset_remove, "unregister a dataset (and delete an upload's files)"),
        ),
    )
    add = dataset_subs["add"]
    add.add_argument(
        "name", help="the name jobs use: letters and digits of any script, '.', '_', '-'"
    )
    source = add.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--folder",
        metavar="PATH",
        help="one sub-folder per class (optionally inside train/ and valid/), "
        "or images labelled by --label-regex",
    )
    source.add_argument(
        "--csv", metavar="FILE", help="a CSV of file,label[,is_valid]; paths relative to it"
    )
    source.add_argument("--zip", metavar="FILE", help="a zip of images, unpacked safely")
    source.add_argument(
        "--url",
        metavar="URL",
        help="a fastai name (URLs.PETS) or an archive URL; the worker downloads it",
    )
    add.add_argument(
        "--label-regex",
        metavar="RE",
        help="label = the first group of RE searched in each file name, e.g. "
        r"'^(.+)_\d+\.jpg$' for Oxford-IIIT Pets",
    )
    remove = dataset_subs["remove"]
    remove.add_argument("name", help="the dataset to remove")
    remove.add_argument(
        "--force", action="store_true", help="remove it even if queued or running jobs use it"
    )
    _add_alert_commands(commands)
    return parser


def _add_alert_commands(commands: Any) -> None:
    parsers = command_group(
        commands,
        "alerts",
        "where alerts go, for which events; their log",
        "alerts_command",
        (
            ("add", cmd_alerts_add, "send alerts for some events to an Apprise URL"),
            ("list", cmd_alerts_list, "the destinations (their URLs with secrets masked)"),
            ("remove", cmd_alerts_remove, "remove a destination and its unsent alerts"),
            ("log", cmd_alerts_log, "the newest alerts and what became of each"),
        ),
    )
    parsers["add"].add_argument("name", help="a name for the destination")
    parsers["add"].add_argument(
        "url", help="an Apprise URL: slack://…, discord://…, msteams://…, mailtos://…, "
        "ntfys://…, json://host/path (a JSON webhook); see Apprise's wiki",
    )  # fmt: skip
    parsers["add"].add_argument("--on", action="append", required=True, choices=ALERT_EVENTS,
                                help="an event to send (repeatable)")  # fmt: skip
    parsers["remove"].add_argument("name", help="the destination to remove")
    most = f"at most this many (default {DEFAULT_JOBS_SHOWN})"
    parsers["log"].add_argument("--limit", type=positive_int, default=None, help=most)


def _delegated(argv: list[str]) -> int | None:
    """`traindeck run …` and `traindeck worker …`: handed whole to their own command, imported
    only then (the worker's imports torch)."""
    if argv[:1] == ["run"]:
        from traindeck.run import main as run

        return run(argv[1:])
    if argv[:1] == ["worker"]:
        from worker.cli import main as worker

        return worker(argv[1:], prog="traindeck worker")
    return None


def main(argv: list[str] | None = None, prog: str = "traindeck") -> int:
    argv = sys.argv[1:] if argv is None else argv
    delegated = _delegated(argv) if prog == "traindeck" else None
    if delegated is not None:
        return delegated
    args = build_parser(prog).parse_args(argv)
    try:
        engine = get_engine()
        args.handler(engine, args)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except (UserError, queue.JobNotFound, queue.JobStateError, FieldError, SweepNotFound) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except DatabaseError as exc:
        print(f"error: {database_problem(exc)}", file=sys.stderr)
        return EXIT_DATABASE_ERROR
    return 0


def run_main_command() -> None:
    """The `traindeck` console script."""
    run_main(main)

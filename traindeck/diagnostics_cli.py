"""`traindeck export tensorboard JOB… --dir DIR` (or `python -m db export …`): jobs as
TensorBoard runs (`db.tensorboard`); `traindeck profile JOB --steps N`: record a running job's
next N training steps with a profiler (`db.profiles`). Each takes `--json`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from common.cliargs import command_group, job_id, positive_int
from db.engine import Engine
from db.profiles import MAX_PROFILE_STEPS, request_profile
from db.tensorboard import export_tensorboard


def cmd_export_tensorboard(engine: Engine, args: argparse.Namespace) -> None:
    from traindeck.cli import UserError

    folder = Path(args.dir).expanduser().absolute()
    try:
        runs = export_tensorboard(engine, args.ids, folder)
    except OSError as exc:
        where = exc.filename or folder
        raise UserError(f"--dir: cannot write in {where}: {exc.strerror or exc}") from None
    if args.json:
        print(json.dumps({"dir": str(folder), "runs": [str(run) for run in runs]}, indent=2))
        return
    for run in runs:
        print(f"wrote {run}")
    print(f"open them with: tensorboard --logdir {folder}")


def cmd_profile(engine: Engine, args: argparse.Namespace) -> None:
    capture = request_profile(engine, args.id, args.steps)
    if args.json:
        print(json.dumps({"capture": capture, "job": args.id, "steps": args.steps}, indent=2))
        return
    print(
        f"asked job {args.id} to record its next {args.steps} training steps (capture "
        f"#{capture}); the trace becomes the job's profile artifact (`traindeck show "
        f"{args.id}`)"
    )


def add_commands(commands: Any) -> None:
    """The `export` and `profile` commands, on the main parser's sub-parsers."""
    parsers = command_group(
        commands,
        "export",
        "write jobs in another tool's format",
        "export_command",
        (
            (
                "tensorboard",
                cmd_export_tensorboard,
                "each job as a TensorBoard run (event files): its metric points, XLA compiles "
                "per epoch, its spec as hyper-parameters",
            ),
        ),
    )
    tensorboard = parsers["tensorboard"]
    tensorboard.add_argument("ids", nargs="+", type=job_id, metavar="JOB", help="job ids")
    tensorboard.add_argument(
        "--dir", required=True, metavar="DIR",
        help="where the runs go (made if missing): DIR/job-ID, replacing an earlier export",
    )  # fmt: skip
    help_text = "record a running job's next N training steps with a profiler"
    profile = commands.add_parser("profile", help=help_text, description=help_text)
    profile.add_argument("--json", action="store_true", help="print JSON for scripts")
    profile.add_argument("id", type=job_id, metavar="JOB", help="a running job's id")
    profile.add_argument(
        "--steps", type=positive_int, default=10, metavar="N",
        help=f"how many training steps to record (1 to {MAX_PROFILE_STEPS}; default 10)",
    )  # fmt: skip
    profile.set_defaults(handler=cmd_profile)

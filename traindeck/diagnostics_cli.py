"""`traindeck export tensorboard JOB… --dir DIR` (or `python -m db export …`): jobs as
TensorBoard runs (`db.tensorboard`). Takes `--json`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from common.cliargs import command_group, job_id
from db.engine import Engine
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


def add_commands(commands: Any) -> None:
    """The `export` command and its sub-commands, on the main parser's sub-parsers."""
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

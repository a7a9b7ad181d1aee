"""`traindeck run`: what `make run` does once installed: migrate the database, write the
built-in dataset, then start the dashboard and one worker side by side (honcho), stopping
both when either ends or on Ctrl-C.

The two processes are the lines of the repository's Procfile (tests/traindeck checks they
stay the same), started with this Python so they need no activated environment.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from common import config
from common.cliargs import Parser

# name -> command, as in the Procfile (with `python` = this interpreter)
PROCESSES = {
    "web": "python -m dashboard --port ${TRAINDECK_PORT:-8501} "
    "--address ${TRAINDECK_ADDRESS:-127.0.0.1}",
    "worker": "python -m worker",
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="traindeck run", description=__doc__.splitlines()[0])
    parser.add_argument("--port", help="the dashboard's port (default: $TRAINDECK_PORT or 8501)")
    parser.add_argument(
        "--address", help="the address it listens on (default: $TRAINDECK_ADDRESS or 127.0.0.1)"
    )
    parser.add_argument("--no-worker", action="store_true", help="start the dashboard only")
    return parser


def main(argv: list[str] | None = None) -> int:
    from honcho.manager import Manager

    from datasets.builtin import register_builtin_datasets
    from db.engine import get_engine
    from db.migrate import upgrade

    args = build_parser().parse_args(argv)
    env = dict(os.environ)
    if args.port:
        env["TRAINDECK_PORT"] = args.port
    if args.address:
        env["TRAINDECK_ADDRESS"] = args.address
    config.ensure_data_dir()
    engine = get_engine()
    upgrade(engine)
    register_builtin_datasets(engine)
    manager = Manager()
    python = shlex.quote(sys.executable)
    for name, command in PROCESSES.items():
        if name == "worker" and args.no_worker:
            continue
        manager.add_process(name, python + command.removeprefix("python"), env=env)
    manager.loop()
    return manager.returncode or 0

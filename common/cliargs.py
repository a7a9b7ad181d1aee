"""Argument parsing shared by traindeck's command lines (`python -m db`, `python -m worker`):
a mistake in a flag is one line naming it and exit code 2, never a usage dump or traceback."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

EXIT_USER_ERROR = 2


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"error: {message} (see {self.prog} --help)\n")


def command_group(
    commands: Any,
    name: str,
    help_text: str,
    dest: str,
    subcommands: Iterable[tuple[str, Callable[..., Any], str]],
) -> dict[str, argparse.ArgumentParser]:
    """A command with sub-commands (`dataset add`, `sweep show`…), each with `--json` and its
    handler; returns the sub-commands' parsers by name, for their own arguments."""
    group = commands.add_parser(name, help=help_text)
    subs = group.add_subparsers(dest=dest, required=True, metavar="COMMAND", parser_class=Parser)
    parsers: dict[str, argparse.ArgumentParser] = {}
    for sub_name, handler, sub_help in subcommands:
        sub = subs.add_parser(sub_name, help=sub_help, description=sub_help)
        sub.add_argument("--json", action="store_true", help="print JSON for scripts")
        sub.set_defaults(handler=handler)
        parsers[sub_name] = sub
    return parsers


def _whole_number(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} is a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{what} is at least 1, not {value}")
    return value


def job_id(text: str) -> int:
    return _whole_number(text, "a job id")


def positive_int(text: str) -> int:
    return _whole_number(text, "the value")


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, not {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number greater than 0, not {text}")
    return value

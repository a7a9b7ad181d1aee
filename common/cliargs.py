"""Argument parsing shared by traindeck's command lines (`python -m db`, `python -m worker`):
a mistake in a flag is one line naming it and exit code 2, never a usage dump or traceback."""

from __future__ import annotations

import argparse
from typing import NoReturn

EXIT_USER_ERROR = 2


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"error: {message} (see {self.prog} --help)\n")


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

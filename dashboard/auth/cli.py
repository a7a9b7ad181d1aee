"""`python -m dashboard.auth`: make a password hash, or say what an address needs."""

from __future__ import annotations

import argparse
import getpass
import sys

from common.settings import settings
from dashboard.auth.access import PASSWORD_HASH_ENV, policy
from dashboard.auth.passwords import MAX_PASSWORD_LENGTH, MIN_PASSWORD_LENGTH, hash_password


def _read_new_password() -> str:
    if sys.stdin.isatty():
        first = getpass.getpass("New dashboard password: ")
        if getpass.getpass("Repeat it: ") != first:
            raise SystemExit("error: the two passwords differ; nothing was made")
        return first
    return sys.stdin.readline().rstrip("\r\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dashboard.auth", description="The dashboard's sign-in."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "hash",
        help=f"read a password (prompt, or one line on stdin) and print {PASSWORD_HASH_ENV}",
    )
    check = commands.add_parser("check", help="say whether sign-in is required, and how")
    check.add_argument(
        "--address",
        default=settings().address,
        help="the address the dashboard listens on (default $TRAINDECK_ADDRESS or 127.0.0.1)",
    )
    args = parser.parse_args(argv)
    if args.command == "hash":
        password = _read_new_password()
        if len(password) < MIN_PASSWORD_LENGTH:
            print(
                f"error: the password must have at least {MIN_PASSWORD_LENGTH} characters; "
                "nothing was made",
                file=sys.stderr,
            )
            return 2
        if len(password) > MAX_PASSWORD_LENGTH:
            print(f"error: at most {MAX_PASSWORD_LENGTH} characters", file=sys.stderr)
            return 2
        print(hash_password(password))
        return 0
    current = policy(args.address, use_config=False)
    print(current.describe())
    return 1 if current.problem else 0

"""How an error is told to a person: one line, never a traceback."""

from __future__ import annotations

import re

# `scheme://user:` or a bare `user:` then the password, up to the last `@` of the word: a
# malformed URL is often malformed because its password holds an unescaped `@`, `:` or `/`.
_PASSWORD_IN_URL = re.compile(r"((?:[A-Za-z][A-Za-z0-9+.-]*://)?[^\s:/@'\"]*:(?!//))\S*@")
# libpq also takes the password as a parameter: `postgresql://ada@db/x?password=…`.
_PASSWORD_PARAMETER = re.compile(r"(?i)([?&]password=)[^&\s'\"]*")


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, or its type's name when it has none
    (`TimeoutError()`). A SQLAlchemy error speaks through the driver's error it wraps,
    whose message goes on with the SQL and its parameters."""
    error = getattr(exc, "orig", None) or exc
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def error_summary(exc: BaseException) -> str:
    """`TypeName: first line`, or just the type's name for an error with no message."""
    error = getattr(exc, "orig", None) or exc
    text = first_line(exc)
    name = type(error).__name__
    return name if text == name else f"{name}: {text}"


def mask_passwords(text: str) -> str:
    """`text` with the password of every URL in it (`scheme://user:password@host…`, even a
    URL no parser accepts, or `?password=…`) replaced by `***`."""
    return _PASSWORD_PARAMETER.sub(r"\1***", _PASSWORD_IN_URL.sub(r"\1***@", text))

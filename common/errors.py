"""How an error is told to a person: one line, never a traceback."""

from __future__ import annotations


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

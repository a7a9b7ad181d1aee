"""What a person typed for a setting (an API token's name, an alert destination): the error
that names the input, and the check of a one-line name. (Job specs have their own, richer
validation: `db.spec`.)"""

from __future__ import annotations

import re

_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


class FieldError(ValueError):
    """An input was refused; `field` names it, `message` says what is wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def one_line_name(value: str | None, max_length: int, field: str = "name") -> str:
    """`value` stripped; FieldError when it is empty, longer than `max_length` or not one
    line of text."""
    name = (value or "").strip()
    if not name or len(name) > max_length or _CONTROL_CHARS.search(name):
        raise FieldError(field, f"must be 1 to {max_length} characters, on one line")
    return name

"""A list of ids in one bound parameter, whatever its length.

`column.in_(ids)` binds one parameter per id: past 65,535 of them Postgres refuses the
statement ("number of parameters must be between 0 and 65535"), SQLite past 32,766, and well
before that the statement's text and planning grow with the list. Here the whole list is one
value: an integer array on Postgres (`= ANY(:ids)`), a JSON array that SQLite's `json_each`
unpacks (`IN (SELECT value FROM json_each(:ids))`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import BigInteger, Connection, Engine, any_, bindparam, func, select
from sqlalchemy.dialects import postgresql


def one_of(bind: Engine | Connection, column: Any, ids: Iterable[int]) -> Any:
    """The condition `column` is one of `ids`, with the list bound as a single parameter."""
    values = [int(value) for value in ids]
    if bind.dialect.name == "sqlite":
        unpacked = func.json_each(bindparam(None, json.dumps(values))).table_valued("value")
        return column.in_(select(unpacked.c.value))
    array = bindparam(None, values, type_=postgresql.ARRAY(BigInteger))
    return column == any_(array)

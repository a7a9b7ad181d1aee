"""Database calls that wait out a locked or restarting database instead of failing."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy.exc import OperationalError

from db import engine as db_engine


def _error(message: str) -> OperationalError:
    return OperationalError("BEGIN IMMEDIATE", {}, sqlite3.OperationalError(message))


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(db_engine.time, "sleep", slept.append)
    return slept


def test_a_locked_database_is_tried_again_with_growing_waits(no_waiting):
    outcomes = [_error("database is locked"), _error("database is locked"), "stored"]

    def action() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert db_engine.retry_while_unavailable(action, "store it") == "stored"
    assert no_waiting == [0.5, 1.0]


def test_an_error_that_is_not_about_availability_is_raised_at_once(no_waiting):
    def action() -> None:
        raise _error("no such table: jobs")

    with pytest.raises(OperationalError, match="no such table"):
        db_engine.retry_while_unavailable(action, "store it")
    assert no_waiting == []


def test_a_stop_request_ends_the_waiting(no_waiting):
    def action() -> None:
        raise _error("server closed the connection unexpectedly")

    with pytest.raises(OperationalError, match="server closed"):
        db_engine.retry_while_unavailable(action, "store it", give_up=lambda: True)
    assert no_waiting == []

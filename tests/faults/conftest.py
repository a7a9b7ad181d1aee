"""Fixtures for the fault tests: small real digit sets registered in the test's database."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine

from datasets.register import register_folder
from tests.support.workers import digits_subset


@pytest.fixture
def digits_dataset(engine: Engine, data_dir: Path) -> Callable[..., str]:
    """Register a subset of the digits in the `engine` database (SQLite or Postgres)."""

    def make(per_class: int = 60, classes: int = 10, name: str = "digits-subset") -> str:
        register_folder(engine, name, digits_subset(data_dir, per_class, classes))
        return name

    return make

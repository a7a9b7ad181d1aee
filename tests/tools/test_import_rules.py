"""The rules of the house (.importlinter) hold, and a forbidden import fails them loudly."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOMS = ("common", "datasets", "db", "worker", "dashboard", "inference", "cloud", "traindeck")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    # The copy's rooms come first on the path, so the graph is built from its files.
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def house(tmp_path: Path) -> Path:
    for room in ROOMS:
        shutil.copytree(REPO / room, tmp_path / room, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def test_every_contract_is_kept(house: Path):
    result = _lint_imports(house)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("worker/reporter.py", "import dashboard.format", "never import each other"),
        ("dashboard/format.py", "import sqlalchemy", "Only db/ speaks SQL"),
        ("db/series.py", "import datasets.labelling", "db/ imports no other room"),
        ("datasets/items.py", "import torch", "never torch"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(house: Path, module, line, contract):
    path = house / module
    path.write_text(path.read_text() + f"\n{line}  # deliberately forbidden\n")
    result = _lint_imports(house)
    assert result.returncode != 0
    broken = result.stdout.split("Broken contracts")[-1]
    assert contract in result.stdout.split("Contracts:")[0]
    assert module.replace("/", ".").removesuffix(".py") in broken, result.stdout

"""Imported first by every benchmark script: puts the repository on sys.path and takes the
bench/ folder off it, where `queue.py` would shadow the standard library's `queue` module
(psycopg and torch import it)."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != BENCH]

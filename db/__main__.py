"""`python -m db …`: the same commands as `traindeck …` (kept for scripts written before it)."""

from common.entry import run_main
from traindeck.cli import main

run_main(lambda: main(prog="python -m db"))

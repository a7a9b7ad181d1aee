from common.entry import run_main
from worker.cli import main

run_main(main)

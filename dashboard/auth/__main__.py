from common.entry import run_main
from dashboard.auth.cli import main

run_main(main)

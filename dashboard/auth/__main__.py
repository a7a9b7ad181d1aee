from dashboard.auth.cli import main
from db.entry import run_main

run_main(main)

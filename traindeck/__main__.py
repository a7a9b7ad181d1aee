from traindeck.cli import run_main_command

run_main_command()

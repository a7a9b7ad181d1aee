# traindeck: `make run` starts the dashboard and a worker, `make test` runs the whole suite.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# pip on some machines warns about every missing local index folder; keep the real output.
PIP_INSTALL = $(BIN)/python -m pip install --quiet --disable-pip-version-check
QUIET_PIP = { grep -v "is ignored: it is neither a file nor a directory" || true; }
# requirements*.txt are the human-edited inputs (floors); requirements*.lock pin every package
# that installs. Each lock is compiled against the one before it, so all three agree.
PIP_COMPILE = CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/pip-compile --quiet --strip-extras \
	--no-emit-index-url --no-emit-find-links $(LOCK_ARGS)

.PHONY: run test check lint format bench venv clean-data lock lock-check

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "traindeck needs Python 3.11, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-run: requirements.lock pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -r requirements.lock 2>&1 | $(QUIET_PIP)
	$(PIP_INSTALL) --no-deps -e . 2>&1 | $(QUIET_PIP)
	touch $@

$(VENV)/.installed-dev: requirements-dev.lock pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -r requirements-dev.lock 2>&1 | $(QUIET_PIP)
	$(PIP_INSTALL) --no-deps -e . 2>&1 | $(QUIET_PIP)
	touch $@ $(VENV)/.installed-run

# bench/peers.py's MLflow, TensorBoard and W&B: only `make bench` installs them.
$(VENV)/.installed-bench: requirements-bench.lock pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -r requirements-bench.lock 2>&1 | $(QUIET_PIP)
	$(PIP_INSTALL) --no-deps -e . 2>&1 | $(QUIET_PIP)
	touch $@ $(VENV)/.installed-dev $(VENV)/.installed-run

venv: $(VENV)/.installed-run

## lock: re-resolve requirements*.lock from requirements*.txt, keeping every pin that still fits
##       (LOCK_ARGS=--upgrade moves every pin to the newest release the floors allow)
lock: | $(BIN)/python
	$(BIN)/pip-compile --version >/dev/null 2>&1 \
		|| $(PIP_INSTALL) -c requirements-dev.lock pip-tools 2>&1 | $(QUIET_PIP)
	$(PIP_COMPILE) --output-file requirements.lock requirements.txt 2>&1 | $(QUIET_PIP)
	$(PIP_COMPILE) -c requirements.lock --output-file requirements-dev.lock \
		requirements-dev.txt 2>&1 | $(QUIET_PIP)
	$(PIP_COMPILE) -c requirements-dev.lock --output-file requirements-bench.lock \
		requirements-bench.txt 2>&1 | $(QUIET_PIP)
	$(BIN)/python tools/lockcheck.py

## lock-check: fail when a requirements*.lock no longer matches its requirements*.txt (no network)
lock-check: | $(BIN)/python
	$(BIN)/python tools/lockcheck.py

## run: install, migrate, write the built-in dataset, start dashboard + worker (Procfile)
run: $(VENV)/.installed-run
	$(BIN)/traindeck upgrade
	$(BIN)/traindeck dataset builtin
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/honcho start

# The fast tier runs one test process per core, one torch thread each: with a process per core,
# more threads only spin against each other (a small CPU training test took 67 s with two, 16 s
# with one, on a loaded machine). Exit status 5 is pytest's "no test selected", which a
# PYTEST_ARGS naming only tests of the other tier gives.
CHECK_PROCESSES ?= $(shell nproc)
FAST_TIER = OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m "not slow" -q -n $(CHECK_PROCESSES) --dist worksteal $(PYTEST_ARGS) \
	|| [ $$? -eq 5 ]

# The slow tier's tests mostly wait: on workers, browsers and XLA runtimes they start, on
# imports and compiles that use one core. Two at a time, one torch thread each, as the fast
# tier; the few marked `serial` change what every test shares (they restart Postgres) and run
# alone afterwards.
SLOW_TIER = OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m "slow and not serial" -q -n $(CHECK_PROCESSES) --dist worksteal \
	--durations=25 $(PYTEST_ARGS) || [ $$? -eq 5 ]
SERIAL_TIER = $(BIN)/python -m pytest -m "slow and serial" -q --durations=5 $(PYTEST_ARGS) || [ $$? -eq 5 ]

## test: install the dev tools, lint, run every test: the fast tier as `make check` runs it,
##       then the slow tier (its tests start workers, browsers and XLA runtimes of their own,
##       and wait on them), then the few that must run alone
test: lint
	$(FAST_TIER)
	$(SLOW_TIER)
	$(SERIAL_TIER)

## check: lint and every test not marked slow, one process per core (run it before each commit)
check: lint
	$(FAST_TIER)

## lint: style, formatting and the rules of the house (.importlinter)
lint: lock-check $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

format: $(VENV)/.installed-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## bench: every benchmark under bench/ (prints ratios; never fails on timing)
bench: $(VENV)/.installed-bench
	for script in $$(ls bench/[a-z]*.py); do $(BIN)/python -m bench.$$(basename $$script .py) || exit 1; done

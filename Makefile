# traindeck: `make run` starts the dashboard and a worker, `make test` runs the whole suite.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# pip on some machines warns about every missing local index folder; keep the real output.
PIP_INSTALL = $(BIN)/python -m pip install --quiet --disable-pip-version-check
QUIET_PIP = { grep -v "is ignored: it is neither a file nor a directory" || true; }

.PHONY: run test check lint format bench venv clean-data

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "traindeck needs Python 3.11, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-run: requirements.txt pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -r requirements.txt 2>&1 | $(QUIET_PIP)
	$(PIP_INSTALL) --no-deps -e . 2>&1 | $(QUIET_PIP)
	touch $@

$(VENV)/.installed-dev: requirements.txt requirements-dev.txt pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -r requirements-dev.txt 2>&1 | $(QUIET_PIP)
	$(PIP_INSTALL) --no-deps -e . 2>&1 | $(QUIET_PIP)
	touch $@ $(VENV)/.installed-run

venv: $(VENV)/.installed-run

## run: install, migrate, write the built-in dataset, start dashboard + worker (Procfile)
run: $(VENV)/.installed-run
	$(BIN)/traindeck upgrade
	$(BIN)/traindeck dataset builtin
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/honcho start

## test: install the dev tools, lint, run every test
test: lint
	$(BIN)/python -m pytest --durations=25 $(PYTEST_ARGS)

## check: lint and every test not marked slow (a few minutes; run it before each commit)
check: lint
	$(BIN)/python -m pytest -m "not slow" -q $(PYTEST_ARGS)

## lint: style, formatting and the rules of the house (.importlinter)
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

format: $(VENV)/.installed-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## bench: every benchmark under bench/ (prints ratios; never fails on timing)
bench: $(VENV)/.installed-dev
	for script in bench/*.py; do $(BIN)/python $$script; done

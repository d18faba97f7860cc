# Stint: `make run` serves the whole system, `make test` runs the suite. Both need only Python 3.11+.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
DEVSTACK := $(PY) -m config.devstack run --
PORT ?= 8000
PYTEST_ARGS ?=
ARGS ?=

.PHONY: run serve test lint fmt loadtest bench clean

$(VENV)/.runtime: requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt 2>&1 | { grep -v '^WARNING: Location' || true; }
	@$(PY) -c "import django, psycopg, confluent_kafka" && touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt 2>&1 | { grep -v '^WARNING: Location' || true; }
	@$(PY) -c "import pytest, pytest_django, factory, hypothesis" && touch $@

run: $(VENV)/.runtime
	@$(DEVSTACK) $(MAKE) --no-print-directory serve

# Runs inside the dev stack (the server URLs are in the environment).
serve:
	$(PY) manage.py migrate --noinput
	$(PY) manage.py ensure_admin
	@echo "Stint: http://127.0.0.1:$(PORT)/  (API /api/, admin /admin/, docs /api/docs/)"
	STINT_WEB_PORT=$(PORT) $(VENV)/bin/honcho start -f Procfile

test: $(VENV)/.dev
	@$(DEVSTACK) $(PY) -m pytest --create-db $(PYTEST_ARGS)

# Benchmark (not a test): real worker processes, 10,000 jobs; ARGS="--noop --jobs 20000" etc.
loadtest: $(VENV)/.dev
	@$(DEVSTACK) $(PY) bench/loadtest.py $(ARGS)

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

fmt: $(VENV)/.dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	-$(PY) -m config.devstack down
	rm -rf $(VENV) .devstack .pytest_cache .hypothesis

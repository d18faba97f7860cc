# Stint: `make run` serves the whole system, `make test` runs the suite. Both need only Python 3.11+.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
DEVSTACK := $(PY) -m config.devstack run --
PORT ?= 8000
PYTEST_ARGS ?=
ARGS ?=

OBSERVE_DIR ?= .observe
OBSERVE_PORT ?= 9090

.PHONY: run serve test lint fmt loadtest bench clean observe observe-config prometheus-tools fuzz

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
	@# Ctrl-C ends honcho with 130: that is a clean stop, not an error.
	STINT_WEB_PORT=$(PORT) $(VENV)/bin/honcho start -f Procfile; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 130 ] || exit $$rc

test: $(VENV)/.dev prometheus-tools
	@$(DEVSTACK) $(PY) -m pytest --create-db $(PYTEST_ARGS)

# Benchmark (not a test): real worker processes, 10,000 jobs; ARGS="--noop --jobs 20000" etc.
loadtest: $(VENV)/.dev
	@$(DEVSTACK) $(PY) bench/loadtest.py $(ARGS)

# ruff; bandit failing on any high-severity finding (lower ones are printed: read them); pip-audit of
# the pinned requirements, --strict so a package it could not look up fails the run instead of
# passing unchecked. Known exceptions are listed with reasons in docs/security.md (--ignore-vuln).
BANDIT_EXCLUDE := ./.venv,./.devstack,./tests,./node_modules
PIP_AUDIT_FLAGS ?= --strict
# Benchmark (not a test): Stint and its peers side by side on the benchmark's own PostgreSQL, Redis
# and broker under .bench/ (peers in .bench/venvs/); ARGS="--quick", "--only stint,pgqueuer",
# "--reps 5", "--scenarios drain,lag200". Results in .bench/results/; see docs/benchmarks.md.
bench: $(VENV)/.dev
	@$(PY) bench/side_by_side.py $(ARGS)

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/bandit -q -r . -x $(BANDIT_EXCLUDE) --severity-level high
	$(VENV)/bin/pip-audit --progress-spinner off $(PIP_AUDIT_FLAGS) -r requirements.txt -r requirements-dev.txt

# Schemathesis against /api/schema/ with every phase and 200 fuzzed cases per operation (the
# default suite runs 20 without the coverage phase); STINT_FUZZ_EXAMPLES overrides.
STINT_FUZZ_EXAMPLES ?= 200
fuzz: $(VENV)/.dev
	@STINT_FUZZ_EXAMPLES=$(STINT_FUZZ_EXAMPLES) STINT_FUZZ_PHASES=examples,coverage,fuzzing \
	  $(DEVSTACK) $(PY) -m pytest --create-db tests/config/test_schemathesis.py $(PYTEST_ARGS)

fmt: $(VENV)/.dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	-$(PY) -m config.devstack down
	rm -rf $(VENV) .devstack .pytest_cache .hypothesis $(OBSERVE_DIR)

# prometheus and promtool come from Debian's `prometheus` package: the tests run `promtool check`
# on docker/prometheus/, and `make observe` runs a real Prometheus. Installed with apt-get when
# missing and we are root; otherwise say so (the promtool tests then fail with a clear message).
prometheus-tools:
	@if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "prometheus/promtool not found: installing Debian's prometheus package (apt-get update && apt-get install prometheus)"; \
	  { apt-get -o DPkg::Lock::Timeout=300 update -qq \
	    && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends prometheus; \
	  } >/dev/null || echo "WARNING: could not install Debian's prometheus package: promtool checks will fail"; \
	else \
	  echo "WARNING: promtool not found and cannot install it (needs root and apt-get): promtool checks will fail"; \
	fi

# Prometheus scraping the processes of `make run` (run it in another terminal) with Stint's alert
# rules: web :$(PORT)/metrics, run_scheduler :9101, run_workers :9102, run_audit_consumer :9103
# (the Procfile's --metrics-port). UI on http://127.0.0.1:$(OBSERVE_PORT)/; data in $(OBSERVE_DIR)/.
observe-config:
	@mkdir -p $(OBSERVE_DIR)
	@sed -e 's|@WEB_TARGET@|127.0.0.1:$(PORT)|' -e 's|@RULES@|$(CURDIR)/docker/prometheus/alerts.yml|' \
	  docker/prometheus/observe.yml > $(OBSERVE_DIR)/prometheus.yml
	@echo "wrote $(OBSERVE_DIR)/prometheus.yml"

observe: prometheus-tools observe-config
	@command -v prometheus >/dev/null 2>&1 || { echo "prometheus is not installed (Debian: apt-get install prometheus)"; exit 1; }
	promtool check config $(OBSERVE_DIR)/prometheus.yml
	@echo "Prometheus: http://127.0.0.1:$(OBSERVE_PORT)/  scraping web :$(PORT), scheduler :9101, workers :9102, audit :9103"
	prometheus --config.file=$(OBSERVE_DIR)/prometheus.yml --storage.tsdb.path=$(OBSERVE_DIR)/data \
	  --web.listen-address=127.0.0.1:$(OBSERVE_PORT) --log.level=warn

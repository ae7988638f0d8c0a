# Two entry points do all set-up on a fresh machine (Python 3.11 + Java 17):
#   make run   - start the local 3-node cluster (whatever of it exists so far)
#   make test  - install everything the suite needs and run the whole suite
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
SEEDS  ?= 2000

.PHONY: run test test-fast test-slow sim-seeds lint bench clean venv

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[broker,operator,dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(PY) -m broker.run_local

test: $(STAMP)
	./scripts/ensure-rabbitmq
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# More Raft simulation seeds than CI runs (CI runs the default 500+).
sim-seeds: $(STAMP)
	RAFT_SIM_SEEDS=$(SEEDS) $(PY) -m pytest -q tests/raft/test_simulation.py

lint: $(STAMP)
	$(VENV)/bin/ruff check broker tests bench
	$(VENV)/bin/mypy broker/raft

bench: $(STAMP)
	$(PY) bench/raft_core.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

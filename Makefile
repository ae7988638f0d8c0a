# Two entry points do all set-up on a fresh machine (Python 3.11 + Java 17):
#   make run   - start the local 3-node cluster (whatever of it exists so far)
#   make test  - install everything the suite needs and run the whole suite
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
SEEDS  ?= 2000

.PHONY: audit run test test-fast test-slow sim-seeds lint bench bench-report bench-profile bench-scale clean venv chaos

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[broker,operator,dev,spark]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(PY) -m broker.run_local

test: $(STAMP)
	./scripts/ensure-rabbitmq
	./scripts/ensure-chromium
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# More Raft simulation seeds than CI runs (CI runs the default 500+).
sim-seeds: $(STAMP)
	RAFT_SIM_SEEDS=$(SEEDS) $(PY) -m pytest -q tests/raft/test_simulation.py

# Long fault-injection schedules (root: network namespaces); docs/RELIABILITY.md.
CHAOS_RUNS     ?= 20
CHAOS_DURATION ?= 120
CHAOS_NEMESIS  ?= all
CHAOS_SEED     ?= 1
CHAOS_OUT      ?= chaos-results
CHAOS_ARGS     ?=# e.g. "--publishers 12 --rate 0": unpaced publishers, many publishes per Raft entry
chaos: $(STAMP)
	nice $(PY) -m tests.chaos.run --nodes 3 --seed $(CHAOS_SEED) --runs $(CHAOS_RUNS) --duration $(CHAOS_DURATION) --nemesis $(CHAOS_NEMESIS) $(CHAOS_ARGS) --out $(CHAOS_OUT)/n3; s3=$$?; \
	nice $(PY) -m tests.chaos.run --nodes 5 --seed $(CHAOS_SEED) --runs $(CHAOS_RUNS) --duration $(CHAOS_DURATION) --nemesis $(CHAOS_NEMESIS) $(CHAOS_ARGS) --out $(CHAOS_OUT)/n5; s5=$$?; \
	test $$s3 -eq 0 -a $$s5 -eq 0

lint: $(STAMP)
	$(VENV)/bin/ruff check broker tests bench
	$(VENV)/bin/mypy broker
	$(VENV)/bin/lint-imports

# Storage audit (PySpark, local mode) of the `make run` cluster: its data
# directory plus each node's management API (docs/AUDIT.md).
AUDIT_DATA ?= $(or $(QQ_DATA),data)
AUDIT_OUT  ?= audit-out
AUDIT_ARGS ?=
audit: $(STAMP)
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} $(PY) -m spark.audit --data $(AUDIT_DATA) --api http://127.0.0.1:15672,http://127.0.0.1:15673,http://127.0.0.1:15674 --out $(AUDIT_OUT) $(AUDIT_ARGS)

bench: $(STAMP)
	$(PY) bench/raft_core.py

# Our broker and RabbitMQ side by side (1 and 3 nodes of each, started and
# stopped by the script on their own ports): writes docs/PERFORMANCE.md.
# BENCH_ARGS=--quick for a ~15 min pass; see bench/report.py.
BENCH_ARGS ?=
bench-report: $(STAMP)
	./scripts/ensure-rabbitmq
	$(PY) bench/report.py $(BENCH_ARGS)

# 10,000 quorum queues and 1,000 connections on a 3-node cluster: declare
# rate, idle CPU/memory per queue and connection, restart, recovery, election
# storm (bench/scale.py; docs/OPERATIONS.md, Scale).
bench-scale: $(STAMP)
	$(PY) bench/scale.py $(BENCH_ARGS)

# Where a message's time goes on each node of a 3-node cluster under load
# (py-spy, root or ptrace permission): bench/profile.py.
bench-profile: $(STAMP)
	$(PY) bench/profile.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

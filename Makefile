# Two entry points do all set-up on a fresh machine (Python 3.11 + Java 17):
#   make run   - start the local 3-node cluster (whatever of it exists so far)
#   make test  - install everything the suite needs and run the whole suite
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
SEEDS  ?= 2000

.PHONY: native native-clean test-pure audit run test test-fast test-slow sim-seeds lint bench bench-report bench-profile bench-scale clean venv chaos

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[broker,operator,dev,spark]'
	touch $(STAMP)

venv: $(STAMP)

# The hot modules compiled with mypyc (broker/compiled.py lists them; a no-op
# while the build is current). Without it, or with QQ_PURE_PYTHON=1, the same
# code runs as pure Python.
native: $(STAMP)
	$(PY) scripts/build_native.py

native-clean: $(STAMP)
	$(PY) scripts/build_native.py --clean

run: native
	$(PY) -m broker.run_local

# The whole suite on the compiled build, then the pure Python path of the
# compiled modules: their own unit tests and a real-client run (test-pure).
test: native
	./scripts/ensure-rabbitmq
	./scripts/ensure-chromium
	$(PY) -m pytest -q
	$(MAKE) --no-print-directory test-pure

PURE_TESTS ?= tests/amqp tests/queue tests/raft tests/runtime tests/e2e/test_clients.py tests/e2e/test_compat.py tests/test_compiled.py
test-pure: $(STAMP)
	QQ_PURE_PYTHON=1 $(PY) -m pytest -q $(PURE_TESTS)

test-fast: native
	$(PY) -m pytest -q -m "not slow"

test-slow: native
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
chaos: native
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

bench: native
	$(PY) bench/raft_core.py

# Our broker and RabbitMQ side by side (1 and 3 nodes of each, started and
# stopped by the script on their own ports): writes docs/PERFORMANCE.md.
# BENCH_ARGS=--quick for a ~15 min pass; see bench/report.py.
BENCH_ARGS ?=
bench-report: native
	./scripts/ensure-rabbitmq
	$(PY) bench/report.py $(BENCH_ARGS)

# 10,000 quorum queues and 1,000 connections on a 3-node cluster: declare
# rate, idle CPU/memory per queue and connection, restart, recovery, election
# storm (bench/scale.py; docs/OPERATIONS.md, Scale).
bench-scale: native
	$(PY) bench/scale.py $(BENCH_ARGS)

# Where a message's time goes on each node of a 3-node cluster under load
# (perf on the compiled build, else py-spy; root or ptrace permission):
# bench/node_profile.py.
bench-profile: native
	$(PY) bench/node_profile.py $(BENCH_ARGS)

clean:
	test ! -x $(PY) || $(PY) scripts/build_native.py --clean
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

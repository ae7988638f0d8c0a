"""The operator's own Prometheus metrics (prometheus-client).

Served on QQ_OPERATOR_METRICS_PORT (see __main__/handlers startup) from a
registry of its own, so importing the module twice in one process (tests)
never registers a name twice.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter("quorumq_operator_reconciles", "Reconciliations by resource kind and result "
                     "(ok, temporary, permanent)", ["kind", "result"], registry=REGISTRY)
ACTIONS = Counter("quorumq_operator_actions", "Planner actions executed against a broker",
                  ["action", "result"], registry=REGISTRY)
RECONCILE_SECONDS = Histogram("quorumq_operator_reconcile_seconds", "Time of one reconciliation",
                              ["kind"], registry=REGISTRY)
BROKER_UNREACHABLE = Counter("quorumq_operator_broker_unreachable",
                             "Reconciliations that could not reach a broker's management API",
                             registry=REGISTRY)
QUEUES_READY = Gauge("quorumq_operator_queue_ready", "1 when the QuorumQueue is Ready",
                     ["namespace", "name"], registry=REGISTRY)

"""The RBAC evaluation used to check kopf's requests against the chart (rbac.py)."""
from __future__ import annotations

from typing import Any

from .rbac import denied


def role(ns: str, *rules: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "Role", "metadata": {"name": "op", "namespace": ns}, "rules": list(rules)}


STS_READ = {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get", "list", "watch"]}
QQ_STATUS = {"apiGroups": ["quorumq.dev"], "resources": ["quorumqueues/status"], "verbs": ["patch"]}
NAMED = {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["creds"], "verbs": ["list"]}


def test_allowed_and_denied_requests() -> None:
    roles = [role("messaging", STS_READ, QQ_STATUS, NAMED)]
    requests = [
        ("list", "apps", "statefulsets", "messaging"),          # allowed
        ("patch", "apps", "statefulsets", "messaging"),         # verb missing
        ("watch", "apps", "statefulsets", "payments"),          # no Role in that namespace
        ("patch", "quorumq.dev", "quorumqueues/status", "messaging"),  # allowed (subresource)
        ("patch", "quorumq.dev", "quorumqueues", "messaging"),  # the object itself: not granted
        ("list", "", "secrets", "messaging"),                   # only by name: a list is denied
        ("list", "", "namespaces", None),                       # cluster-scoped: needs a ClusterRole
    ]
    assert denied(requests, roles) == sorted([requests[i] for i in (1, 2, 4, 5, 6)], key=str)


def test_wildcards() -> None:
    roles = [role("ns", {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]})]
    assert denied([("delete", "apps", "statefulsets", "ns")], roles) == []

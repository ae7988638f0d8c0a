"""RBAC as the API server evaluates it, for the requests kopf makes: the
stand-in API (kmock) enforces no RBAC, so the operator tests record what kopf
asked for (`KubeApi.kopf_requests()`) and check it against the chart's rendered
Roles here. A request the Roles do not allow would be a 403 on a real cluster
(the operator's StatefulSet timer once needed `patch` for its finalizer and
the chart did not grant it)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Request = tuple[str, str, str, "str | None"]  # verb, apiGroup, resource[/subresource], namespace


def _matches(rule: dict[str, Any], verb: str, group: str, resource: str) -> bool:
    def has(key: str, value: str) -> bool:
        values = rule.get(key) or []
        return "*" in values or value in values
    # resourceNames rules never allow list/watch/create of a whole collection;
    # kopf's requests are checked without names, so such a rule allows none of them
    return (has("verbs", verb) and has("apiGroups", group) and has("resources", resource)
            and not rule.get("resourceNames"))


def denied(requests: Iterable[Request], roles: Iterable[dict[str, Any]]) -> list[Request]:
    """The requests no rule of a Role in the request's namespace allows
    (a cluster-scoped request needs a ClusterRole: denied here)."""
    by_ns: dict[str, list[dict[str, Any]]] = {}
    for role in roles:
        by_ns.setdefault(role["metadata"]["namespace"], []).extend(role.get("rules") or [])
    return sorted(
        (r for r in requests
         if not any(_matches(rule, r[0], r[1], r[2]) for rule in by_ns.get(r[3] or "", []))),
        key=str)

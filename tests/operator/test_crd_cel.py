"""The CRDs' CEL rules (`x-kubernetes-validations`), evaluated for real.

kmock (the stand-in API server) does not run CEL, so this test does what the
Kubernetes API server does on create and update: every rule at every level of
the schema is evaluated with a real CEL implementation (cel-python) against
the object's value at that level (`self`) and, for transition rules, the old
object's value (`oldSelf`; skipped on create or when the old value is
absent, as Kubernetes does). Fields the broker cannot change after
declaration are refused with the rule's message; everything else may change.
"""
from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
_ENV = celpy.Environment()
_MISSING = object()


def _schema(crd_file: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / crd_file).read_text())
    return dict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def _rules(schema: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, str]]]:
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule
    for name, sub in schema.get("properties", {}).items():
        yield from _rules(sub, (*path, name))


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


def _defaulted(schema: dict[str, Any], obj: Any) -> Any:
    """The object with the schema's defaults filled in, as the API server
    does before it validates (structural defaulting)."""
    if not isinstance(obj, dict):
        return obj
    out = dict(obj)
    for name, sub in schema.get("properties", {}).items():
        if name not in out and "default" in sub:
            out[name] = copy.deepcopy(sub["default"])
        if name in out:
            out[name] = _defaulted(sub, out[name])
    return out


def violations(crd_file: str, new: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """The messages of the rules `new` breaks (an update when `old` is given)."""
    schema = _schema(crd_file)
    new = _defaulted(schema, new)
    old = _defaulted(schema, old) if old is not None else None
    out = []
    for path, rule in _rules(schema):
        value = _at(new, path)
        if value is _MISSING:
            continue
        activation = {"self": celpy.json_to_cel(value)}
        if "oldSelf" in rule["rule"]:
            before = _at(old, path) if old is not None else _MISSING
            if before is _MISSING:
                continue  # a transition rule: only on update, with an old value
            activation["oldSelf"] = celpy.json_to_cel(before)
        result = _ENV.program(_ENV.compile(rule["rule"])).evaluate(activation)
        if result is not True and not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            out.append(rule["message"])
    return out


def _example(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((CRDS / "examples" / name).read_text()))


def _changed(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    cur = new
    for key in path[:-1]:
        cur = cur.setdefault(key, {})
    if value is _MISSING:
        cur.pop(path[-1], None)
    else:
        cur[path[-1]] = value
    return new


QQ = "quorumqueues.quorumq.dev.yaml"
POLICY = "policies.quorumq.dev.yaml"


@pytest.mark.parametrize("example", sorted(p.name for p in (CRDS / "examples").glob("*.yaml")))
def test_every_example_passes_on_create_and_on_an_unchanged_update(example: str) -> None:
    obj = _example(example)
    crd = QQ if obj["kind"] == "QuorumQueue" else POLICY
    assert violations(crd, obj) == []
    assert violations(crd, obj, obj) == []


@pytest.mark.parametrize(("path", "value", "message"), [
    (("spec", "name"), "renamed", "spec.name is immutable"),
    (("spec", "vhost"), "other", "spec.vhost is immutable"),
    (("spec", "arguments", "deliveryLimit"), 5, "spec.arguments are immutable"),
    (("spec", "arguments", "overflow"), "drop-head", "spec.arguments are immutable"),
    (("spec", "arguments", "maxLength"), _MISSING, "spec.arguments are immutable"),
])
def test_what_the_broker_cannot_change_is_refused_on_update(
        path: tuple[str, ...], value: Any, message: str) -> None:
    old = _changed(_example("quorumqueue-orders.yaml"), ("spec", "name"), "orders")
    old["spec"]["vhost"] = "/"
    found = violations(QQ, _changed(old, path, value), old)
    assert any(message in m for m in found), found


def test_a_name_cannot_be_added_or_removed_later() -> None:
    old = _example("quorumqueue-orders.yaml")  # the queue is named after metadata.name
    assert any("spec.name is immutable" in m
               for m in violations(QQ, _changed(old, ("spec", "name"), "other"), old))
    named = _changed(old, ("spec", "name"), "orders")
    assert any("spec.name is immutable" in m
               for m in violations(QQ, _changed(named, ("spec", "name"), _MISSING), named))


@pytest.mark.parametrize(("path", "value"), [
    (("spec", "deletionPolicy"), "retain"),
    (("spec", "broker"), {"service": "quorumq-client", "secretName": "quorumq-admin"}),
    (("metadata", "labels"), {"team": "payments"}),
])
def test_what_may_change_passes(path: tuple[str, ...], value: Any) -> None:
    old = _example("quorumqueue-orders.yaml")
    assert violations(QQ, _changed(old, path, value), old) == []


@pytest.mark.parametrize(("spec", "message"), [
    ({"name": "amq.mine"}, "queue names starting with 'amq.' are reserved"),
    ({"arguments": {"deadLetterRoutingKey": "k"}}, "deadLetterRoutingKey needs deadLetterExchange"),
    ({"broker": {}}, "spec.broker needs statefulSet, service or host"),
    ({"broker": {"service": "s", "host": "h"}}, "spec.broker: give service or host, not both"),
    ({"broker": {"service": "s"}}, "spec.broker.secretName is required without a statefulSet"),
])
def test_invalid_queues_are_refused_on_create(spec: dict[str, Any], message: str) -> None:
    obj = _example("quorumqueue-minimal.yaml")
    obj["spec"] = {**obj["spec"], **spec}
    assert message in violations(QQ, obj)


@pytest.mark.parametrize(("path", "value", "message"), [
    (("spec", "name"), "renamed", "spec.name is immutable"),
    (("spec", "vhost"), "other", "spec.vhost is immutable"),
    (("spec", "operatorPolicy"), False, "spec.operatorPolicy is immutable"),
])
def test_policy_identity_is_immutable(path: tuple[str, ...], value: Any, message: str) -> None:
    old = _changed(_example("policy-operator-caps.yaml"), ("spec", "name"), "caps")
    old["spec"]["vhost"] = "/"
    found = violations(POLICY, _changed(old, path, value), old)
    assert any(message in m for m in found), found


def test_policy_pattern_priority_and_definition_may_change() -> None:
    old = _example("policy-limits.yaml")
    new = copy.deepcopy(old)
    new["spec"]["pattern"] = "^other$"
    new["spec"]["priority"] = 7
    new["spec"]["definition"] = {"max-length": 5}
    assert violations(POLICY, new, old) == []


def test_an_operator_policy_may_only_cap_what_rabbitmq_lets_it() -> None:
    obj = _example("policy-operator-caps.yaml")
    obj["spec"]["definition"] = {"max-length": 10, "dead-letter-exchange": "dlx"}
    assert any("operator policies may only set" in m for m in violations(POLICY, obj))

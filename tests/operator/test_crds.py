"""The CRDs and example resources: valid manifests, structural schemas, immutability rules."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from quorumq_operator.__main__ import kopf_args
from quorumq_operator.spec import ARGUMENT_KEYS, POLICY_KEYS, policy_desired, queue_desired

from . import manifests as m

EXAMPLES = sorted((m.CRD_DIR / "examples").glob("*.yaml"))
CRD_FILES = sorted(m.CRD_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", CRD_FILES, ids=lambda p: p.name)
def test_crd_manifests_validate_strictly(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        m.validate_builtin(doc)


def _walk(schema: dict[str, Any], where: str = "") -> list[str]:
    """Paths of schema nodes that are not structural (no type, and no preserve flag)."""
    bad = [] if "type" in schema or schema.get("x-kubernetes-preserve-unknown-fields") else [where]
    for key, sub in (schema.get("properties") or {}).items():
        bad += _walk(sub, f"{where}.{key}")
    if isinstance(schema.get("items"), dict):
        bad += _walk(schema["items"], f"{where}[]")
    return bad


@pytest.mark.parametrize("kind", ["QuorumQueue", "Policy"])
def test_schemas_are_structural_with_status_subresource(kind: str) -> None:
    crd = m.crds()[kind]
    assert crd["spec"]["group"] == "quorumq.dev"
    [version] = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    assert not _walk(m.schema_of(kind))
    names = crd["spec"]["names"]
    assert names["shortNames"] and names["categories"] == ["quorumq"]
    # every printer column points at a field the schema has
    for col in version["additionalPrinterColumns"]:
        path = col["jsonPath"].split("[")[0].lstrip(".").split(".")
        if path[0] == "metadata":
            continue
        node = m.schema_of(kind)
        for part in path:
            node = node["properties"][part]
        assert node["type"], col


def _rules(schema: dict[str, Any], *path: str) -> list[str]:
    for part in path:
        schema = schema["properties"][part]
    return [r["rule"] for r in schema.get("x-kubernetes-validations", [])]


def test_immutable_fields_have_transition_rules_with_messages() -> None:
    qq = m.schema_of("QuorumQueue")
    assert "self == oldSelf" in _rules(qq, "spec", "vhost")
    assert "self == oldSelf" in _rules(qq, "spec", "arguments")
    assert any("self.name == oldSelf.name" in r for r in _rules(qq, "spec"))
    pol = m.schema_of("Policy")
    assert "self == oldSelf" in _rules(pol, "spec", "vhost")
    assert "self == oldSelf" in _rules(pol, "spec", "operatorPolicy")
    for schema in (qq, pol):
        for node in (schema["properties"]["spec"], *schema["properties"]["spec"]["properties"].values()):
            for rule in node.get("x-kubernetes-validations", []):
                assert rule.get("message"), rule
    # the arguments block is immutable as a whole, so it must always be present (defaulted)
    assert qq["properties"]["spec"]["properties"]["arguments"]["default"] == {}


def test_schema_keys_match_the_operator_tables() -> None:
    args = m.schema_of("QuorumQueue")["properties"]["spec"]["properties"]["arguments"]
    assert set(args["properties"]) == set(ARGUMENT_KEYS)
    definition = m.schema_of("Policy")["properties"]["spec"]["properties"]["definition"]
    assert set(definition["properties"]) == set(POLICY_KEYS)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_and_parse(path: Path) -> None:
    obj = yaml.safe_load(path.read_text())
    m.validate_cr(obj)
    (queue_desired if obj["kind"] == "QuorumQueue" else policy_desired)(obj)


@pytest.mark.parametrize("spec", [
    {"arguments": {"overflow": "reject-publish-dlx"}},
    {"arguments": {"maxLength": -1}},
    {"arguments": {"unknownKey": 1}},
    {"deletionPolicy": "keep"},
])
def test_schema_rejects_bad_queue_specs(spec: dict[str, Any]) -> None:
    obj = {"apiVersion": m.GROUP, "kind": "QuorumQueue", "metadata": {"name": "x"},
           "spec": {"broker": {"statefulSet": "qq"}, **spec}}
    schema = m.schema_of("QuorumQueue")
    # the API server prunes unknown fields; in jsonschema terms, refuse them
    args = schema["properties"]["spec"]["properties"]["arguments"]
    args["additionalProperties"] = False
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, schema)


def test_entry_point_arguments() -> None:
    assert kopf_args({}) == ["run", "-m", "quorumq_operator.handlers", "-A",
                             "--peering", "quorumq", "--liveness", "http://0.0.0.0:8081/healthz"]
    args = kopf_args({"QQ_OPERATOR_NAMESPACES": "a, b", "QQ_OPERATOR_PEERING": "standalone",
                      "QQ_OPERATOR_LIVENESS_PORT": "0"}, ["--verbose"])
    assert args == ["run", "-m", "quorumq_operator.handlers", "-n", "a", "-n", "b",
                    "--standalone", "--verbose"]
    assert kopf_args({"QQ_OPERATOR_PEERING_PRIORITY": "10"})[6:8] == ["--priority", "10"]

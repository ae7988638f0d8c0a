"""Kubernetes objects the operator tests write, and their validation.

kmock accepts anything, so every object a test writes is first validated:
custom resources with jsonschema against their CRD's openAPIV3Schema,
built-in kinds with kubernetes-validate (strict).
"""
from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"
GROUP = "quorumq.dev/v1alpha1"
K8S_VERSION = "1.30"


def crds() -> dict[str, dict[str, Any]]:
    """kind -> CRD document, for every CRD in crds/."""
    out = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                out[doc["spec"]["names"]["kind"]] = doc
    return out


def schema_of(kind: str) -> dict[str, Any]:
    crd = crds()[kind]
    [version] = [v for v in crd["spec"]["versions"] if v["storage"]]
    return dict(version["schema"]["openAPIV3Schema"])


def validate_cr(obj: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when `obj` breaks its CRD's schema."""
    jsonschema.validate(obj, schema_of(obj["kind"]))


def validate_status(obj: dict[str, Any]) -> None:
    """Validate only what the operator writes: the status, against the CRD's status schema."""
    jsonschema.validate(obj.get("status") or {}, schema_of(obj["kind"])["properties"]["status"])


def validate_builtin(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def validated(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["apiVersion"].startswith("quorumq.dev/"):
        validate_cr(obj)
    else:
        validate_builtin(obj)
    return obj


# ---------------------------------------------------------------- objects
def secret(name: str, ns: str, username: str = "guest", password: str = "guest") -> dict[str, Any]:
    enc = {k: base64.b64encode(v.encode()).decode() for k, v in
           (("username", username), ("password", password))}
    return validated({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                      "metadata": {"name": name, "namespace": ns}, "data": enc})


def stateful_set(name: str, ns: str, replicas: int, annotations: dict[str, str]) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "quorumq", "app.kubernetes.io/instance": name}
    return validated({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
        "spec": {
            "replicas": replicas, "serviceName": f"{name}-headless",
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{
                "name": "broker", "image": "quorumq-broker:test",
                "ports": [{"name": "amqp", "containerPort": 5672},
                          {"name": "management", "containerPort": 15672}]}]}}}})


def pod(sts: dict[str, Any], ordinal: int, ready: bool = True) -> dict[str, Any]:
    name = sts["metadata"]["name"]
    return validated({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{name}-{ordinal}", "namespace": sts["metadata"]["namespace"],
                     "labels": dict(sts["spec"]["selector"]["matchLabels"]),
                     "uid": str(uuid.uuid4()),
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                          "name": name, "uid": str(uuid.uuid4()),
                                          "controller": True}]},
        "spec": dict(sts["spec"]["template"]["spec"]),
        "status": pod_status(ready)})


def pod_status(ready: bool) -> dict[str, Any]:
    flag = "True" if ready else "False"
    return {"phase": "Running", "conditions": [
        {"type": "Ready", "status": flag}, {"type": "ContainersReady", "status": flag}]}


def quorum_queue(name: str, ns: str, spec: dict[str, Any] | None = None,
                 annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if annotations:
        meta["annotations"] = annotations
    return validated({"apiVersion": GROUP, "kind": "QuorumQueue", "metadata": meta,
                      "spec": {"broker": {"statefulSet": "qq"}, **(spec or {})}})


def policy(name: str, ns: str, spec: dict[str, Any]) -> dict[str, Any]:
    return validated({"apiVersion": GROUP, "kind": "Policy",
                      "metadata": {"name": name, "namespace": ns},
                      "spec": {"broker": {"statefulSet": "qq"}, **spec}})

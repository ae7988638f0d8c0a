"""The audit's Kubernetes manifests: the chart templates render (with the
real helm) only when audit.enabled, the plain manifests in spark/k8s/ are
the current rendering, built-in kinds pass kubernetes-validate --strict, and
the ScheduledSparkApplication has the fields the Spark operator requires."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.k8s.helm import helm

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "spark" / "k8s"
K8S_VERSION = "1.37.0"

# The Kubeflow Spark operator's required fields (v1beta2 CRD) and the ones
# this job depends on.
_STR = {"type": "string", "minLength": 1}
SPARK_APP_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "sparkoperator.k8s.io/v1beta2"},
        "kind": {"const": "ScheduledSparkApplication"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object", "required": ["schedule", "template"],
            "properties": {
                "schedule": _STR,
                "concurrencyPolicy": {"enum": ["Allow", "Forbid", "Replace"]},
                "template": {
                    "type": "object",
                    "required": ["type", "sparkVersion", "mode", "mainApplicationFile", "image",
                                 "driver", "executor", "arguments"],
                    "properties": {
                        "type": {"enum": ["Java", "Scala", "Python", "R"]},
                        "mode": {"enum": ["cluster", "client"]},
                        "sparkVersion": _STR, "image": _STR,
                        "mainApplicationFile": {"type": "string", "pattern": "^local://"},
                        "arguments": {"type": "array", "items": {"type": "string"}},
                        "driver": {"type": "object", "required": ["serviceAccount", "cores", "memory"]},
                        "executor": {"type": "object", "required": ["instances", "cores", "memory"]},
                    }}}}},
}


def load(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def test_plain_manifests_are_the_current_rendering() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("render", K8S / "render.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, text in mod.generate(helm()).items():
        assert (K8S / name).read_text() == text, f"spark/k8s/{name} is stale: run spark/k8s/render.py"


@pytest.mark.parametrize("name", ["audit-rbac.yaml", "audit-cronjob.yaml"])
def test_builtin_kinds_validate(name: str) -> None:
    docs = load(name)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_cronjob_runs_the_audit_over_the_api() -> None:
    (cj,) = load("audit-cronjob.yaml")
    c = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    args = c["args"]
    assert c["command"] == ["/opt/spark/bin/spark-submit"]
    assert args[args.index("--master") + 1].startswith("k8s://")
    main = args.index("local:///opt/quorumq/spark/audit.py")
    assert args[main + 1:main + 4] == [
        "--api", "http://quorumq-0.quorumq-nodes.quorumq.svc.cluster.local:15672", "--all-nodes"]
    sa = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in load("audit-rbac.yaml")}
    assert {("ServiceAccount", sa), ("Role", sa), ("RoleBinding", sa)} == kinds


def test_scheduled_spark_application_has_required_fields() -> None:
    (app,) = load("audit-scheduledsparkapplication.yaml")
    jsonschema.validate(app, SPARK_APP_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        broken = yaml.safe_load(yaml.safe_dump(app))
        del broken["spec"]["template"]["driver"]["serviceAccount"]
        jsonschema.validate(broken, SPARK_APP_SCHEMA)


def test_chart_templates_render_only_when_enabled() -> None:
    import subprocess

    def render(*args: str) -> list[dict[str, Any]]:
        out = subprocess.run([helm(), "template", "qq", str(ROOT / "charts" / "quorumq"),
                              "-n", "messaging", *args], check=True, capture_output=True,
                             text=True).stdout
        return [d for d in yaml.safe_load_all(out) if d]

    def audit_kinds(docs: list[dict[str, Any]]) -> set[str]:
        return {d["kind"] for d in docs if d["metadata"].get("labels", {}).get(
            "app.kubernetes.io/component") == "audit"}

    assert audit_kinds(render()) == set()
    values = ["-f", str(K8S / "values-audit.yaml"), "--set", "audit.enabled=true"]
    assert audit_kinds(render(*values)) == {"ServiceAccount", "Role", "RoleBinding", "CronJob"}
    both = render(*values, "--set", "audit.mode=both", "--set", "audit.failOn={pinned_bytes>1GiB}")
    assert "ScheduledSparkApplication" in audit_kinds(both)
    app = next(d for d in both if d["kind"] == "ScheduledSparkApplication")
    assert app["spec"]["template"]["arguments"][-2:] == ["--fail-on", "pinned_bytes>1GiB"]

"""The Helm chart, with the real helm binary: lint, render with default and
production-like values, every manifest validated (`kubernetes-validate
--strict` for built-in kinds, the CRDs' openAPIV3Schema for custom ones), the
values schema refusing bad values, and the rendered broker configuration
accepted by the broker's own parser."""
from __future__ import annotations

import base64
import filecmp
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from broker.common.config import load_config

from .helm import CHART, PRODUCTION_VALUES, ROOT, by_kind, one, render, run_helm

K8S_VERSION = "1.37.0"
VARIANTS = {"default": (), "production": ("-f", str(PRODUCTION_VALUES))}


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema for every CRD the chart ships."""
    out = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for v in crd["spec"]["versions"]:
                out[(f"{group}/{v['name']}", kind)] = v["schema"]["openAPIV3Schema"]
    return out


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(*VARIANTS[request.param])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint(variant: str) -> None:
    proc = run_helm("lint", "--strict", str(CHART), *VARIANTS[variant])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_manifest_validates(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    variant, docs = rendered
    custom = crd_schemas()
    checked = 0
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        if key in custom:
            jsonschema.validate(doc, custom[key])
        elif doc["apiVersion"].split("/")[0] in ("kopf.dev", "quorumq.dev"):
            # Only while crds/ has no CRD for it yet (the chart copies crds/).
            assert not any(doc["kind"] in p.read_text() for p in (ROOT / "crds").glob("*.yaml")), \
                f"{key}: CRD in crds/ but not in the chart: cp crds/*.yaml charts/quorumq/crds/"
            continue
        elif doc["apiVersion"].startswith("monitoring.coreos.com/"):
            # No Prometheus Operator CRD here: check the fields we rely on.
            assert doc["spec"]["endpoints"][0]["port"] == "prometheus"
            assert doc["spec"]["selector"]["matchLabels"]
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked += 1
    kinds = {d["kind"] for d in docs}
    assert {"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "Deployment",
            "ServiceAccount", "Role", "RoleBinding", "Pod", "KopfPeering"} <= kinds, (variant, kinds)
    if list((ROOT / "crds").glob("*.yaml")):
        assert "CustomResourceDefinition" in kinds
    assert checked == len([d for d in docs if d["apiVersion"].split("/")[0]
                           not in ("kopf.dev", "quorumq.dev") or
                           (d["apiVersion"], d["kind"]) in custom])


def test_broker_statefulset_is_what_a_quorum_needs(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    variant, docs = rendered
    sts = one(docs, "StatefulSet")
    spec = sts["spec"]
    headless = one(docs, "Service", "-nodes")
    assert spec["serviceName"] == headless["metadata"]["name"]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["replicas"] == (5 if variant == "production" else 3)
    assert spec["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Delete"
    assert spec["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    pod = spec["template"]["spec"]
    c = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["readinessProbe"]["httpGet"]["path"] == "/api/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/api/health/live"
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 600
    pre = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre[:3] == ["qqctl", "drain", "--if-leaving"]
    wait = int(pre[pre.index("--wait") + 1])
    assert wait < pod["terminationGracePeriodSeconds"], "preStop must give up before the kill"
    assert pod["affinity"]["podAntiAffinity"]
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert "secretKeyRef" in env["QQ__DEFAULT_PASS"]["valueFrom"]
    # the operator's contract: which Secret, how node names look
    ann = sts["metadata"]["annotations"]
    assert ann["quorumq.dev/credentials-secret"] == (
        "quorumq-credentials" if variant == "production" else "qq-quorumq")
    assert ann["quorumq.dev/node-name-template"] == \
        "rabbit@{pod}.{serviceName}.{namespace}.svc.cluster.local"
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]


def test_rbac_is_least_privilege(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    variant, docs = rendered
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    broker_role = one(docs, "Role", "-broker")
    assert broker_role["rules"] == [{"apiGroups": ["apps"], "resources": ["statefulsets"],
                                     "resourceNames": ["qq-quorumq"], "verbs": ["get"]}]
    operator_roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-operator")]
    namespaces = {r["metadata"]["namespace"] for r in operator_roles}
    assert namespaces == ({"messaging", "payments"} if variant == "production" else {"messaging"})
    for role in operator_roles:
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            assert "delete" not in rule["verbs"], rule
            if "secrets" in rule["resources"]:
                assert set(rule["verbs"]) <= {"get", "list", "watch"}
            if "statefulsets" in rule["resources"]:  # patch: kopf's finalizer for the timer
                assert set(rule["verbs"]) <= {"get", "list", "watch", "patch"}
    dep = one(docs, "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["QQ_OPERATOR_NAMESPACES"] == ",".join(sorted(namespaces))
    assert env["QQ_OPERATOR_PEERING"] == "qq-quorumq-operator"
    peerings = by_kind(docs, "KopfPeering")
    assert {p["metadata"]["namespace"] for p in peerings} == namespaces


def test_generated_secret_and_given_secret() -> None:
    docs = render()
    secret = one(docs, "Secret")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data["username"] == "admin"
    assert len(data["password"]) >= 24 and len(data["cluster-secret"]) >= 16
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not by_kind(render("--set", "auth.existingSecret=mine"), "Secret")
    given = one(render("--set", "auth.password=s3cret"), "Secret")
    assert base64.b64decode(given["data"]["password"]) == b"s3cret"


@pytest.mark.parametrize(("args", "complaint"), [
    (("--set", "replicas=0"), "replicas"),
    (("--set", "replicas=two"), "replicas"),
    (("--set", "podAntiAffinity=sometimes"), "podAntiAffinity"),
    (("--set", "config.queueLeaderLocator=random"), "queueLeaderLocator"),
    (("--set", "config.defaultQueueType=stream"), "defaultQueueType"),
    (("--set", "persistence.whenScaled=Keep"), "whenScaled"),
    (("--set", "auth.clusterSecret=short"), "clusterSecret"),
    (("--set", "ports.amqp=70000"), "amqp"),
    (("--set", "image.digest=latest"), "digest"),
    (("--set", "typo=1"), "typo"),
    (("--set", "operator.watchNamespaces[0]=Bad_NS"), "watchNamespaces"),
    (("--set", "replicas=2"), "initialReplicas"),  # the template's own check
])
def test_bad_values_are_refused(args: tuple[str, ...], complaint: str) -> None:
    proc = run_helm("template", "qq", str(CHART), *args)
    assert proc.returncode != 0, f"{args} accepted"
    assert complaint in proc.stderr, proc.stderr


def test_crds_in_the_chart_are_copies_of_crds() -> None:
    sources = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    copies = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert copies == sources, "run: cp crds/*.yaml charts/quorumq/crds/"
    for name in sources:
        assert filecmp.cmp(ROOT / "crds" / name, CHART / "crds" / name, shallow=False), \
            f"charts/quorumq/crds/{name} differs from crds/{name}: cp crds/*.yaml charts/quorumq/crds/"


def rendered_conf(*args: str) -> str:
    return one(render(*args), "ConfigMap", "-config")["data"]["quorumq.conf"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_config_is_accepted_by_the_broker(variant: str) -> None:
    conf = rendered_conf(*VARIANTS[variant])
    env = {"POD_NAME": "qq-quorumq-4", "POD_NAMESPACE": "messaging",
           "QQ__DEFAULT_USER": "admin", "QQ__DEFAULT_PASS": "pw"}
    cfg = load_config(conf, env, source="quorumq.conf")
    host = "qq-quorumq-{}.qq-quorumq-nodes.messaging.svc.cluster.local"
    assert cfg["node.name"] == "rabbit@" + host.format(4)
    assert cfg["cluster.initial_members"] == tuple("rabbit@" + host.format(i) for i in range(3))
    assert cfg["cluster.secret_file"] == "/etc/quorumq/secret/cluster-secret"
    assert cfg["node.data_dir"] == "/var/lib/quorumq"
    assert cfg["default_queue_type"] == "quorum"
    assert cfg["loopback_users"] == ()
    if variant == "production":
        assert cfg["raft.segment_max_entries"] == 8192


def test_statefulset_mounts_what_the_config_names() -> None:
    docs = render()
    sts = one(docs, "StatefulSet")
    c = sts["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    conf = one(docs, "ConfigMap", "-config")["data"]["quorumq.conf"]
    cfg = load_config(conf, {"POD_NAME": "qq-quorumq-0", "POD_NAMESPACE": "messaging"})
    assert str(Path(cfg["cluster.secret_file"]).parent) in mounts
    assert cfg["node.data_dir"] in mounts
    assert c["args"] == ["--config", "/etc/quorumq/quorumq.conf"]
    assert "/etc/quorumq/quorumq.conf" in mounts
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"amqp": cfg["listeners.tcp.default"], "management": cfg["management.tcp.port"],
                     "prometheus": cfg["prometheus.tcp.port"], "cluster": cfg["cluster.port"]}

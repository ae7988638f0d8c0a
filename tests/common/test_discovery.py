"""StatefulSet discovery: a pod's identity and peers from its ordinal."""
from __future__ import annotations

import pytest

from broker.common.config import ConfigError, load_config
from broker.common.discovery import ordinals, parse_pod_name

BASE = """
cluster.discovery = statefulset
cluster.statefulset.service = qq-headless
cluster.port = 25672
"""
ENV = {"POD_NAMESPACE": "prod"}


def host(i: int) -> str:
    return f"qq-{i}.qq-headless.prod.svc.cluster.local"


def test_founding_pod_takes_its_name_and_the_ordinals_below_initial_replicas() -> None:
    cfg = load_config(BASE, {**ENV, "HOSTNAME": "qq-1"})
    assert cfg["node.name"] == f"rabbit@{host(1)}"
    assert cfg["cluster.seeds"] == tuple(f"rabbit@{host(i)}:25672" for i in range(3))
    assert cfg["cluster.initial_members"] == tuple(f"rabbit@{host(i)}" for i in range(3))


def test_pod_added_later_is_not_an_initial_member_so_it_joins() -> None:
    cfg = load_config(BASE, {**ENV, "HOSTNAME": "qq-4"})
    assert cfg["node.name"] == f"rabbit@{host(4)}"
    assert cfg["node.name"] not in cfg["cluster.initial_members"]
    # it reaches the founders (and lists itself, which the cluster skips)
    assert cfg["cluster.seeds"][:3] == tuple(f"rabbit@{host(i)}:25672" for i in range(3))


def test_pod_name_wins_over_hostname_and_the_config_key_over_both() -> None:
    cfg = load_config(BASE, {**ENV, "HOSTNAME": "x-9", "POD_NAME": "qq-0"})
    assert cfg["node.name"] == f"rabbit@{host(0)}"
    cfg = load_config(BASE + "cluster.statefulset.pod_name = qq-2\n", {**ENV, "POD_NAME": "qq-0"})
    assert cfg["node.name"] == f"rabbit@{host(2)}"


def test_settings_are_configurable_and_env_overrides_apply() -> None:
    env = {**ENV, "HOSTNAME": "broker-0", "QQ__CLUSTER__STATEFULSET__INITIAL_REPLICAS": "5",
           "QQ__CLUSTER__STATEFULSET__DOMAIN": "corp.example",
           "QQ__CLUSTER__STATEFULSET__NODE_NAME_PREFIX": "qq"}
    cfg = load_config(BASE, env)
    assert cfg["node.name"] == "qq@broker-0.qq-headless.prod.svc.corp.example"
    assert len(cfg["cluster.initial_members"]) == 5


def test_host_template_puts_pods_on_loopback_addresses() -> None:
    env = {"HOSTNAME": "qq-2", "QQ__CLUSTER__STATEFULSET__HOST_TEMPLATE": "127.0.1.1{ordinal}"}
    cfg = load_config(BASE, env)
    assert cfg["node.name"] == "rabbit@127.0.1.12"
    assert cfg["cluster.seeds"] == ("rabbit@127.0.1.10:25672", "rabbit@127.0.1.11:25672",
                                    "rabbit@127.0.1.12:25672")


def test_explicit_settings_are_kept() -> None:
    cfg = load_config(BASE + "node.name = rabbit@fixed\n", {**ENV, "HOSTNAME": "qq-0"})
    assert cfg["node.name"] == "rabbit@fixed"
    assert len(cfg["cluster.seeds"]) == 3


def test_static_discovery_is_untouched() -> None:
    cfg = load_config("cluster.seeds.1 = rabbit@a:25672\n", {"HOSTNAME": "qq-0"})
    assert cfg["node.name"] == "rabbit@localhost"
    assert cfg["cluster.seeds"] == ("rabbit@a:25672",)


@pytest.mark.parametrize(("text", "env", "key"), [
    (BASE, {**ENV, "HOSTNAME": "laptop"}, "cluster.statefulset.pod_name"),
    (BASE, {**ENV}, "cluster.statefulset.pod_name"),
    ("cluster.discovery = statefulset\n", {**ENV, "HOSTNAME": "qq-0"}, "cluster.statefulset.service"),
    (BASE, {"HOSTNAME": "qq-0"}, "cluster.statefulset.namespace"),
    (BASE + "cluster.statefulset.host_template = 127.0.0.1\n", {"HOSTNAME": "qq-0"},
     "cluster.statefulset.host_template"),
    (BASE + "cluster.statefulset.host_template = {nope}\n", {"HOSTNAME": "qq-0"},
     "cluster.statefulset.host_template"),
    ("cluster.discovery = dns\n", {}, "cluster.discovery"),
])
def test_errors_name_the_key(text: str, env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(text, env)


def test_parse_pod_name() -> None:
    p = parse_pod_name("my-broker-12")
    assert (p.statefulset, p.ordinal) == ("my-broker", 12)


def test_ordinals_of_cluster_nodes() -> None:
    """What a drain uses to keep a scale-down's other leaving pods from
    receiving members: the ordinal of each node of this StatefulSet."""
    env = {**ENV, "HOSTNAME": "qq-1"}
    cfg = load_config(BASE, env)
    names = [f"rabbit@{host(i)}" for i in (0, 1, 4, 70)] + ["rabbit@elsewhere", "other@" + host(2)]
    assert ordinals(cfg, env, names) == {f"rabbit@{host(i)}": i for i in (0, 1, 4, 70)}
    plain = load_config("cluster.port = 25672\n", {})
    assert ordinals(plain, {}, names) == {}  # no StatefulSet discovery: no ordinals

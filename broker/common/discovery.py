"""Peer discovery for a node that is a pod of a Kubernetes StatefulSet.

Where it sits: `load_config` calls `resolve` after parsing the file and the
environment, when `cluster.discovery = statefulset`. It is pure: the pod's
name and namespace come from the environment mapping it is given (the chart
sets `POD_NAME` and `POD_NAMESPACE` with the downward API; `HOSTNAME` is the
pod name in a pod), and it only computes the settings the node already
understands:

    node.name               PREFIX@HOST(pod)   (rabbit@qq-1.qq-headless.ns.svc.cluster.local)
    cluster.seeds           HOST(i) for the ordinals 0..initial_replicas-1 (and this pod)
    cluster.initial_members the nodes of ordinals 0..initial_replicas-1

A StatefulSet pod `NAME-N` has the ordinal N and a stable DNS name
`NAME-N.SERVICE.NAMESPACE.svc.DOMAIN` through the headless service. The pods
with ordinals below `initial_replicas` form the cluster on the first start (a
quorum of them must start); a pod with a higher ordinal (a scale-up) is not
an initial member, so with an empty data directory it joins the running
cluster through the seeds; any pod restarting with its data rejoins as itself.

`cluster.statefulset.host_template` makes the host name configurable
(placeholders `{pod}`, `{statefulset}`, `{ordinal}`, `{service}`,
`{namespace}`, `{domain}`): the tests put each pod on its own loopback
address with `127.0.1.1{ordinal}`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .config import ConfigError

DEFAULT_HOST_TEMPLATE = "{pod}.{service}.{namespace}.svc.{domain}"
_POD = re.compile(r"^(?P<set>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-(?P<ordinal>\d+)$")


class DiscoveryError(ConfigError):
    """The pod's identity cannot be worked out; the message names the key."""


@dataclass(frozen=True, slots=True)
class PodIdentity:
    pod: str
    statefulset: str
    ordinal: int


def parse_pod_name(pod: str) -> PodIdentity:
    """`qq-2` -> (pod qq-2, StatefulSet qq, ordinal 2)."""
    m = _POD.match(pod.strip())
    if m is None:
        raise DiscoveryError(f"cluster.statefulset.pod_name: {pod!r} is not a StatefulSet pod "
                             "name NAME-ORDINAL (set POD_NAME from metadata.name)")
    return PodIdentity(pod.strip(), m.group("set"), int(m.group("ordinal")))


def pod_name_from(values: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    return (values["cluster.statefulset.pod_name"] or environ.get("POD_NAME")
            or environ.get("HOSTNAME") or "")


def host_for(values: Mapping[str, Any], statefulset: str, ordinal: int, namespace: str) -> str:
    template = values["cluster.statefulset.host_template"] or DEFAULT_HOST_TEMPLATE
    try:
        return template.format(pod=f"{statefulset}-{ordinal}", statefulset=statefulset,
                               ordinal=ordinal, service=values["cluster.statefulset.service"],
                               namespace=namespace, domain=values["cluster.statefulset.domain"])
    except (KeyError, IndexError, ValueError) as exc:
        raise DiscoveryError(f"cluster.statefulset.host_template: {template!r}: bad placeholder "
                             f"{exc}") from None


def node_name_for(values: Mapping[str, Any], statefulset: str, ordinal: int, namespace: str) -> str:
    """The node name of the pod with this ordinal (`PREFIX@HOST`)."""
    return f"{values['cluster.statefulset.node_name_prefix']}@{host_for(values, statefulset, ordinal, namespace)}"


def ordinals(values: Mapping[str, Any], environ: Mapping[str, str],
             names: Iterable[str]) -> dict[str, int]:
    """The StatefulSet ordinal of each of `names` that is a node of this
    node's StatefulSet (the names `resolve` gives its pods); empty unless
    `cluster.discovery = statefulset`. Used to keep a scale-down's leaving
    pods (ordinals at or above the desired replicas) from receiving members."""
    if values["cluster.discovery"] != "statefulset":
        return {}
    statefulset = parse_pod_name(pod_name_from(values, environ)).statefulset
    namespace = values["cluster.statefulset.namespace"] or environ.get("POD_NAMESPACE", "")
    wanted = set(names)
    out: dict[str, int] = {}
    for ordinal in range(1024):  # a bound far above any broker StatefulSet
        name = node_name_for(values, statefulset, ordinal, namespace)
        if name in wanted:
            out[name] = ordinal
            if len(out) == len(wanted):
                break
    return out


def resolve(values: Mapping[str, Any], environ: Mapping[str, str],
            explicit: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The settings with `node.name`, `cluster.seeds` and `cluster.initial_members`
    computed from the pod's identity. Keys in `explicit` (given in the file or
    the environment) are kept as given."""
    out = dict(values)
    if values["cluster.discovery"] != "statefulset":
        return out
    ident = parse_pod_name(pod_name_from(values, environ))
    service = values["cluster.statefulset.service"]
    if not service:
        raise DiscoveryError("cluster.statefulset.service: required with cluster.discovery = "
                             "statefulset (the StatefulSet's headless service)")
    template = values["cluster.statefulset.host_template"] or DEFAULT_HOST_TEMPLATE
    namespace = values["cluster.statefulset.namespace"] or environ.get("POD_NAMESPACE", "")
    if not namespace and "{namespace}" in template:
        raise DiscoveryError("cluster.statefulset.namespace: required (or POD_NAMESPACE from "
                             "metadata.namespace)")
    initial = values["cluster.statefulset.initial_replicas"]
    port = values["cluster.port"]

    def name(ordinal: int) -> str:
        return node_name_for(values, ident.statefulset, ordinal, namespace)

    me = name(ident.ordinal)
    founders = [name(i) for i in range(initial)]
    if len({*founders, me}) != len(founders) + (me not in founders):
        raise DiscoveryError(f"cluster.statefulset.host_template: {template!r} gives two pods "
                             "the same host name (use {pod} or {ordinal})")
    if "node.name" not in explicit:
        out["node.name"] = me
    if "cluster.seeds" not in explicit:
        seeds = founders if me in founders else [*founders, me]
        out["cluster.seeds"] = tuple(f"{n}:{port}" for n in seeds)
    if "cluster.initial_members" not in explicit:
        out["cluster.initial_members"] = tuple(founders)
    return out

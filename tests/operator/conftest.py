"""Fixtures for the operator's end-to-end tests.

Only the Kubernetes API is a stand-in: `KubeApi` runs kmock's
KubernetesEmulator on its own thread and event loop (kopf runs on another,
inside `KopfRunner`), reached over real HTTP like a real API server. Behind
it, `OpCluster` runs real broker processes with their management APIs on.

kmock quirks handled here: the namespace and every resource kopf touches are
declared up front (kopf waits for them otherwise); objects get a
`metadata.resourceVersion` (bumped on every write), a `uid`, and a name when
they only carry `generateName` (kopf's Events do); kmock does not validate
against CRD schemas, so tests validate what they write and what the
operator writes with jsonschema (tests/operator/schemas.py).
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import multiprocessing
import os
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
from kmock._internal import enums

from tests.e2e.broker_proc import BrokerProcess, free_port, start_all

# The handlers read their intervals at import: fast timers for tests, set before any import.
os.environ.setdefault("QQ_OPERATOR_RESYNC_SECONDS", "1")
os.environ.setdefault("QQ_OPERATOR_CLUSTER_INTERVAL_SECONDS", "1")
os.environ.setdefault("QQ_OPERATOR_RETRY_SECONDS", "1")

NS = "messaging"
GROUP = "quorumq.dev/v1alpha1"
CRD_DIR = Path(__file__).resolve().parents[2] / "crds"


def wait_for(cond: Callable[[], Any], timeout: float = 30.0, what: str = "condition",
             interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = cond()
        except AssertionError as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


class _Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus what kopf expects of a real API server on writes."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._rv = itertools.count(100)
        self._names = itertools.count(1)
        #: what kopf asked for: (verb, apiGroup, resource[/subresource], namespace),
        #: checked against the chart's RBAC (tests/operator/rbac.py)
        self.kopf_requests: set[tuple[str, str, str, str | None]] = set()

    def _record(self, request: Any) -> None:
        if (not str(request.headers.get("User-Agent", "")).startswith("kopf/")
                or request.resource is None or not request.resource.plural):
            return  # not kopf, or API discovery (allowed to every authenticated user)
        method = str(getattr(request.method, "value", request.method)).upper()
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
        if verb is None:
            verb = {enums.action.LIST: "list", enums.action.WATCH: "watch"}.get(request.action, "get")
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        self.kopf_requests.add((verb, request.resource.group or "", resource, request.namespace))

    async def _handle(self, request: Any) -> Any:
        self._record(request)
        if request.resource is not None and isinstance(request.data, dict) and request.action in (
                enums.action.CREATE, enums.action.UPDATE):
            meta = request.data.setdefault("metadata", {})
            meta["resourceVersion"] = str(next(self._rv))
            if request.action == enums.action.CREATE:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("generation", 1)
                meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = f"{meta['generateName']}{next(self._names)}"
        return await super()._handle(request)


class KubeApi:
    """The stand-in Kubernetes API on a thread of its own, with a tiny sync client."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True, name="kmock")
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("kmock did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with _Emulator() as k, kmock.Server(k) as srv:
            self.k = k
            self.url = str(srv.url).rstrip("/")
            info = kmock.ResourceInfo
            all_verbs = {"list", "watch", "get", "create", "patch", "update", "delete"}
            k.resources["v1/namespaces"] = info(kind="Namespace", singular="namespace",
                                                namespaced=False, verbs=all_verbs)
            k.resources["v1/events"] = info(kind="Event", singular="event", namespaced=True,
                                            verbs=all_verbs)
            k.resources["v1/secrets"] = info(kind="Secret", singular="secret", namespaced=True,
                                             verbs=all_verbs)
            k.resources["v1/configmaps"] = info(kind="ConfigMap", singular="configmap",
                                                namespaced=True, verbs=all_verbs)
            k.resources["v1/pods"] = info(kind="Pod", singular="pod", namespaced=True,
                                          verbs=all_verbs, subresources={"status"})
            k.resources["apps/v1/statefulsets"] = info(kind="StatefulSet", singular="statefulset",
                                                       namespaced=True, verbs=all_verbs,
                                                       subresources={"status", "scale"})
            k.resources[f"{GROUP}/quorumqueues"] = info(
                kind="QuorumQueue", singular="quorumqueue", namespaced=True, verbs=all_verbs,
                shortnames={"qq", "qqs"}, categories={"quorumq"}, subresources={"status"})
            k.resources[f"{GROUP}/policies"] = info(
                kind="Policy", singular="policy", namespaced=True, verbs=all_verbs,
                shortnames={"qqpol"}, categories={"quorumq"}, subresources={"status"})
            # kopf's peering objects (crds/kopf-peering.yaml)
            k.resources["kopf.dev/v1/kopfpeerings"] = info(
                kind="KopfPeering", singular="kopfpeering", namespaced=True, verbs=all_verbs)
            k.resources["kopf.dev/v1/clusterkopfpeerings"] = info(
                kind="ClusterKopfPeering", singular="clusterkopfpeering", namespaced=False,
                verbs=all_verbs)
            k.objects["v1/namespaces", None, NS] = {
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": NS, "resourceVersion": "1", "uid": str(uuid.uuid4())}}
            self._ready.set()
            await self._stop.wait()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def kopf_requests(self) -> set[tuple[str, str, str, str | None]]:
        """Every (verb, apiGroup, resource, namespace) kopf has requested so far."""
        return set(self.k.kopf_requests)

    # ------------------------------------------------------------ client
    @staticmethod
    def path(api_version: str, plural: str, name: str | None = None, ns: str | None = NS) -> str:
        base = f"/api/{api_version}" if api_version == "v1" else f"/apis/{api_version}"
        if ns is not None:
            base += f"/namespaces/{ns}"
        return f"{base}/{plural}" + (f"/{name}" if name else "")

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/merge-patch+json" if method == "PATCH"
                       else "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:  # a loaded machine is slow
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        plural = PLURALS[obj["kind"]]
        status, out = self.call("POST", self.path(obj["apiVersion"], plural), obj)
        assert status in (200, 201), (status, out)
        return dict(out)

    def get(self, api_version: str, plural: str, name: str) -> dict[str, Any] | None:
        status, out = self.call("GET", self.path(api_version, plural, name))
        return dict(out) if status == 200 else None

    def patch(self, api_version: str, plural: str, name: str, body: dict[str, Any]) -> None:
        status, out = self.call("PATCH", self.path(api_version, plural, name), body)
        assert status == 200, (status, out)

    def delete(self, api_version: str, plural: str, name: str) -> None:
        status, out = self.call("DELETE", self.path(api_version, plural, name))
        assert status == 200, (status, out)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        status, out = self.call("GET", self.path("v1", "events"))
        assert status == 200, out
        return [e for e in out["items"]
                if name is None or e.get("involvedObject", {}).get("name") == name]


def _serve_in_process(conn: Any) -> None:
    api = KubeApi()
    conn.send(api.url)
    try:
        while conn.recv() == "kopf_requests":  # anything else (or EOF): stop
            conn.send(api.kopf_requests())
    except EOFError:
        pass
    api.close()


class KubeApiProcess(KubeApi):
    """The same stand-in API in a process of its own: a test process busy with
    client threads and kopf must not starve the API server (a real one does not
    share a GIL with its clients)."""

    def __init__(self) -> None:  # no thread here: the child process runs KubeApi
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_in_process, args=(child,), daemon=True,
                                 name="kmock")
        self._proc.start()
        child.close()
        if not self._conn.poll(60):
            self._proc.kill()
            raise RuntimeError("kmock did not start")
        self.url = str(self._conn.recv())

    def kopf_requests(self) -> set[tuple[str, str, str, str | None]]:
        self._conn.send("kopf_requests")
        return set(self._conn.recv())

    def close(self) -> None:
        try:
            self._conn.send("stop")
        except OSError:
            pass
        self._proc.join(15)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)


PLURALS = {"Secret": "secrets", "ConfigMap": "configmaps", "Pod": "pods",
           "StatefulSet": "statefulsets",
           "QuorumQueue": "quorumqueues", "Policy": "policies", "Event": "events",
           "KopfPeering": "kopfpeerings"}


class BrokerApi:
    """A synchronous client for one broker node's management API (test side)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        req.add_header("Content-Type", "application/json")
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                text = resp.read()
                return resp.status, json.loads(text) if text.strip() else None
        except urllib.error.HTTPError as exc:
            text = exc.read()
            return exc.code, json.loads(text) if text.strip() else None

    def queue(self, name: str, vhost: str = "%2F") -> dict[str, Any] | None:
        status, out = self.call("GET", f"/api/queues/{vhost}/{name}")
        return out if status == 200 else None


class OpCluster:
    """Three real broker nodes named like StatefulSet pods (rabbit-<ordinal>@127.0.0.1),
    management API on; a fourth can join later (scale-up)."""

    def __init__(self, base: Path, size: int = 3) -> None:
        base.mkdir(parents=True, exist_ok=True)
        self.base = base
        self.secret = base / "secret"
        self.secret.write_text("operator-test-cluster-secret-0123456789\n")
        self.cports = [free_port() for _ in range(size)]
        self.names = [f"rabbit-{i}@127.0.0.1" for i in range(size)]
        self.nodes = [self._node(i, size) for i in range(size)]
        self.apis = [BrokerApi(n.management_port) for n in self.nodes]

    def _seeds(self, count: int) -> str:
        return "".join(f"cluster.seeds.{i + 1} = {self.names[i]}:{self.cports[i]}\n"
                       for i in range(count))

    def _node(self, i: int, seeds: int, extra: str = "") -> BrokerProcess:
        return BrokerProcess(
            self.base / f"n{i}", name=self.names[i], management_port=free_port(), config=(
                f"cluster.port = {self.cports[i]}\ncluster.bind = 127.0.0.1\n"
                f"cluster.secret_file = {self.secret}\n" + self._seeds(seeds) + extra))

    def start(self) -> OpCluster:
        start_all(self.nodes)
        return self

    def add_node(self) -> BrokerProcess:
        """Start one more node that joins the running cluster (not an initial member)."""
        i = len(self.nodes)
        self.names.append(f"rabbit-{i}@127.0.0.1")
        self.cports.append(free_port())
        initial = "".join(f"cluster.initial_members.{k + 1} = {self.names[k]}\n" for k in range(3))
        n = self._node(i, i + 1, initial)
        self.nodes.append(n)
        self.apis.append(BrokerApi(n.management_port))
        n.start(timeout=120)
        return n

    def kill_all(self) -> None:
        for n in self.nodes:
            n.kill()


def install_broker_statefulset(kube: KubeApi, brokers: OpCluster,
                               extra: dict[str, str] | None = None) -> dict[str, Any]:
    """The broker StatefulSet `qq` (3 pods, Ready), its credentials Secret, and
    the annotations that point the operator at `brokers`' management API."""
    from . import manifests as m

    kube.create(m.secret("qq-creds", NS))
    sts = m.stateful_set("qq", NS, 3, {
        "quorumq.dev/credentials-secret": "qq-creds",
        "quorumq.dev/management-host": "127.0.0.1",
        "quorumq.dev/management-port": str(brokers.nodes[0].management_port),
        "quorumq.dev/node-name-template": "rabbit-{ordinal}@127.0.0.1",
        **(extra or {}),
    })
    kube.create(sts)
    for i in range(3):
        kube.create(m.pod(sts, i))
    return sts


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeApi]:
    api = KubeApi()
    yield api
    api.close()


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpCluster]:
    c = OpCluster(tmp_path_factory.mktemp("op-brokers")).start()
    yield c
    c.kill_all()

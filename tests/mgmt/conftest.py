"""A real 3-node cluster with the management API and metrics listeners on."""
from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import Cluster
from tests.e2e.broker_proc import BrokerProcess, free_port

ROOT_DIR = Path(__file__).resolve().parents[2]


class Api:
    """A tiny synchronous client for one node's management API."""

    def __init__(self, port: int, user: str = "guest", password: str = "guest") -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.port = port
        self.user, self.password = user, password

    def as_user(self, user: str, password: str) -> Api:
        return Api(self.port, user, password)

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None,
             auth: bool = True, timeout: float = 60,
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if auth:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        for k, val in (headers or {}).items():
            req.add_header(k, val)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, text = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read()
        if not text:
            return status, None
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text.decode()

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.call("GET", path, **kw)

    def put(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.call("PUT", path, body, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.call("POST", path, body, **kw)

    def delete(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.call("DELETE", path, **kw)


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in a Prometheus text exposition, None if absent."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric_name, _, label_text = head.partition("{")
        if metric_name != name:
            continue
        found = dict(part.split("=", 1) for part in label_text.rstrip("}").split(",") if part)
        found = {k: v.strip('"') for k, v in found.items()}
        if all(found.get(k) == v for k, v in labels.items()):
            return float(value)
    return None


class MgmtCluster(Cluster):
    def __init__(self, base: Path, extra: str = "") -> None:
        super().__init__(base, extra=extra)
        for n in self.nodes:
            n.management_port = free_port()
            n.metrics_port = free_port()
        self.apis = [Api(n.management_port) for n in self.nodes]

    def node(self, i: int) -> BrokerProcess:
        return self.nodes[i]


@pytest.fixture(scope="module")
def mgmt_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MgmtCluster]:
    c = MgmtCluster(tmp_path_factory.mktemp("mgmt"))
    c.start()
    yield c
    c.kill_all()


DEFINITIONS = {
    "vhosts": [{"name": "/"}, {"name": "other"}],
    "users": [
        {"name": "guest", "password": "guest", "tags": ["administrator"]},
        {"name": "monitor", "password": "pw", "tags": ["monitoring"]},
        {"name": "mgr", "password": "pw", "tags": ["management"]},
        {"name": "pm", "password": "pw", "tags": ["policymaker"]},
        {"name": "plain", "password": "pw", "tags": []},
    ],
    "permissions": [
        {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "guest", "vhost": "other", "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "mgr", "vhost": "/", "configure": "^mgr-", "write": ".*", "read": ".*"},
        {"user": "pm", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "plain", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
    ],
}


@pytest.fixture(scope="module")
def defs_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MgmtCluster]:
    """The cluster, created from DEFINITIONS (users with each management tag)."""
    base = tmp_path_factory.mktemp("mgmt-defs")
    path = base / "definitions.json"
    path.write_text(json.dumps(DEFINITIONS))
    c = MgmtCluster(base / "c", extra=f"load_definitions = {path}\nloopback_users = none\n")
    c.start()
    yield c
    c.kill_all()

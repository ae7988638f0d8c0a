"""Fixtures for end-to-end tests against real broker processes (and, for
compatibility tests, a real RabbitMQ node on its own ports)."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import rabbitmq_local

from .broker_proc import BrokerProcess, free_port, rabbitmq_port_pair


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One single-node broker per test module (tests use their own queue names)."""
    b = BrokerProcess(tmp_path_factory.mktemp("broker") / "node").start()
    yield b
    b.stop()


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker of the test's own (for restarts, kills, custom config)."""
    b = BrokerProcess(tmp_path / "node")
    yield b
    b.kill()


@pytest.fixture(scope="session")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """Port of a real RabbitMQ node, for compatibility tests. `make test`
    installs rabbitmq-server (Debian) when it runs as root; elsewhere these
    tests are skipped with this reason."""
    if not rabbitmq_local.installed():
        pytest.skip("rabbitmq-server is not installed (make test installs it when run as root)")
    port = free_port()
    node = rabbitmq_local.start_node(tmp_path_factory.mktemp("rabbitmq"), port,
                                     f"qqtest{os.getpid()}@localhost")
    yield port
    node.stop()


# ------------------------------------------------------------ definitions-loaded brokers
# (connection/auth/hostile/client tests: the same users, vhosts and permissions
# loaded through `load_definitions` into our broker and into RabbitMQ)
def definitions_document() -> dict[str, object]:
    """RabbitMQ's export format. alice has narrow permissions on '/', bob a
    password_hash (sha256), carol a sha512 hash and access to 'v2' only."""
    from broker.metadata import hash_password

    return {
        "rabbit_version": "3.10.8",
        "users": [
            {"name": "guest", "password": "guest", "tags": ["administrator"]},
            {"name": "alice", "password": "alicepw", "tags": []},
            {"name": "bob", "password_hash": hash_password("bobpw", b"\x01\x02\x03\x04"),
             "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": "management"},
            {"name": "carol",
             "password_hash": hash_password("carolpw", b"\x09\x08\x07\x06",
                                            "rabbit_password_hashing_sha512"),
             "hashing_algorithm": "rabbit_password_hashing_sha512", "tags": []},
        ],
        "vhosts": [{"name": "/"}, {"name": "v2"}],
        "permissions": [
            {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
            {"user": "alice", "vhost": "/", "configure": "^alice-",
             "write": "^(alice-|amq\\.default$)", "read": "^alice-"},
            {"user": "bob", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
            {"user": "bob", "vhost": "v2", "configure": ".*", "write": ".*", "read": ".*"},
            {"user": "carol", "vhost": "v2", "configure": ".*", "write": ".*", "read": ".*"},
        ],
        "policies": [{"vhost": "/", "name": "defs-lim", "pattern": "^defs-lim$", "apply-to": "queues",
                      "definition": {"max-length": 3}, "priority": 0}],
        "queues": [
            {"name": "defs-qq", "vhost": "/", "durable": True, "auto_delete": False,
             "arguments": {"x-queue-type": "quorum"}},
            {"name": "defs-lim", "vhost": "/", "durable": True, "auto_delete": False,
             "arguments": {"x-queue-type": "quorum"}},
        ],
        "exchanges": [{"name": "defs-x", "vhost": "/", "type": "direct", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {}}],
        "bindings": [{"source": "defs-x", "vhost": "/", "destination": "defs-qq",
                      "destination_type": "queue", "routing_key": "k", "arguments": {}}],
    }


# carol may only log in over loopback (both brokers); guest stays loopback-only.
DEFS_CONFIG = "loopback_users.guest = true\nloopback_users.carol = true\n"


def _public_dir() -> Path:
    # RabbitMQ runs as the `rabbitmq` user under root: it cannot enter pytest's
    # 0700 tmp directories, so these live in a world-readable mkdtemp.
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="qq-defs-"))
    base.chmod(0o755)
    return base


@pytest.fixture(scope="session")
def definitions_path() -> Iterator[Path]:
    import json
    import shutil

    base = _public_dir()
    path = base / "definitions.json"
    path.write_text(json.dumps(definitions_document(), indent=1))
    path.chmod(0o644)
    yield path
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def defs_broker(tmp_path_factory: pytest.TempPathFactory, definitions_path: Path) -> Iterator[BrokerProcess]:
    """Our broker, fresh, with `load_definitions`, listening on every interface
    (so a non-loopback local address reaches it: the loopback_users tests)."""
    b = DefsBrokerProcess(tmp_path_factory.mktemp("defs-broker") / "node",
                          config=f"load_definitions = {definitions_path}\n" + DEFS_CONFIG).start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def rabbitmq_defs(definitions_path: Path) -> Iterator[int]:
    """A RabbitMQ 3.10 node booted with the same definitions and loopback users."""
    import shutil

    if not rabbitmq_local.installed():
        pytest.skip("rabbitmq-server is not installed (make test installs it when run as root)")
    base = _public_dir()
    port = rabbitmq_port_pair()
    node = rabbitmq_local.RabbitNode(f"qqdefs{os.getpid()}@localhost", port, base / "node")
    node.base.mkdir()
    shutil.copy(definitions_path, node.base / "definitions.json")
    node.start(f"load_definitions = {node.base / 'definitions.json'}\n" + DEFS_CONFIG)
    yield port
    node.stop()
    shutil.rmtree(base, ignore_errors=True)


class DefsBrokerProcess(BrokerProcess):
    @property
    def config_text(self) -> str:
        return super().config_text.replace("listeners.tcp.bind = 127.0.0.1", "listeners.tcp.bind = 0.0.0.0")

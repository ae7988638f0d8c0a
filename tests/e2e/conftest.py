"""Fixtures for end-to-end tests against real broker processes (and, for
compatibility tests, a real RabbitMQ node on its own ports)."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import rabbitmq_local

from .broker_proc import BrokerProcess, free_port


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

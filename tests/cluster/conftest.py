"""A real 3-node cluster of broker processes on loopback (distinct ports)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.broker_proc import BrokerProcess, free_port, start_all


class Cluster:
    def __init__(self, base: Path, size: int = 3, extra: str = "") -> None:
        base.mkdir(parents=True, exist_ok=True)
        secret = base / "secret"
        secret.write_text("test-cluster-secret-0123456789\n")
        cports = [free_port() for _ in range(size)]
        self.names = [f"rabbit-{i + 1}@127.0.0.1" for i in range(size)]
        seeds = "".join(f"cluster.seeds.{i + 1} = {n}:{p}\n"
                        for i, (n, p) in enumerate(zip(self.names, cports, strict=True)))
        self.nodes = [
            BrokerProcess(base / f"n{i + 1}", name=self.names[i], config=(
                f"cluster.port = {cports[i]}\ncluster.bind = 127.0.0.1\n"
                f"cluster.secret_file = {secret}\n" + seeds + extra))
            for i in range(size)
        ]

    def start(self) -> Cluster:
        start_all(self.nodes)
        return self

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def kill_all(self) -> None:
        for n in self.nodes:
            n.kill()


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path).start()
    yield c
    c.kill_all()

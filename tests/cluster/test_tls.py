"""Peers can talk over mutual TLS (certificates from a test CA); a peer with a
certificate from another CA is refused."""
from __future__ import annotations

from pathlib import Path

import pika
import pytest

from tests.pki import make_ca, make_signed

from .conftest import Cluster

pytestmark = pytest.mark.slow


def _ca(d: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA named `name` and a node certificate for 127.0.0.1 it signs:
    (certificate, key, CA certificate)."""
    ca, _ = make_ca(d, name)
    cert, key = make_signed(d, "node", name, "IP:127.0.0.1")
    return cert, key, ca


def test_cluster_over_mutual_tls(tmp_path: Path) -> None:
    cert, key, ca = _ca(tmp_path / "pki", "qq-test-ca")
    tls = f"cluster.tls.certfile = {cert}\ncluster.tls.keyfile = {key}\ncluster.tls.cafile = {ca}\n"
    c = Cluster(tmp_path / "c", extra=tls).start()
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", c.nodes[0].port))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("tls", durable=True, arguments={"x-queue-type": "quorum"})
        ch.basic_publish("", "tls", b"over tls")
        conn.close()
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", c.nodes[2].port))
        method, _p, body = conn.channel().basic_get("tls", auto_ack=True)
        assert body == b"over tls"
        conn.close()
    finally:
        c.kill_all()


def test_peer_with_foreign_certificate_cannot_form_a_quorum(tmp_path: Path) -> None:
    cert, key, ca = _ca(tmp_path / "pki", "qq-test-ca")
    bad_cert, bad_key, _ = _ca(tmp_path / "rogue", "rogue-ca")
    c = Cluster(tmp_path / "c", extra="cluster.formation_timeout_ms = 4000\n")
    for i, n in enumerate(c.nodes):
        use_cert, use_key = (bad_cert, bad_key) if i > 0 else (cert, key)
        n.extra_config += (f"cluster.tls.certfile = {use_cert}\ncluster.tls.keyfile = {use_key}\n"
                           f"cluster.tls.cafile = {ca}\n")
    try:
        with pytest.raises(RuntimeError) as err:
            c.start()  # all three at once: node 0 cannot verify the others, nor they it
        assert "did not become ready" in str(err.value)
        logs = "".join(n.log() for n in c.nodes)
        assert "certificate verify failed" in logs or "CERTIFICATE_VERIFY_FAILED" in logs, logs[-3000:]
    finally:
        c.kill_all()

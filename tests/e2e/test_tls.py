"""TLS for AMQP, the management API and metrics (issue 15), with RabbitMQ's
configuration names and certificates made at test time (openssl).

The broker runs TLS only (`listeners.tcp = none`), verifies clients
(`ssl_options.verify = verify_peer`, `fail_if_no_peer_cert = true`) and serves
the management API and metrics over HTTPS. pika and aio-pika publish and
consume over TLS with a client certificate; a client that does not trust the
server's CA, and one without a certificate, are refused; bad certificate
settings stop start-up with a message naming the key.
"""
from __future__ import annotations

import asyncio
import json
import socket
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pika
import pytest
from pika.exceptions import AMQPConnectionError

from tests.pki import make_ca, make_signed

from .broker_proc import BrokerProcess, free_port


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_signed(d, "server", "ca", "IP:127.0.0.1,DNS:localhost")
    make_signed(d, "client", "ca", "DNS:client")
    return d


@pytest.fixture(scope="module")
def tls_broker(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("tls") / "node", config=(
        "listeners.tcp = none\n"
        f"listeners.ssl.default = {free_port()}\nlisteners.ssl.bind = 127.0.0.1\n"
        f"ssl_options.cacertfile = {certs / 'ca.pem'}\n"
        f"ssl_options.certfile = {certs / 'server.pem'}\n"
        f"ssl_options.keyfile = {certs / 'server.key'}\n"
        "ssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true\n"
        f"management.ssl.port = {free_port()}\nmanagement.ssl.bind = 127.0.0.1\n"
        f"management.ssl.certfile = {certs / 'server.pem'}\n"
        f"management.ssl.keyfile = {certs / 'server.key'}\n"
        f"prometheus.ssl.port = {free_port()}\nprometheus.ssl.bind = 127.0.0.1\n"
        f"prometheus.ssl.certfile = {certs / 'server.pem'}\n"
        f"prometheus.ssl.keyfile = {certs / 'server.key'}\n"))
    b.start()
    yield b
    b.kill()


def _setting(b: BrokerProcess, key: str) -> int:
    for line in b.config_text.splitlines():
        k, _, v = line.partition("=")
        if k.strip() == key:
            return int(v)
    raise KeyError(key)


def _client_ctx(certs: Path, ca: str = "ca", cert: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs / f"{ca}.pem"))
    if cert:
        ctx.load_cert_chain(str(certs / "client.pem"), str(certs / "client.key"))
    return ctx


def _pika(b: BrokerProcess, ctx: ssl.SSLContext, name: str = "tls") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", _setting(b, "listeners.ssl.default"),
        ssl_options=pika.SSLOptions(ctx, "127.0.0.1"),
        client_properties={"connection_name": name}))


def test_pika_publishes_and_consumes_over_tls(tls_broker: BrokerProcess, certs: Path) -> None:
    conn = _pika(tls_broker, _client_ctx(certs), "tls-pika")
    ch = conn.channel()
    ch.queue_declare("tls-q", durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", "tls-q", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    got = []
    for _ in range(10):
        method, _props, body = ch.basic_get("tls-q", auto_ack=True)
        got.append(body)
    assert got == [b"m%d" % i for i in range(10)]
    # the management API, over HTTPS, shows the connection as TLS
    api = f"https://127.0.0.1:{_setting(tls_broker, 'management.ssl.port')}"
    req = urllib.request.Request(api + "/api/connections",
                                 headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})  # guest:guest
    with urllib.request.urlopen(req, context=_client_ctx(certs, cert=False), timeout=10) as resp:
        conns = json.loads(resp.read())
    mine = [c for c in conns if c["client_properties"].get("connection_name") == "tls-pika"]
    assert len(mine) == 1 and mine[0]["ssl"] is True
    conn.close()


def test_aio_pika_over_tls(tls_broker: BrokerProcess, certs: Path) -> None:
    async def run() -> bytes:
        conn = await aio_pika.connect(
            host="127.0.0.1", port=_setting(tls_broker, "listeners.ssl.default"), ssl=True,
            ssl_context=_client_ctx(certs))
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue("tls-aio", durable=True, arguments={"x-queue-type": "quorum"})
            await ch.default_exchange.publish(aio_pika.Message(b"over tls"), routing_key="tls-aio")
            msg = await q.get(timeout=10)
            await msg.ack()
            return msg.body
    assert asyncio.run(run()) == b"over tls"


def test_a_client_that_does_not_trust_the_servers_ca_refuses_it(
        tls_broker: BrokerProcess, certs: Path) -> None:
    with pytest.raises((AMQPConnectionError, ssl.SSLError)) as err:
        _pika(tls_broker, _client_ctx(certs, ca="other-ca"))
    assert "CERTIFICATE_VERIFY_FAILED" in repr(err.value)


def test_a_client_without_a_certificate_is_refused(tls_broker: BrokerProcess, certs: Path) -> None:
    with pytest.raises((AMQPConnectionError, ssl.SSLError, ConnectionError)):
        conn = _pika(tls_broker, _client_ctx(certs, cert=False))
        conn.channel()  # TLS 1.3: the refusal may arrive only with the first read


def test_the_plain_listener_is_off_and_metrics_are_served_over_https(
        tls_broker: BrokerProcess, certs: Path) -> None:
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", tls_broker.port)):
        pass
    url = f"https://127.0.0.1:{_setting(tls_broker, 'prometheus.ssl.port')}/metrics"
    with urllib.request.urlopen(url, context=_client_ctx(certs, cert=False), timeout=10) as resp:
        assert b"rabbitmq_identity_info" in resp.read()


@pytest.mark.parametrize(("config", "fragment"), [
    ("listeners.tcp = none\n", "listeners.tcp = none needs listeners.ssl.default"),
    ("listeners.ssl.default = {port}\n", "ssl_options.certfile and ssl_options.keyfile"),
    ("listeners.ssl.default = {port}\nssl_options.certfile = /nope.pem\nssl_options.keyfile = /nope.key\n",
     "ssl_options.certfile / ssl_options.keyfile: cannot load /nope.pem"),
    ("listeners.ssl.default = {port}\nssl_options.certfile = {certs}/server.pem\n"
     "ssl_options.keyfile = {certs}/server.key\nssl_options.verify = verify_peer\n",
     "ssl_options.cacertfile: required with ssl_options.verify = verify_peer"),
    ("management.ssl.port = {port}\n", "management.ssl.certfile and management.ssl.keyfile"),
])
def test_bad_tls_settings_stop_start_up_naming_the_key(
        tmp_path: Path, certs: Path, config: str, fragment: str) -> None:
    b = BrokerProcess(tmp_path / "node", config=config.format(port=free_port(), certs=certs))
    with pytest.raises(RuntimeError) as err:
        b.start(timeout=30)
    assert fragment in str(err.value)
    assert not (tmp_path / "node" / "raft").exists()  # refused before touching the disk

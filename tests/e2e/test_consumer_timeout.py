"""Delivery acknowledgement timeout (issue 13, item 2).

A delivery not acknowledged within the consumer timeout closes its channel
with 406 PRECONDITION_FAILED and RabbitMQ's text; the channel's unacked
messages return to the queue and the connection stays open. The same client
scenario runs against our broker and a real RabbitMQ 3.10 node booted with
`consumer_timeout = 1000` (and, in advanced.config, a short
`channel_tick_interval`: RabbitMQ checks the timeout on its channel tick,
every 60 s by default).

RabbitMQ 3.10 has only the node-wide `consumer_timeout`; the per-queue
`x-consumer-timeout` argument, the `consumer-timeout` policy key and the
per-consumer `x-consumer-timeout` consume argument are 3.12+/4.x: those
are tested on our broker alone (3.10 ignores the argument and refuses the
policy key as unrecognised, asserted below).
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from bench import rabbitmq_local
from broker.common.config import ConfigError, load_config
from broker.metadata.policies import validate_definition
from broker.queue.config import consumer_timeout_ms, parse_queue_arguments
from broker.queue.errors import QueueArgumentError
from broker.runtime.confirms import ack_timeout_text, first_timed_out

from .broker_proc import BrokerProcess, free_port, rabbitmq_port_pair

QQ = {"x-queue-type": "quorum"}


# ---------------------------------------------------------------- pure parts
def test_first_timed_out_peeks_the_head_when_deadlines_are_ordered() -> None:
    unacked: OrderedDict[int, Any] = OrderedDict(
        (tag, (None, None, tag, deadline, 1000)) for tag, deadline in ((1, 10.0), (2, 11.0), (3, 12.0)))
    assert first_timed_out(unacked, 9.9, True) is None
    assert first_timed_out(unacked, 10.0, True) == (1, 1000)
    del unacked[1]
    assert first_timed_out(unacked, 11.5, True) == (2, 1000)


def test_first_timed_out_scans_when_timeouts_differ() -> None:
    unacked: OrderedDict[int, Any] = OrderedDict([
        (1, (None, None, 1, 100.0, 90_000)), (2, (None, None, 2, 12.0, 2000)),
        (3, (None, None, 3, 11.0, 1000))])
    assert first_timed_out(unacked, 10.0, False) is None
    # the oldest *expired* delivery (by tag order), not the first entry
    assert first_timed_out(unacked, 11.0, False) == (3, 1000)
    assert first_timed_out(unacked, 12.0, False) == (2, 2000)
    assert first_timed_out(OrderedDict(), 1e9, False) is None


def test_close_text_is_rabbitmqs() -> None:
    assert ack_timeout_text(7, 1000) == (
        "delivery acknowledgement on channel 7 timed out. Timeout value used: 1000 ms. "
        "This timeout value can be configured, see consumers doc guide to learn more")


def test_timeout_precedence() -> None:
    # consumer argument, else the lower of queue argument and policy, else the node's
    assert consumer_timeout_ms({"x-consumer-timeout": 5}, {"x-consumer-timeout": 1}, None, 9) == 5
    assert consumer_timeout_ms({}, {"x-consumer-timeout": 7}, {"consumer-timeout": 3}, 9) == 3
    assert consumer_timeout_ms(None, {"x-consumer-timeout": 2}, {"consumer-timeout": 3}, 9) == 2
    assert consumer_timeout_ms(None, None, {"consumer-timeout": 3}, 9) == 3
    assert consumer_timeout_ms(None, {}, None, 9) == 9
    assert consumer_timeout_ms({"x-consumer-timeout": "x"}, {"x-consumer-timeout": -1}, None, 9) == 9


def test_config_key() -> None:
    assert load_config("")["consumer_timeout"] == 1_800_000
    assert load_config("consumer_timeout = 1000")["consumer_timeout"] == 1000
    assert load_config("", {"QQ__CONSUMER_TIMEOUT": "250"})["consumer_timeout"] == 250
    with pytest.raises(ConfigError, match="consumer_timeout"):
        load_config("consumer_timeout = soon")
    with pytest.raises(ConfigError, match="consumer_timeout"):
        load_config("consumer_timeout = -1")


def test_argument_and_policy_validation() -> None:
    cfg = parse_queue_arguments({"x-consumer-timeout": 0}, "q", "/")
    assert cfg.name == "q"
    with pytest.raises(QueueArgumentError) as err:
        parse_queue_arguments({"x-consumer-timeout": -1}, "q", "/")
    assert err.value.reply_text == ("PRECONDITION_FAILED - invalid arg 'x-consumer-timeout' for "
                                    "queue 'q' in vhost '/': {value_negative,-1}")
    with pytest.raises(QueueArgumentError) as err:
        parse_queue_arguments({"x-consumer-timeout": "1"}, "q", "/")
    assert "expected integer, got longstr" in err.value.reply_text
    assert validate_definition((("consumer-timeout", 1000),)) is None
    refused = validate_definition((("consumer-timeout", "5"),))
    # RabbitMQ 4.x: "<<\"5\">> is not a valid consumer timeout" (its ~p of a binary)
    assert refused is not None and refused.text.endswith("is not a valid consumer timeout")
    refused = validate_definition((("consumer-timeout", -5),))
    assert refused is not None and refused.text == "-5 is not a valid consumer timeout"


# ---------------------------------------------------------------- the client scenario
def _connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))


def _wait_closed(conn: pika.BlockingConnection, ch: Any, deadline_s: float) -> tuple[int, str, float]:
    """Serve the connection until `ch` is closed by the broker; (code, text, seconds)."""
    t0 = time.monotonic()
    while ch.is_open and time.monotonic() - t0 < deadline_s:
        conn.process_data_events(0.1)
    assert not ch.is_open, f"channel not closed within {deadline_s} s"
    reason = ch._closing_reason  # pika keeps the broker's Channel.Close here
    assert isinstance(reason, ChannelClosedByBroker), reason
    return reason.reply_code, reason.reply_text, time.monotonic() - t0


def scenario(port: int, queue: str, deadline_s: float, get: bool = False) -> dict[str, Any]:
    """Deliver one message without acknowledging it; another channel on the
    same connection watches. Returns what a client observes."""
    conn = _connect(port)
    try:
        watch = conn.channel()
        watch.queue_delete(queue)
        watch.queue_declare(queue, durable=True, arguments=QQ)
        watch.confirm_delivery()
        watch.basic_publish("", queue, b"m1")
        ch = conn.channel()
        got: list[tuple[int, bool]] = []
        if get:
            method, _props, _body = ch.basic_get(queue, auto_ack=False)
            got.append((method.delivery_tag, method.redelivered))
        else:
            ch.basic_consume(queue, lambda _c, m, _p, _b: got.append((m.delivery_tag, m.redelivered)))
            t0 = time.monotonic()
            while not got and time.monotonic() - t0 < 10:
                conn.process_data_events(0.1)
        code, text, waited = _wait_closed(conn, ch, deadline_s)
        # the message is back in the queue (poll: the return is asynchronous)
        t0 = time.monotonic()
        while True:
            ready = watch.queue_declare(queue, passive=True).method.message_count
            if ready == 1 or time.monotonic() - t0 > 10:
                break
            time.sleep(0.05)
        method, _props, body = watch.basic_get(queue, auto_ack=True)
        result = {"delivered": got, "close": (code, text), "watch_open": watch.is_open,
                  "conn_open": conn.is_open, "ready_after": ready,
                  "again": (body, method.redelivered) if method else None, "waited": waited}
        watch.queue_delete(queue)
        return result
    finally:
        if conn.is_open:
            conn.close()


def _expected(channel: int) -> dict[str, Any]:
    return {"delivered": [(1, False)],
            "close": (406, "PRECONDITION_FAILED - " + ack_timeout_text(channel, 1000)),
            "watch_open": True, "conn_open": True, "ready_after": 1, "again": (b"m1", True)}


class _TickRabbit(rabbitmq_local.RabbitNode):
    """RabbitMQ with an advanced.config (channel_tick_interval)."""

    @property
    def env(self) -> dict[str, str]:
        env = super().env
        env["RABBITMQ_ADVANCED_CONFIG_FILE"] = str(self.base / "advanced.config")
        return env


@pytest.fixture(scope="module")
def rabbit_1s() -> Iterator[int]:
    if not rabbitmq_local.installed():
        pytest.skip("rabbitmq-server is not installed (make test installs it when run as root)")
    base = Path(tempfile.mkdtemp(prefix="qq-ct-rabbit-"))
    base.chmod(0o755)
    port = rabbitmq_port_pair()
    node = _TickRabbit(f"qqct{os.getpid()}@localhost", port, base / "node")
    node.base.mkdir()
    (node.base / "advanced.config").write_text("[{rabbit, [{channel_tick_interval, 500}]}].\n")
    node.start("consumer_timeout = 1000\n")
    try:
        yield port
    finally:
        try:
            os.kill(int((node.base / "pid").read_text().strip()), signal.SIGKILL)
        except (OSError, ValueError):
            node.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def ours_1s(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("ct") / "node", config="consumer_timeout = 1000\n",
                      management_port=free_port())
    b.start()
    yield b
    b.stop()


@pytest.mark.parametrize("get", [False, True], ids=["consume", "get"])
def test_same_as_rabbitmq(get: bool, rabbit_1s: int, ours_1s: BrokerProcess) -> None:
    theirs = scenario(rabbit_1s, f"ct-q-{get}", deadline_s=30, get=get)
    mine = scenario(ours_1s.port, f"ct-q-{get}", deadline_s=10, get=get)
    for result in (theirs, mine):
        assert result["waited"] < 30
        result.pop("waited")
    assert theirs == _expected(2)
    assert mine == theirs


@pytest.fixture(scope="module")
def ours_default(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """The default timeout (30 min): only per-queue/per-consumer settings apply."""
    b = BrokerProcess(tmp_path_factory.mktemp("ct-default") / "node", management_port=free_port())
    b.start()
    yield b
    b.stop()


def _timed_out_with(port: int, queue: str, queue_args: dict[str, Any],
                    consume_args: dict[str, Any] | None) -> tuple[int, str] | None:
    """Consume one message; the close (code, text) within 6 s, or None."""
    conn = _connect(port)
    try:
        ch = conn.channel()
        ch.queue_delete(queue)
        ch.queue_declare(queue, durable=True, arguments={**QQ, **queue_args})
        ch.confirm_delivery()
        ch.basic_publish("", queue, b"x")
        ch.basic_consume(queue, lambda *_: None, arguments=consume_args)
        try:
            code, text, _ = _wait_closed(conn, ch, 6)
        except AssertionError:
            return None
        return code, text
    finally:
        if conn.is_open:
            conn.close()


def test_queue_argument_policy_and_consumer_argument(ours_default: BrokerProcess) -> None:
    import base64
    import json
    import urllib.request

    port = ours_default.port
    assert _timed_out_with(port, "ct-arg", {"x-consumer-timeout": 1000}, None) == (
        406, "PRECONDITION_FAILED - " + ack_timeout_text(1, 1000))
    # the consumer's own argument wins over the queue's
    assert _timed_out_with(port, "ct-arg2", {"x-consumer-timeout": 3_600_000},
                           {"x-consumer-timeout": 500}) == (
        406, "PRECONDITION_FAILED - " + ack_timeout_text(1, 500))
    # a policy: the lower of it and the argument
    req = urllib.request.Request(
        f"http://127.0.0.1:{ours_default.management_port}/api/policies/%2F/ct",
        data=json.dumps({"pattern": "^ct-pol", "definition": {"consumer-timeout": 700}}).encode(),
        method="PUT", headers={"Content-Type": "application/json", "Authorization": "Basic "
                               + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status in (201, 204)
    assert _timed_out_with(port, "ct-pol", {"x-consumer-timeout": 3_600_000}, None) == (
        406, "PRECONDITION_FAILED - " + ack_timeout_text(1, 700))
    # no setting: the 30-minute default does not fire
    assert _timed_out_with(port, "ct-none", {}, None) is None


def test_acked_in_time_keeps_the_channel(ours_1s: BrokerProcess) -> None:
    """Deliveries acknowledged within the timeout never close the channel,
    however long the consumer runs in total."""
    conn = _connect(ours_1s.port)
    try:
        ch = conn.channel()
        ch.queue_declare("ct-steady", durable=True, arguments=QQ)
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", "ct-steady", str(i).encode())
        ch.basic_qos(prefetch_count=1)
        acked: list[bytes] = []
        ch.basic_consume("ct-steady", lambda c, m, _p, b: (acked.append(b), c.basic_ack(m.delivery_tag)))
        t0 = time.monotonic()
        while len(acked) < 5 and time.monotonic() - t0 < 10:
            conn.process_data_events(0.4)  # each one waits ~0.4 s: 2 s in total
        assert len(acked) == 5
        conn.process_data_events(1.5)  # nothing unacked: nothing to time out
        assert ch.is_open
        ch.queue_delete("ct-steady")
    finally:
        if conn.is_open:
            conn.close()


def test_rabbitmq_310_lacks_the_per_queue_settings(rabbit_1s: int, ours_1s: BrokerProcess) -> None:
    """Deliberate difference: 3.10 ignores x-consumer-timeout (it passes
    unknown arguments), 3.12+/4.x validate it as a non-negative integer, as we do."""
    results = []
    for port in (rabbit_1s, ours_1s.port):
        conn = _connect(port)
        try:
            ch = conn.channel()
            try:
                ch.queue_declare("ct-310", durable=True, arguments={**QQ, "x-consumer-timeout": -1})
                ch.queue_delete("ct-310")
                results.append("accepted")
            except ChannelClosedByBroker as e:
                results.append((e.reply_code, e.reply_text))
        finally:
            if conn.is_open:
                conn.close()
    assert results == ["accepted", (406, "PRECONDITION_FAILED - invalid arg 'x-consumer-timeout' "
                                         "for queue 'ct-310' in vhost '/': {value_negative,-1}")]

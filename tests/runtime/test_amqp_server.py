"""The AMQP server shell's fairness (runtime/amqp_server.py): one connection
handles at most `DRAIN_BUDGET` channel events of what it read in one pass
of the event loop, holds its socket ("drain") and handles the rest on the
next pass, after whatever else is ready, so one client's burst of publishes
cannot hold back the acks that renew another client's credit; and ends a
pass sooner (from `PASS_FULL` publishes on) once the publishes went to few
routing keys (`PER_KEY_FULL` a key on average).

In process, over a fake transport and a node of the real metadata state
(publishes to a queue that does not exist: routed nowhere, counted).
"""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from pamqp import commands as C
from pamqp import frame as pframe

import broker.metadata as md
from broker.amqp import ServerConfig
from broker.runtime.amqp_server import DRAIN_BUDGET, PASS_FULL, PER_KEY_FULL, AmqpConnection
from tests.amqp.helpers import parse_frames, publish


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.data = b""
        self.reading = True
        self.pauses = 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name in ("peername", "sockname") else default

    def write(self, data: Any) -> None:
        self.data += bytes(data)

    def writelines(self, parts: Any) -> None:
        for p in parts:
            self.write(p)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        self.reading = False
        self.pauses += 1

    def resume_reading(self) -> None:
        self.reading = True


def _node() -> Any:
    state = md.initial_state(md.hash_password("guest", b"salt"))
    allowed = SimpleNamespace(node_refused=lambda: None, connection_refused=lambda user, vhost: None,
                              channel_refused=lambda user: None)
    return SimpleNamespace(
        amqp_config=ServerConfig(), connections=set(), meta=SimpleNamespace(state=state),
        config={"loopback_users": ("guest",)}, limits=allowed, alarm_resources=frozenset(),
        declarations=SimpleNamespace(connection_closed=lambda cid: None), incarnation="test",
        node_name="rabbit@test", registry=SimpleNamespace(queue=lambda vhost, name: None),
        queues={})


async def _opened() -> tuple[AmqpConnection, _Transport]:
    conn = AmqpConnection(_node())
    transport = _Transport()
    conn.connection_made(transport)
    conn.data_received(b"AMQP\x00\x00\x09\x01")
    conn.data_received(pframe.marshal(C.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\0guest\0guest"), 0))
    conn.data_received(pframe.marshal(C.Connection.TuneOk(channel_max=10, frame_max=131072,
                                                          heartbeat=0), 0)
                       + pframe.marshal(C.Connection.Open(virtual_host="/"), 0)
                       + pframe.marshal(C.Channel.Open(), 1))
    assert 1 in conn.channels, transport.data
    return conn, transport


def _returned(transport: _Transport) -> list[str]:
    """The routing keys of the basic.returns written so far, in order."""
    keys = []
    for _ch, m in parse_frames(transport.data):
        if isinstance(m, C.Basic.Return):
            keys.append(m.routing_key)
    return keys


def _burst(n: int) -> bytes:
    """n mandatory publishes routed nowhere: each comes back as a
    basic.return naming its routing key, so the order is visible."""
    return b"".join(publish(b"m", routing_key=f"nowhere-{i}", mandatory=True) for i in range(n))


async def test_a_burst_is_handled_a_budget_per_pass_in_order() -> None:
    conn, transport = await _opened()
    ch = conn.channels[1]
    n = DRAIN_BUDGET * 2 + 10
    want = [f"nowhere-{i}" for i in range(n)]
    try:
        conn.data_received(_burst(n))
        # one budget handled, the rest waits with the socket held
        assert ch.stats.publish == DRAIN_BUDGET and _returned(transport) == want[:DRAIN_BUDGET]
        assert conn.holds == {"drain"} and not transport.reading
        await asyncio.sleep(0)  # the next pass
        assert ch.stats.publish == 2 * DRAIN_BUDGET and conn.holds == {"drain"}
        await asyncio.sleep(0)
        assert ch.stats.publish == n and _returned(transport) == want
        assert not conn.holds and transport.reading and transport.pauses == 2
    finally:
        conn.connection_lost(None)


async def test_a_burst_within_the_budget_holds_nothing() -> None:
    conn, transport = await _opened()
    try:
        conn.data_received(_burst(DRAIN_BUDGET - 1))
        assert conn.channels[1].stats.publish == DRAIN_BUDGET - 1
        assert not conn.holds and transport.pauses == 0
    finally:
        conn.connection_lost(None)


async def test_a_connection_lost_with_a_pass_pending_handles_what_it_read_first() -> None:
    """As without the budget: what was read before the loss is handled (acks
    settle, publishes are enqueued), then the connection goes."""
    conn, transport = await _opened()
    ch = conn.channels[1]
    conn.data_received(_burst(DRAIN_BUDGET + 5))
    assert ch.stats.publish == DRAIN_BUDGET
    conn.connection_lost(None)
    assert ch.stats.publish == DRAIN_BUDGET + 5 and conn.closed and ch.closed
    await asyncio.sleep(0)  # the pass that was pending does nothing more
    assert ch.stats.publish == DRAIN_BUDGET + 5


def _rotating(n: int, keys: int) -> bytes:
    """n mandatory publishes routed nowhere, rotating over `keys` routing keys."""
    return b"".join(publish(b"m", routing_key=f"nowhere-{i % keys}", mandatory=True)
                    for i in range(n))


async def test_a_pass_of_publishes_to_few_keys_ends_early() -> None:
    """Publishes to one key, or to a few, end the pass as soon as they
    average `PER_KEY_FULL` a key (their entries are full enough); spread over
    many keys they take the whole budget. Nothing is lost or reordered."""
    assert PASS_FULL < DRAIN_BUDGET and PER_KEY_FULL * 2 <= DRAIN_BUDGET
    for keys in (1, 2, 3, DRAIN_BUDGET // PER_KEY_FULL, DRAIN_BUDGET // PER_KEY_FULL + 1):
        conn, transport = await _opened()
        ch = conn.channels[1]
        n = DRAIN_BUDGET * 2
        want = [f"nowhere-{i % keys}" for i in range(n)]
        # the first count from PASS_FULL on at which `keys` keys average PER_KEY_FULL
        first = max(PASS_FULL, keys * PER_KEY_FULL)
        first = first if first <= DRAIN_BUDGET else DRAIN_BUDGET
        try:
            conn.data_received(_rotating(n, keys))
            assert ch.stats.publish == first, keys
            assert conn.holds == {"drain"} and not transport.reading
            while conn.holds:
                await asyncio.sleep(0)
            assert ch.stats.publish == n and _returned(transport) == want
        finally:
            conn.connection_lost(None)


async def test_acks_and_methods_do_not_end_a_pass_early() -> None:
    """Only publishes count toward the early end: a burst of other channel
    events (here basic.qos) runs to the whole budget."""
    conn, transport = await _opened()
    ch = conn.channels[1]
    try:
        conn.data_received(b"".join(pframe.marshal(C.Basic.Qos(prefetch_count=i + 1), 1)
                                    for i in range(DRAIN_BUDGET - 1))
                           + _rotating(PASS_FULL, 1))
        # 255 methods and one publish: the budget ends the pass, not the early rule
        assert ch.stats.publish == 1 and conn.holds == {"drain"}
        while conn.holds:
            await asyncio.sleep(0)
        assert ch.stats.publish == PASS_FULL and _returned(transport) == ["nowhere-0"] * PASS_FULL
    finally:
        conn.connection_lost(None)

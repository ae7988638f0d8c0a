"""RabbitMQ compatibility: the same client scenarios against our broker and a
real RabbitMQ node, compared on what a client can observe.

Each scenario is a function `port -> result` written with pika's blocking
adapter. It records reply codes and texts of errors, counts, delivery order,
redelivered flags and headers. The test runs it against RabbitMQ 3.10 (the
session's `rabbitmq_defs` node, shared with the connection tests so the suite
boots one RabbitMQ; its extra definitions do not touch these names; the plain
`rabbitmq` fixture's node cannot start as root, see conftest) and against our
broker, and asserts the results are equal,
except where RabbitMQ 4.x semantics differ from 3.10: then the scenario's
`to_4x` function turns the 3.10 result into what 4.x does (and says why, with
the 4.x docs as the source), and our broker must give that.

Names are fixed per scenario: each scenario runs once per broker.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker, UnroutableError
from pika.spec import BasicProperties

from .broker_proc import BrokerProcess

QQ = {"x-queue-type": "quorum"}


# ---------------------------------------------------------------- client helpers
def connect(port: int, **kw: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, **kw))


def attempt(conn: pika.BlockingConnection, fn: Callable[[Any], Any]) -> Any:
    """Run fn(channel) on a new channel; return its result, or the (code, text)
    of the channel error it caused. A `queue_declare(passive)` on the default
    exchange's implicit queue is not used to sync: fn must end with a
    synchronous method if it publishes (so an asynchronous error shows)."""
    ch = conn.channel()
    try:
        out = fn(ch)
    except ChannelClosedByBroker as e:
        return (e.reply_code, e.reply_text)
    if ch.is_open:
        ch.close()
    return out


def conn_attempt(port: int, fn: Callable[[Any], Any]) -> Any:
    """Like attempt, on a connection of its own, for connection-level errors."""
    conn = connect(port)
    ch = conn.channel()
    try:
        out = fn(ch)
    except ChannelClosedByBroker as e:
        out = (e.reply_code, e.reply_text)
    except ConnectionClosedByBroker as e:
        return ("connection", e.reply_code, e.reply_text)
    if conn.is_open:
        conn.close()
    return out


def drain_get(ch: Any, queue: str, ack: bool = True, limit: int = 1000) -> list[Any]:
    """basic.get until empty: [(body, redelivered, x-delivery-count), ...]."""
    out = []
    for _ in range(limit):
        method, props, body = ch.basic_get(queue, auto_ack=ack)
        if method is None:
            break
        out.append((body.decode(), method.redelivered, (props.headers or {}).get("x-delivery-count")))
    return out


def fresh(ch: Any, name: str, args: dict[str, Any] | None = None, durable: bool = True) -> None:
    """A new queue with this name (deleted first if a previous run left it)."""
    ch.queue_delete(name)
    ch.queue_declare(name, durable=durable, arguments=args)


def wait_count(ch: Any, queue: str, n: int, timeout: float = 10.0) -> int:
    """Poll the queue's message count until it equals n (or the deadline passes)."""
    import time
    deadline = time.monotonic() + timeout
    count = -1
    while time.monotonic() < deadline:
        count = ch.queue_declare(queue, passive=True).method.message_count
        if count == n:
            return count
        ch.connection.process_data_events(0.02)
    return count


def death_summary(headers: dict[str, Any] | None) -> list[dict[str, Any]]:
    """x-death entries without the time field (clocks differ)."""
    deaths = (headers or {}).get("x-death") or []
    out = []
    for d in deaths:
        out.append({k: (v.decode() if isinstance(v, bytes) else v) for k, v in d.items() if k != "time"})
    return out


# ---------------------------------------------------------------- scenarios
def s_exchange_errors(port: int) -> dict[str, Any]:
    conn = connect(port)
    r: dict[str, Any] = {}
    r["passive_missing"] = attempt(conn, lambda ch: ch.exchange_declare("cx-missing", passive=True))
    r["amq_prefix"] = attempt(conn, lambda ch: ch.exchange_declare("amq.custom", "direct"))
    attempt(conn, lambda ch: ch.exchange_delete("cx-d"))
    attempt(conn, lambda ch: ch.exchange_declare("cx-d", "direct"))
    r["type_mismatch"] = attempt(conn, lambda ch: ch.exchange_declare("cx-d", "fanout"))
    r["durable_mismatch"] = attempt(conn, lambda ch: ch.exchange_declare("cx-d", "direct", durable=True))
    r["passive_ok"] = attempt(conn, lambda ch: ch.exchange_declare("cx-d", "fanout", passive=True).method.NAME)

    def in_use(ch: Any) -> Any:
        fresh(ch, "cx-q")
        ch.queue_bind("cx-q", "cx-d", "k")
        return ch.exchange_delete("cx-d", if_unused=True)
    r["delete_in_use"] = attempt(conn, in_use)
    r["delete_missing"] = attempt(conn, lambda ch: ch.exchange_delete("cx-never").method.NAME)
    r["bind_default"] = attempt(conn, lambda ch: ch.queue_bind("cx-q", "", "cx-q"))
    r["delete_default"] = attempt(conn, lambda ch: ch.exchange_delete(""))
    r["delete_amq"] = attempt(conn, lambda ch: ch.exchange_delete("amq.direct"))
    r["redeclare_amq"] = attempt(conn, lambda ch: ch.exchange_declare("amq.direct", "direct",
                                                                      durable=True).method.NAME)
    r["declare_amq_passive"] = attempt(conn, lambda ch: ch.exchange_declare("amq.topic", passive=True).method.NAME)

    def internal(ch: Any) -> Any:
        ch.exchange_declare("cx-int", "fanout", internal=True)
        ch.basic_publish("cx-int", "", b"x")
        return ch.queue_declare("cx-q", passive=True).method.NAME
    r["publish_internal"] = attempt(conn, internal)

    def publish_missing(ch: Any) -> Any:
        ch.basic_publish("cx-nowhere", "", b"x")
        return ch.queue_declare("cx-q", passive=True).method.NAME
    r["publish_missing"] = attempt(conn, publish_missing)
    r["bind_missing_queue"] = attempt(conn, lambda ch: ch.queue_bind("cx-noq", "amq.direct", "k"))
    r["bind_missing_exchange"] = attempt(conn, lambda ch: ch.queue_bind("cx-q", "cx-nox", "k"))
    r["unknown_type"] = conn_attempt(port, lambda ch: ch.exchange_declare("cx-weird", "weird"))
    conn.close()
    return r


def s_routing(port: int) -> dict[str, Any]:
    conn = connect(port)
    ch = conn.channel()
    for name, kind in [("rt-direct", "direct"), ("rt-fanout", "fanout"), ("rt-topic", "topic"),
                       ("rt-headers", "headers"), ("rt-e2e", "topic")]:
        ch.exchange_delete(name)
        ch.exchange_declare(name, kind)
    queues = ["rt-q1", "rt-q2", "rt-q3", "rt-q4"]
    for q in queues:
        fresh(ch, q, QQ)
    ch.queue_bind("rt-q1", "rt-direct", "a")
    ch.queue_bind("rt-q2", "rt-direct", "b")
    ch.queue_bind("rt-q1", "rt-fanout", "ignored")
    ch.queue_bind("rt-q2", "rt-fanout", "")
    ch.queue_bind("rt-q3", "rt-topic", "*.orange.*")
    ch.queue_bind("rt-q4", "rt-topic", "lazy.#")
    ch.queue_bind("rt-q4", "rt-topic", "*.*.rabbit")
    ch.queue_bind("rt-q1", "rt-headers", "", arguments={"x-match": "all", "a": 1, "b": "two"})
    ch.queue_bind("rt-q2", "rt-headers", "", arguments={"x-match": "any", "a": 1, "b": "two"})
    # exchange-to-exchange: rt-e2e (topic) -> rt-direct for '#.e2e'
    ch.exchange_bind("rt-direct", "rt-e2e", "#.e2e")
    ch.queue_bind("rt-q3", "rt-e2e", "x.#")
    ch.confirm_delivery()
    pubs = [("rt-direct", "a", None, "d-a"), ("rt-direct", "b", None, "d-b"), ("rt-direct", "c", None, "d-c"),
            ("rt-fanout", "zzz", None, "f"),
            ("rt-topic", "quick.orange.rabbit", None, "t1"), ("rt-topic", "lazy.orange.elephant", None, "t2"),
            ("rt-topic", "quick.orange.fox", None, "t3"), ("rt-topic", "lazy.brown.fox", None, "t4"),
            ("rt-topic", "lazy", None, "t5"), ("rt-topic", "quick.brown.fox", None, "t6"),
            ("rt-topic", "orange", None, "t7"), ("rt-topic", "quick.orange.male.rabbit", None, "t8"),
            ("rt-headers", "", {"a": 1, "b": "two"}, "h-both"), ("rt-headers", "", {"a": 1}, "h-a"),
            ("rt-headers", "", {"b": "three"}, "h-none"), ("rt-headers", "", {"a": 1, "b": "two", "c": 3}, "h-extra"),
            ("rt-e2e", "x.e2e", None, "e-both"), ("rt-e2e", "y.e2e", None, "e-direct"),
            ("rt-e2e", "x.y", None, "e-topic"), ("", "rt-q4", None, "default"),
            ("amq.fanout", "", None, "amq-fanout")]
    for ex, rk, headers, body in pubs:
        ch.basic_publish(ex, rk, body.encode(), BasicProperties(headers=headers))
    # The '#.e2e' binding routes to rt-direct, where 'x.e2e' matches no key: a direct
    # exchange bound with '#.e2e' needs a queue bound with that key to deliver.
    r = {q: [b for b, _, _ in drain_get(ch, q)] for q in queues}
    conn.close()
    return r


def s_exchange_edges(port: int) -> dict[str, Any]:
    """Binding/declaration edge cases and topic matching corner cases."""
    conn = connect(port)
    r: dict[str, Any] = {}
    ch = conn.channel()
    ch.exchange_declare("pe-h", "headers")
    ch.exchange_declare("pe-t", "topic")
    ch.exchange_delete("pe-ae")
    fresh(ch, "pe-q")
    r["xmatch_bogus"] = attempt(conn, lambda c: c.queue_bind("pe-q", "pe-h", "", arguments={"x-match": "bogus"}))
    r["xmatch_any_with_x"] = attempt(conn, lambda c: c.queue_bind("pe-q", "pe-h", "", arguments={
        "x-match": "any-with-x", "x-a": 1}))
    r["e2e_missing_dest"] = attempt(conn, lambda c: c.exchange_bind("pe-nope", "pe-t", "k"))
    r["e2e_missing_src"] = attempt(conn, lambda c: c.exchange_bind("pe-t", "pe-nope", "k"))
    r["amq_redeclare_type"] = attempt(conn, lambda c: c.exchange_declare("amq.direct", "fanout", durable=True))
    r["ae_missing"] = attempt(conn, lambda c: c.exchange_declare("pe-ae", "direct", arguments={
        "alternate-exchange": "pe-none"}))
    r["unbind_missing_q"] = attempt(conn, lambda c: c.queue_unbind("pe-noq", "pe-t", "k"))
    r["unbind_missing_x"] = attempt(conn, lambda c: c.queue_unbind("pe-q", "pe-nox", "k"))
    for q, key in [("pe-t1", "#"), ("pe-t2", "a.#.b"), ("pe-t3", "*.*"), ("pe-t4", "#.x.#")]:
        fresh(ch, q)
        ch.queue_bind(q, "pe-t", key)
    ch.confirm_delivery()
    for rk in ["", "a", "a.b", "a.c.d.b", "a..b", "x", "q.x", "x.q.r", ".", "a.b.", "*", "#"]:
        ch.basic_publish("pe-t", rk, rk.encode() or b"<empty>")
    for q in ["pe-t1", "pe-t2", "pe-t3", "pe-t4"]:
        r[q] = [b for b, _, _ in drain_get(ch, q)]
        ch.queue_delete(q)
    conn.close()
    return r


def s_alternate_exchange(port: int) -> dict[str, Any]:
    conn = connect(port)
    ch = conn.channel()
    ch.exchange_delete("ae-main")
    ch.exchange_delete("ae-alt")
    ch.exchange_declare("ae-alt", "fanout")
    ch.exchange_declare("ae-main", "direct", arguments={"alternate-exchange": "ae-alt"})
    fresh(ch, "ae-routed", QQ)
    fresh(ch, "ae-unrouted", QQ)
    ch.queue_bind("ae-routed", "ae-main", "yes")
    ch.queue_bind("ae-unrouted", "ae-alt", "")
    ch.confirm_delivery()
    ch.basic_publish("ae-main", "yes", b"1")
    ch.basic_publish("ae-main", "no", b"2", mandatory=True)  # the AE routes it: no return
    r = {"routed": [b for b, _, _ in drain_get(ch, "ae-routed")],
         "unrouted": [b for b, _, _ in drain_get(ch, "ae-unrouted")]}
    conn.close()
    return r


def s_queue_errors(port: int) -> dict[str, Any]:
    conn = connect(port)
    r: dict[str, Any] = {}
    attempt(conn, lambda ch: fresh(ch, "cq-qq", QQ))
    attempt(conn, lambda ch: fresh(ch, "cq-classic", None))
    r["passive_missing"] = attempt(conn, lambda ch: ch.queue_declare("cq-missing", passive=True))
    r["durable_mismatch"] = attempt(conn, lambda ch: ch.queue_declare("cq-qq", durable=False, arguments=QQ))
    r["type_mismatch"] = attempt(conn, lambda ch: ch.queue_declare("cq-qq", durable=True))
    r["type_mismatch_explicit"] = attempt(conn, lambda ch: ch.queue_declare(
        "cq-qq", durable=True, arguments={"x-queue-type": "classic"}))
    r["type_mismatch_classic"] = attempt(conn, lambda ch: ch.queue_declare("cq-classic", durable=True,
                                                                           arguments=QQ))
    r["arg_mismatch"] = attempt(conn, lambda ch: ch.queue_declare(
        "cq-qq", durable=True, arguments={**QQ, "x-max-length": 5}))
    r["redeclare_same"] = attempt(conn, lambda ch: ch.queue_declare("cq-qq", durable=True, arguments=QQ).method.queue)
    r["passive_ok"] = attempt(conn, lambda ch: ch.queue_declare("cq-qq", passive=True).method.queue)
    r["qq_non_durable"] = attempt(conn, lambda ch: ch.queue_declare("cq-nd", durable=False, arguments=QQ))
    r["qq_exclusive"] = attempt(conn, lambda ch: ch.queue_declare("cq-ex", durable=True, exclusive=True,
                                                                  arguments=QQ))
    r["qq_auto_delete"] = attempt(conn, lambda ch: ch.queue_declare("cq-ad", durable=True, auto_delete=True,
                                                                    arguments=QQ))
    r["qq_server_named"] = attempt(conn, lambda ch: ch.queue_declare("", durable=True, arguments=QQ)
                                   .method.queue.startswith("amq.gen-"))
    r["qq_bad_type"] = attempt(conn, lambda ch: ch.queue_declare("cq-bt", durable=True,
                                                                 arguments={"x-queue-type": "nope"}))
    r["qq_bad_overflow"] = attempt(conn, lambda ch: ch.queue_declare(
        "cq-bo", durable=True, arguments={**QQ, "x-overflow": "bogus"}))
    r["qq_bad_max_length"] = attempt(conn, lambda ch: ch.queue_declare(
        "cq-bm", durable=True, arguments={**QQ, "x-max-length": -1}))
    r["amq_prefix"] = attempt(conn, lambda ch: ch.queue_declare("amq.mine"))
    r["purge_missing"] = attempt(conn, lambda ch: ch.queue_purge("cq-missing"))
    r["delete_missing"] = attempt(conn, lambda ch: ch.queue_delete("cq-missing").method.message_count)

    def counts(ch: Any) -> Any:
        ch.confirm_delivery()
        for i in range(3):
            ch.basic_publish("", "cq-qq", b"%d" % i)
        ch.basic_consume("cq-qq", lambda *a: None)
        ok = ch.queue_declare("cq-qq", passive=True).method
        ch.queue_declare("cq-qq", durable=True, arguments=QQ)
        return (ok.message_count, ok.consumer_count)
    r["counts_with_consumer"] = attempt(conn, counts)

    # quorum queues refuse both flags (a connection error), classic queues check them
    r["qq_delete_if_empty"] = conn_attempt(port, lambda ch: ch.queue_delete("cq-qq", if_empty=True))
    r["qq_delete_if_unused"] = conn_attempt(port, lambda ch: ch.queue_delete("cq-qq", if_unused=True))

    def delete_if_empty(ch: Any) -> Any:
        ch.confirm_delivery()
        ch.basic_publish("", "cq-classic", b"x")
        return ch.queue_delete("cq-classic", if_empty=True).method.message_count
    r["delete_if_empty"] = attempt(conn, delete_if_empty)

    def delete_if_unused(ch: Any) -> Any:
        ch.basic_consume("cq-classic", lambda *a: None)
        return ch.queue_delete("cq-classic", if_unused=True).method.message_count
    r["delete_if_unused"] = attempt(conn, delete_if_unused)
    r["delete_if_ok"] = attempt(conn, lambda ch: ch.queue_delete("cq-classic", if_unused=True,
                                                                 if_empty=False).method.message_count)

    def purge(ch: Any) -> Any:
        fresh(ch, "cq-p", QQ)
        ch.confirm_delivery()
        for i in range(4):
            ch.basic_publish("", "cq-p", b"%d" % i)
        n = ch.queue_purge("cq-p").method.message_count
        return (n, ch.queue_declare("cq-p", passive=True).method.message_count,
                ch.queue_delete("cq-p").method.message_count)
    r["purge"] = attempt(conn, purge)
    r["delete_counts"] = attempt(conn, lambda ch: ch.queue_delete("cq-qq").method.message_count)
    conn.close()
    return r


def s_queue_arguments(port: int) -> dict[str, Any]:
    """Quorum-queue declaration arguments: accepted, refused, and the texts.
    Not compared (3.10 and 4.x differ, our broker follows 4.x): a non-integer
    x-delivery-limit (3.10 does not check it) and x-queue-master-locator (3.10
    refuses it for quorum queues; 4.x has no mirroring)."""
    conn = connect(port)
    cases = {"max_priority": {"x-max-priority": 10}, "queue_mode": {"x-queue-mode": "lazy"},
             "expires": {"x-expires": 1000}, "ttl_neg": {"x-message-ttl": -1}, "ttl_str": {"x-message-ttl": "x"},
             "sac_str": {"x-single-active-consumer": "yes"},
             "at_least_once": {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
                               "x-dead-letter-exchange": "dx"},
             "at_least_once_drop_head": {"x-dead-letter-strategy": "at-least-once"},
             "max_length_bytes": {"x-max-length-bytes": 100}, "initial_size_0": {"x-quorum-initial-group-size": 0},
             "leader_locator": {"x-queue-leader-locator": "bogus"}, "dlx_int": {"x-dead-letter-exchange": 5},
             "in_memory_length": {"x-max-in-memory-length": 5},
             "reject_publish_dlx": {"x-overflow": "reject-publish-dlx", "x-max-length": 1}}
    r: dict[str, Any] = {}
    for k, v in cases.items():
        r[k] = attempt(conn, lambda ch, k=k, v=v: ch.queue_declare("qa-" + k, durable=True,
                                                                   arguments={**QQ, **v}).method.queue)
        attempt(conn, lambda ch, k=k: ch.queue_delete("qa-" + k))

    def reject_publish_dlx(ch: Any) -> Any:
        """Accepted and treated as drop-head (RabbitMQ logs a warning)."""
        ch.queue_declare("qa-rpd", durable=True, arguments={**QQ, "x-overflow": "reject-publish-dlx",
                                                            "x-max-length": 1})
        ch.confirm_delivery()
        ch.basic_publish("", "qa-rpd", b"1")
        ch.basic_publish("", "qa-rpd", b"2")
        got = [b for b, _, _ in drain_get(ch, "qa-rpd")]
        ch.queue_delete("qa-rpd")
        return got
    r["reject_publish_dlx_behaviour"] = attempt(conn, reject_publish_dlx)
    conn.close()
    return r


def s_publish_checks_and_shortcuts(port: int) -> dict[str, Any]:
    """Property checks on publish (expiration, user_id), prefetch_size, and the
    '' queue-name shortcut (the channel's last declared queue)."""
    conn = connect(port)
    r: dict[str, Any] = {}
    attempt(conn, lambda c: fresh(c, "ps-q", QQ))

    def pub(props: BasicProperties) -> Callable[[Any], Any]:
        def f(c: Any) -> Any:
            c.basic_publish("", "ps-q", b"x", props)
            return c.queue_declare("ps-q", passive=True).method.NAME
        return f
    r["exp_abc"] = attempt(conn, pub(BasicProperties(expiration="abc")))
    r["exp_neg"] = attempt(conn, pub(BasicProperties(expiration="-1")))
    r["exp_too_large"] = attempt(conn, pub(BasicProperties(expiration="99999999999999999999")))
    r["exp_too_large_short"] = attempt(conn, pub(BasicProperties(expiration="315360000001")))
    r["exp_max"] = attempt(conn, pub(BasicProperties(expiration="315360000000")))
    r["exp_18_digits"] = attempt(conn, pub(BasicProperties(expiration="999999999999999999")))
    r["exp_19_digits"] = attempt(conn, pub(BasicProperties(expiration="1152921504606846976")))
    r["user_id"] = attempt(conn, pub(BasicProperties(user_id="bob")))
    r["user_id_ok"] = attempt(conn, pub(BasicProperties(user_id="guest")))
    r["passive_empty_name"] = conn_attempt(port, lambda c: c.queue_declare("", passive=True).method.queue)
    r["bind_no_prev"] = conn_attempt(port, lambda c: c.queue_bind("", "amq.direct", "k"))
    r["delete_no_prev"] = conn_attempt(port, lambda c: c.queue_delete(""))
    r["purge_no_prev"] = conn_attempt(port, lambda c: c.queue_purge(""))
    r["get_no_prev"] = conn_attempt(port, lambda c: c.basic_get(""))
    r["prefetch_size"] = conn_attempt(port, lambda c: c.basic_qos(prefetch_size=1))

    def last_queue(c: Any) -> Any:
        c.queue_declare("ps-last")
        c.queue_bind("", "amq.direct", "ps-k")
        c.confirm_delivery()
        c.basic_publish("amq.direct", "ps-k", b"via-last")
        c.basic_publish("amq.direct", "ps-k", b"second")
        _m, _p, body = c.basic_get("")
        return (body, c.queue_delete("").method.message_count)  # ready ones only
    r["last_queue"] = conn_attempt(port, last_queue)
    attempt(conn, lambda c: c.queue_delete("ps-q"))
    conn.close()
    return r


def s_redeclare_and_flow(port: int) -> dict[str, Any]:
    """Property equivalence on redeclaration (exchange and classic queue),
    channel.flow, consumer x-priority types."""
    conn = connect(port)
    r: dict[str, Any] = {}
    r["flow_true"] = conn_attempt(port, lambda c: c.flow(True))
    r["flow_false"] = conn_attempt(port, lambda c: c.flow(False))
    attempt(conn, lambda c: c.exchange_delete("rd-x"))
    attempt(conn, lambda c: c.exchange_declare("rd-x", "direct"))
    r["x_auto_delete"] = attempt(conn, lambda c: c.exchange_declare("rd-x", "direct", auto_delete=True))
    r["x_internal"] = attempt(conn, lambda c: c.exchange_declare("rd-x", "direct", internal=True))
    r["x_args"] = attempt(conn, lambda c: c.exchange_declare("rd-x", "direct", arguments={"alternate-exchange": "z"}))
    attempt(conn, lambda c: fresh(c, "rd-c", None, durable=False))
    r["q_auto_delete"] = attempt(conn, lambda c: c.queue_declare("rd-c", auto_delete=True))
    r["q_exclusive"] = attempt(conn, lambda c: c.queue_declare("rd-c", exclusive=True))
    r["q_new_arg"] = attempt(conn, lambda c: c.queue_declare("rd-c", arguments={"x-message-ttl": 5}))
    attempt(conn, lambda c: fresh(c, "rd-t", {"x-message-ttl": 5}, durable=False))
    r["q_other_value"] = attempt(conn, lambda c: c.queue_declare("rd-t", arguments={"x-message-ttl": 2**40}))
    r["prio_bool"] = attempt(conn, lambda c: c.basic_consume("rd-c", lambda *a: None, arguments={"x-priority": True}))
    r["prio_long"] = attempt(conn, lambda c: bool(c.basic_consume("rd-c", lambda *a: None,
                                                                  arguments={"x-priority": 2**40})))
    for q in ("rd-c", "rd-t"):
        attempt(conn, lambda c, q=q: c.queue_delete(q))
    conn.close()
    return r


def s_exclusive_and_temporaries(port: int) -> dict[str, Any]:
    """The RPC reply-queue pattern: a server-named exclusive auto-delete queue."""
    server = connect(port)
    client = connect(port)
    r: dict[str, Any] = {}
    sch = server.channel()
    fresh(sch, "rpc-requests", QQ)

    def on_request(ch: Any, method: Any, props: Any, body: bytes) -> None:
        ch.basic_publish("", props.reply_to, b"reply:" + body,
                         BasicProperties(correlation_id=props.correlation_id))
        ch.basic_ack(method.delivery_tag)
    sch.basic_consume("rpc-requests", on_request)
    cch = client.channel()
    reply_q = cch.queue_declare("", exclusive=True, auto_delete=True).method.queue
    r["server_named_prefix"] = reply_q.startswith("amq.gen-")
    replies: list[tuple[str, str]] = []
    cch.basic_consume(reply_q, lambda ch, m, p, b: replies.append((p.correlation_id, b.decode())),
                      auto_ack=True)
    for i in range(3):
        cch.basic_publish("", "rpc-requests", b"q%d" % i,
                          BasicProperties(reply_to=reply_q, correlation_id=f"id{i}"))
    import time
    deadline = time.monotonic() + 10
    while len(replies) < 3 and time.monotonic() < deadline:
        server.process_data_events(0.01)
        client.process_data_events(0.01)
    r["replies"] = replies
    # another connection may not use the exclusive queue
    r["other_conn_consume"] = attempt(server, lambda ch: ch.basic_consume(reply_q, lambda *a: None))
    r["other_conn_passive"] = attempt(server, lambda ch: ch.queue_declare(reply_q, passive=True).method.queue
                                      == reply_q)
    r["other_conn_delete"] = attempt(server, lambda ch: ch.queue_delete(reply_q))
    client.close()
    # the owner's connection is gone: the queue is gone
    deadline = time.monotonic() + 10
    gone: Any = None
    while time.monotonic() < deadline:
        gone = attempt(server, lambda ch: ch.queue_declare(reply_q, passive=True))
        if isinstance(gone, tuple):
            break
    r["after_close"] = (gone[0], gone[1].replace(reply_q, "Q")) if isinstance(gone, tuple) else gone
    for k in ("other_conn_consume", "other_conn_delete", "other_conn_passive"):
        v = r[k]
        if isinstance(v, tuple):
            r[k] = (v[0], v[1].replace(reply_q, "Q"))
    sch.queue_delete("rpc-requests")
    server.close()
    return r


def s_basic_consume_errors(port: int) -> dict[str, Any]:
    conn = connect(port)
    r: dict[str, Any] = {}
    attempt(conn, lambda ch: fresh(ch, "bc-q", QQ))
    attempt(conn, lambda ch: fresh(ch, "bc-classic", None))

    def global_qos(ch: Any) -> Any:
        ch.basic_qos(prefetch_count=10, global_qos=True)
        ch.basic_consume("bc-q", lambda *a: None)
        return "consumed"
    r["global_qos_quorum"] = conn_attempt(port, global_qos)

    def global_qos_classic(ch: Any) -> Any:
        ch.basic_qos(prefetch_count=10, global_qos=True)
        ch.basic_consume("bc-classic", lambda *a: None)
        return "consumed"
    r["global_qos_classic"] = attempt(conn, global_qos_classic)

    def exclusive(ch: Any) -> Any:
        ch.basic_consume("bc-q", lambda *a: None, exclusive=True)
        ch2 = conn.channel()
        try:
            ch2.basic_consume("bc-q", lambda *a: None)
        except ChannelClosedByBroker as e:
            return (e.reply_code, e.reply_text)
        return "both"
    r["exclusive_conflict"] = attempt(conn, exclusive)

    def exclusive_second(ch: Any) -> Any:
        ch.basic_consume("bc-q", lambda *a: None)
        ch.basic_consume("bc-q", lambda *a: None, exclusive=True)
        return "both"
    r["exclusive_when_used"] = attempt(conn, exclusive_second)

    def exclusive_classic(ch: Any) -> Any:
        ch.basic_consume("bc-classic", lambda *a: None, exclusive=True)
        ch2 = conn.channel()
        try:
            ch2.basic_consume("bc-classic", lambda *a: None)
        except ChannelClosedByBroker as e:
            return (e.reply_code, e.reply_text)
        return "both"
    r["exclusive_conflict_classic"] = attempt(conn, exclusive_classic)

    def exclusive_second_classic(ch: Any) -> Any:
        ch.basic_consume("bc-classic", lambda *a: None)
        ch.basic_consume("bc-classic", lambda *a: None, exclusive=True)
        return "both"
    r["exclusive_when_used_classic"] = attempt(conn, exclusive_second_classic)
    r["consume_missing"] = attempt(conn, lambda ch: ch.basic_consume("bc-none", lambda *a: None))
    r["get_missing"] = attempt(conn, lambda ch: ch.basic_get("bc-none"))
    r["ack_unknown"] = attempt(conn, lambda ch: (ch.basic_ack(99), ch.queue_declare("bc-q", passive=True))[0])
    r["bad_priority"] = attempt(conn, lambda ch: ch.basic_consume("bc-q", lambda *a: None,
                                                                  arguments={"x-priority": "high"}))


    def tx_then_confirm(ch: Any) -> Any:
        ch.tx_select()
        ch.confirm_delivery()
    r["tx_then_confirm"] = attempt(conn, tx_then_confirm)

    def confirm_then_tx(ch: Any) -> Any:
        ch.confirm_delivery()
        ch.tx_select()
    r["confirm_then_tx"] = attempt(conn, confirm_then_tx)
    r["commit_without_select"] = attempt(conn, lambda ch: ch.tx_commit())
    attempt(conn, lambda ch: ch.queue_delete("bc-q"))
    attempt(conn, lambda ch: ch.queue_delete("bc-classic"))
    conn.close()
    return r


def s_mandatory_and_confirms(port: int) -> dict[str, Any]:
    conn = connect(port)
    ch = conn.channel()
    returned: list[Any] = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append((m.reply_code, m.reply_text, m.exchange,
                                                                   m.routing_key, b.decode(), p.headers)))
    ch.confirm_delivery()
    r: dict[str, Any] = {}
    try:
        ch.basic_publish("amq.direct", "nobody", b"lost", BasicProperties(headers={"h": 1}), mandatory=True)
        r["publish"] = "confirmed"
    except UnroutableError as e:
        r["publish"] = [(m.method.reply_code, m.method.reply_text, m.body.decode()) for m in e.messages]
    ch.basic_publish("amq.direct", "nobody", b"dropped")  # not mandatory: confirmed, dropped
    conn.process_data_events(0)
    r["returned"] = returned
    conn.close()
    return r


def s_acks_and_redelivery(port: int) -> dict[str, Any]:
    conn = connect(port)
    ch = conn.channel()
    fresh(ch, "ar-q", QQ)
    ch.confirm_delivery()
    for i in range(6):
        ch.basic_publish("", "ar-q", b"m%d" % i)
    r: dict[str, Any] = {}
    tags = []
    for _ in range(6):
        m, _p, _b = ch.basic_get("ar-q")
        tags.append(m.delivery_tag)
    r["get_empty"] = ch.basic_get("ar-q")[0] is None
    ch.basic_ack(tags[1], multiple=True)            # m0, m1 acked
    ch.basic_nack(tags[3], multiple=True, requeue=True)  # m2, m3 back
    ch.basic_reject(tags[4], requeue=True)          # m4 back
    ch.basic_nack(tags[5], requeue=False)           # m5 dropped (no DLX)
    r["after_settle"] = drain_get(ch, "ar-q", ack=False)
    ch.basic_recover(requeue=True)                  # everything unacked goes back
    r["after_recover"] = drain_get(ch, "ar-q", ack=True)
    # consumer path: delivery tags are per channel, redelivered flag on requeue
    for i in range(2):
        ch.basic_publish("", "ar-q", b"c%d" % i)
    ch.basic_qos(prefetch_count=1)
    seen: list[Any] = []
    for method, props, body in ch.consume("ar-q", inactivity_timeout=10):
        assert method is not None
        seen.append((body.decode(), method.redelivered, (props.headers or {}).get("x-delivery-count")))
        if len(seen) == 1:
            ch.basic_reject(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)
        if len(seen) == 3:
            break
    ch.cancel()
    r["consumed"] = seen
    r["left"] = ch.queue_declare("ar-q", passive=True).method.message_count
    # get-ok's message_count, purge with unacked messages, recover(requeue=False) (refused),
    # nack of everything (tag 0, multiple), cancel of an unknown consumer tag
    for i in range(4):
        ch.basic_publish("", "ar-q", b"g%d" % i)
    gets = [ch.basic_get("ar-q") for _ in range(2)]
    r["get_ok_counts"] = [m.message_count for m, _p, _b in gets]
    r["purged"] = ch.queue_purge("ar-q").method.message_count  # the two unacked stay
    r["recover_no_requeue"] = conn_attempt(port, lambda c: c.basic_recover(requeue=False))
    ch.basic_nack(0, multiple=True, requeue=True)
    r["after_nack_all"] = drain_get(ch, "ar-q", ack=True)
    r["cancel_unknown"] = attempt(conn, lambda c: c.basic_cancel("no-such-tag"))
    ch.queue_delete("ar-q")
    conn.close()
    return r


def s_classic_redelivery(port: int) -> dict[str, Any]:
    """Classic queues: redelivered flag, no x-delivery-count header, no delivery limit."""
    conn = connect(port)
    ch = conn.channel()
    fresh(ch, "cr-q", None, durable=False)
    ch.confirm_delivery()
    ch.basic_publish("", "cr-q", b"c", BasicProperties(headers={"h": 1}))
    seen = []
    for _ in range(25):
        method, props, _body = ch.basic_get("cr-q")
        seen.append((method.redelivered, props.headers))
        ch.basic_nack(method.delivery_tag, requeue=True)
    # (basic.nack is asynchronous: a passive declare may count before the requeue,
    # but a basic.get on the same channel comes after it)
    method, props, _body = ch.basic_get("cr-q", auto_ack=True)
    r = {"first": seen[:2], "last": seen[-1], "final": (method.redelivered, props.headers),
         "left": ch.queue_declare("cr-q", passive=True).method.message_count}
    ch.queue_delete("cr-q")
    conn.close()
    return r


def s_classic_requeue_position(port: int) -> dict[str, Any]:
    """Classic queues put a requeued message back where it was ("placed to
    its original position in its queue", consumer acknowledgements guide),
    by nack, reject, recover and a channel closing with unacked messages."""
    conn = connect(port)
    ch = conn.channel()
    fresh(ch, "crp-q", None, durable=False)
    ch.confirm_delivery()
    for i in range(6):
        ch.basic_publish("", "crp-q", b"m%d" % i)
    tags = [ch.basic_get("crp-q")[0].delivery_tag for _ in range(4)]  # m0..m3 out
    ch.basic_nack(tags[2], requeue=True)
    ch.basic_reject(tags[0], requeue=True)
    r: dict[str, Any] = {"after_nack": drain_get(ch, "crp-q", ack=False)}
    ch.basic_recover(requeue=True)  # everything unacked on the channel
    out = []
    for _ in range(6):
        method, _props, body = ch.basic_get("crp-q")
        out.append((method.delivery_tag, body.decode(), method.redelivered))
    r["after_recover"] = [(b, red) for _t, b, red in out]
    for tag, body, _red in out:
        if body in ("m1", "m4"):
            ch.basic_ack(tag)
    ch.close()  # m0, m2, m3, m5 return
    held = conn.channel()
    r["held"] = [held.basic_get("crp-q")[2].decode() for _ in range(2)]
    ch = conn.channel()
    r["after_close"] = drain_get(ch, "crp-q", ack=True)
    held.close()
    r["after_held_close"] = drain_get(ch, "crp-q", ack=True)
    ch.queue_delete("crp-q")
    conn.close()
    return r


def s_dead_lettering(port: int) -> dict[str, Any]:
    conn = connect(port)
    ch = conn.channel()
    ch.exchange_delete("dl-x")
    ch.exchange_declare("dl-x", "direct")
    fresh(ch, "dl-target", QQ)
    ch.queue_bind("dl-target", "dl-x", "dead")
    fresh(ch, "dl-src", {**QQ, "x-dead-letter-exchange": "dl-x", "x-dead-letter-routing-key": "dead",
                         "x-max-length": 2})
    ch.confirm_delivery()
    for i in range(3):   # the third pushes m0 out (maxlen, drop-head)
        ch.basic_publish("", "dl-src", b"m%d" % i, BasicProperties(headers={"i": i}))
    m, _p, _b = ch.basic_get("dl-src")
    ch.basic_reject(m.delivery_tag, requeue=False)  # m1 rejected
    m, _p, _b = ch.basic_get("dl-src")
    ch.basic_ack(m.delivery_tag)  # m2 consumed: the queue is empty
    # quorum queues expire messages at the head only: on an empty queue this one
    # expires at once
    ch.basic_publish("", "dl-src", b"e", BasicProperties(expiration="0"))
    ch.basic_publish("", "dl-src", b"stays")
    wait_count(ch, "dl-target", 3)
    got = []
    for _ in range(3):
        method, props, body = ch.basic_get("dl-target", auto_ack=True)
        if method is None:
            break
        got.append((body.decode(), method.exchange, method.routing_key, death_summary(props.headers),
                    props.expiration))
    r = {"target": got, "src_left": [b for b, _, _ in drain_get(ch, "dl-src")]}
    conn.close()
    return r


def s_dead_letter_cycles(port: int) -> dict[str, Any]:
    """An automatic cycle (expired -> back to the same queue) is dropped; one
    with a rejection in it is not (rabbit_dead_letter cycle detection)."""
    conn = connect(port)
    ch = conn.channel()
    ch.exchange_delete("cy-fan")
    ch.exchange_declare("cy-fan", "fanout")
    fresh(ch, "cy-q", {**QQ, "x-message-ttl": 20, "x-dead-letter-exchange": "cy-fan"})
    fresh(ch, "cy-obs", QQ)
    ch.queue_bind("cy-q", "cy-fan")
    ch.queue_bind("cy-obs", "cy-fan")
    fresh(ch, "cy-r", {**QQ, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "cy-r"})
    ch.confirm_delivery()
    ch.basic_publish("", "cy-q", b"loop")
    wait_count(ch, "cy-obs", 1)
    conn.process_data_events(0.5)  # a looping broker would copy it to cy-obs ~every 20 ms
    r: dict[str, Any] = {"cycle": (ch.queue_declare("cy-q", passive=True).method.message_count,
                                   ch.queue_declare("cy-obs", passive=True).method.message_count)}
    ch.basic_publish("", "cy-r", b"rej")
    counts = []
    for _ in range(3):
        wait_count(ch, "cy-r", 1)
        m, p, _b = ch.basic_get("cy-r")
        counts.append([(d["reason"], d["count"]) for d in death_summary(p.headers)])
        ch.basic_reject(m.delivery_tag, requeue=False)
    r["rejected_cycle"] = counts
    for q in ("cy-q", "cy-obs", "cy-r"):
        ch.queue_delete(q)
    conn.close()
    return r


def s_ttl(port: int) -> dict[str, Any]:
    conn = connect(port)
    ch = conn.channel()
    fresh(ch, "ttl-dlq", QQ)
    fresh(ch, "ttl-q", {**QQ, "x-message-ttl": 50, "x-dead-letter-exchange": "",
                        "x-dead-letter-routing-key": "ttl-dlq"})
    ch.confirm_delivery()
    ch.basic_publish("", "ttl-q", b"queue-ttl")
    ch.basic_publish("", "ttl-q", b"msg-ttl", BasicProperties(expiration="10"))
    n = wait_count(ch, "ttl-dlq", 2)
    deaths = []
    for _ in range(n):
        method, props, body = ch.basic_get("ttl-dlq", auto_ack=True)
        deaths.append((body.decode(), [(d["reason"], d["queue"], d.get("original-expiration"))
                                       for d in death_summary(props.headers)]))
    r = {"dead": sorted(deaths), "left": ch.queue_declare("ttl-q", passive=True).method.message_count}
    conn.close()
    return r


def s_max_length(port: int) -> dict[str, Any]:
    conn = connect(port)
    ch = conn.channel()
    fresh(ch, "ml-drop", {**QQ, "x-max-length": 2})
    fresh(ch, "ml-reject", {**QQ, "x-max-length": 2, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    for i in range(4):
        ch.basic_publish("", "ml-drop", b"d%d" % i)
    outcomes = []
    for i in range(4):
        try:
            ch.basic_publish("", "ml-reject", b"r%d" % i)
            outcomes.append("ack")
        except pika.exceptions.NackError:
            outcomes.append("nack")
    r = {"drop_head": [b for b, _, _ in drain_get(ch, "ml-drop")], "reject_publish": outcomes,
         "rejected_kept": [b for b, _, _ in drain_get(ch, "ml-reject")]}
    # drained below the limit: publishes are accepted again
    again = []
    for i in range(3):
        try:
            ch.basic_publish("", "ml-reject", b"again%d" % i)
            again.append("ack")
        except pika.exceptions.NackError:
            again.append("nack")
    r["after_drain"] = again
    r["after_drain_kept"] = [b for b, _, _ in drain_get(ch, "ml-reject")]
    conn.close()
    return r


def s_single_active_consumer(port: int) -> dict[str, Any]:
    conn = connect(port)
    ch = conn.channel()
    fresh(ch, "sac-q", {**QQ, "x-single-active-consumer": True})
    ch.confirm_delivery()
    got: list[tuple[str, str]] = []
    c1 = conn.channel()
    c2 = conn.channel()
    c1.basic_consume("sac-q", lambda c, m, p, b: got.append(("c1", b.decode())), auto_ack=True,
                     consumer_tag="c1")
    c2.basic_consume("sac-q", lambda c, m, p, b: got.append(("c2", b.decode())), auto_ack=True,
                     consumer_tag="c2")
    for i in range(3):
        ch.basic_publish("", "sac-q", b"a%d" % i)
    import time
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        conn.process_data_events(0.01)
    c1.basic_cancel("c1")
    for i in range(2):
        ch.basic_publish("", "sac-q", b"b%d" % i)
    deadline = time.monotonic() + 10
    while len(got) < 5 and time.monotonic() < deadline:
        conn.process_data_events(0.01)
    r: dict[str, Any] = {"got": got}
    r["get_refused"] = attempt(conn, lambda ch2: ch2.basic_get("sac-q"))
    ch.queue_delete("sac-q")
    conn.close()
    return r


def s_cancel_notify(port: int) -> dict[str, Any]:
    conn = connect(port)
    ch = conn.channel()
    fresh(ch, "cn-q", QQ)
    cancelled: list[str] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    ch.basic_consume("cn-q", lambda *a: None, consumer_tag="watcher")
    other = conn.channel()
    other.queue_delete("cn-q")
    import time
    deadline = time.monotonic() + 10
    while not cancelled and time.monotonic() < deadline:
        conn.process_data_events(0.01)
    r = {"cancelled": cancelled, "channel_open": ch.is_open}
    conn.close()
    return r


def s_transactions(port: int) -> dict[str, Any]:
    conn = connect(port)
    ch = conn.channel()
    fresh(ch, "tx-q", QQ)
    ch.tx_select()
    ch.basic_publish("", "tx-q", b"rolled-back")
    r: dict[str, Any] = {"before_commit": ch.queue_declare("tx-q", passive=True).method.message_count}
    ch.tx_rollback()
    ch.basic_publish("", "tx-q", b"t1")
    ch.basic_publish("", "tx-q", b"t2")
    ch.tx_commit()
    r["after_commit"] = ch.queue_declare("tx-q", passive=True).method.message_count
    m, _p, _b = ch.basic_get("tx-q")
    ch.basic_ack(m.delivery_tag)
    ch.tx_rollback()   # the ack is undone: t1 stays unacked on this channel
    ch.basic_ack(m.delivery_tag)
    ch.tx_commit()
    r["after_ack_commit"] = [b for b, _, _ in drain_get(ch, "tx-q")]
    ch.tx_commit()
    ch.queue_delete("tx-q")
    conn.close()
    return r


def s_bad_acks(port: int) -> dict[str, Any]:
    """A settlement naming a tag that is not outstanding closes the channel
    (406) before any of it is applied: basic.ack `multiple` of a tag already
    acked while lower tags are outstanding, and an unknown tag inside a
    transaction after a good ack (checked at the method, not at tx.commit:
    the good ack is never applied). The counts after the close show what
    was settled."""
    conn = connect(port)
    ch = conn.channel()
    fresh(ch, "ba-q", QQ)
    ch.confirm_delivery()
    for i in range(4):
        ch.basic_publish("", "ba-q", b"m%d" % i)
    r: dict[str, Any] = {}

    def multiple_not_outstanding(c: Any) -> Any:
        tags = [c.basic_get("ba-q")[0].delivery_tag for _ in range(4)]
        c.basic_ack(tags[2])
        c.basic_ack(tags[2], multiple=True)
        return c.queue_declare("ba-q", passive=True).method.message_count
    r["multiple_not_outstanding"] = attempt(conn, multiple_not_outstanding)
    r["ready_after"] = wait_count(ch, "ba-q", 3)  # m2 acked; m0, m1, m3 back
    r["bodies_after"] = sorted(b for b, _, _ in drain_get(ch, "ba-q"))
    for i in range(2):
        ch.basic_publish("", "ba-q", b"t%d" % i)

    def tx_unknown_after_good(c: Any) -> Any:
        tags = [c.basic_get("ba-q")[0].delivery_tag for _ in range(2)]
        c.tx_select()
        c.basic_ack(tags[0])
        c.basic_ack(tags[1] + 7)
        c.tx_commit()
        return "committed"
    r["tx_unknown_tag"] = attempt(conn, tx_unknown_after_good)
    r["tx_ready_after"] = wait_count(ch, "ba-q", 2)  # the transaction's ack was never applied
    ch.queue_delete("ba-q")
    conn.close()
    return r


def s_recover_in_tx(port: int) -> dict[str, Any]:
    """basic.recover inside an open transaction returns the channel's
    unacked messages, but not those the transaction already acked (they
    are settled by its commit), as RabbitMQ does."""
    conn = connect(port)
    ch = conn.channel()
    fresh(ch, "rt-q", QQ)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", "rt-q", b"r%d" % i)
    c = conn.channel()
    tags = [c.basic_get("rt-q")[0].delivery_tag for _ in range(3)]
    c.tx_select()
    c.basic_ack(tags[0])
    c.basic_recover(requeue=True)
    r: dict[str, Any] = {"ready_after_recover": wait_count(ch, "rt-q", 2)}
    c.tx_commit()
    r["bodies"] = sorted(b for b, _, _ in drain_get(ch, "rt-q"))
    r["ready_end"] = wait_count(ch, "rt-q", 0)
    ch.queue_delete("rt-q")
    conn.close()
    return r


def s_consumer_priority(port: int) -> dict[str, Any]:
    conn = connect(port)
    ch = conn.channel()
    fresh(ch, "cp-q", QQ)
    ch.confirm_delivery()
    got: list[str] = []
    lo = conn.channel()
    hi = conn.channel()
    lo.basic_qos(prefetch_count=10)
    hi.basic_qos(prefetch_count=2)
    lo.basic_consume("cp-q", lambda c, m, p, b: got.append("lo"), arguments={"x-priority": 1})
    hi.basic_consume("cp-q", lambda c, m, p, b: got.append("hi"), arguments={"x-priority": 10})
    for i in range(4):
        ch.basic_publish("", "cp-q", b"%d" % i)
    import time
    deadline = time.monotonic() + 10
    while len(got) < 4 and time.monotonic() < deadline:
        conn.process_data_events(0.01)
    r = {"got": sorted(got)}
    ch.queue_delete("cp-q")
    conn.close()
    return r


def s_delivery_limit(port: int) -> dict[str, Any]:
    """An explicit x-delivery-limit (3.10 and 4.x alike): after `limit`
    redeliveries the next return dead-letters with reason delivery_limit."""
    conn = connect(port)
    ch = conn.channel()
    fresh(ch, "lim-dlq", QQ)
    fresh(ch, "lim-q", {**QQ, "x-delivery-limit": 2, "x-dead-letter-exchange": "",
                        "x-dead-letter-routing-key": "lim-dlq"})
    ch.confirm_delivery()
    ch.basic_publish("", "lim-q", b"poison", BasicProperties(headers={"keep": "me"}))
    seen = []
    for _ in range(5):
        method, props, _body = ch.basic_get("lim-q")
        if method is None:
            break
        seen.append((method.redelivered, (props.headers or {}).get("x-delivery-count")))
        ch.basic_nack(method.delivery_tag, requeue=True)
    wait_count(ch, "lim-dlq", 1)
    method, props, body = ch.basic_get("lim-dlq", auto_ack=True)
    headers = dict(props.headers or {})
    r = {"seen": seen, "dead": body.decode() if method else None, "keep": headers.get("keep"),
         "deaths": [(d["reason"], d["queue"], d["count"], d["exchange"], d["routing-keys"])
                    for d in death_summary(headers)],
         "dead_delivery_count": headers.get("x-delivery-count")}
    conn.close()
    return r


def s_bindings_and_auto_delete(port: int) -> dict[str, Any]:
    conn = connect(port)
    ch = conn.channel()
    r: dict[str, Any] = {}
    ch.exchange_delete("ad-x")
    ch.exchange_declare("ad-x", "direct", auto_delete=True)
    fresh(ch, "ad-q", QQ)
    ch.queue_bind("ad-q", "ad-x", "a")
    ch.queue_bind("ad-q", "ad-x", "b")
    ch.confirm_delivery()
    ch.basic_publish("ad-x", "a", b"1")
    ch.queue_unbind("ad-q", "ad-x", "a")
    try:
        ch.basic_publish("ad-x", "a", b"2", mandatory=True)
        r["after_unbind"] = "routed"
    except UnroutableError:
        r["after_unbind"] = "returned"
    r["unbind_missing"] = attempt(conn, lambda c: c.queue_unbind("ad-q", "ad-x", "never").method.NAME)
    ch.queue_unbind("ad-q", "ad-x", "b")   # last binding: the auto-delete exchange goes
    r["exchange_after_last_unbind"] = attempt(conn, lambda c: c.exchange_declare("ad-x", passive=True))
    r["ad_q"] = [b for b, _, _ in drain_get(ch, "ad-q")]
    # an auto-delete classic queue goes when its last consumer cancels, not before
    ch.queue_declare("ad-classic", auto_delete=True)
    r["before_consumer"] = attempt(conn, lambda c: c.queue_declare("ad-classic", passive=True).method.queue)
    tag = ch.basic_consume("ad-classic", lambda *a: None, auto_ack=True)
    ch.basic_cancel(tag)
    import time
    deadline = time.monotonic() + 10
    gone: Any = None
    while time.monotonic() < deadline:
        gone = attempt(conn, lambda c: c.queue_declare("ad-classic", passive=True).method.queue)
        if isinstance(gone, tuple):
            break
    r["after_cancel"] = gone
    # ... or when the consumer's channel closes
    ch.queue_declare("ad-classic2", auto_delete=True)
    cch = conn.channel()
    cch.basic_consume("ad-classic2", lambda *a: None)
    cch.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        gone = attempt(conn, lambda c: c.queue_declare("ad-classic2", passive=True).method.queue)
        if isinstance(gone, tuple):
            break
    r["after_channel_close"] = gone
    ch.queue_delete("ad-q")
    conn.close()
    return r


def plain(value: Any) -> Any:
    """Results made comparable: pika frames become 'ok:<Method>'."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    method = getattr(value, "method", None)
    if method is not None and hasattr(method, "NAME"):
        return f"ok:{method.NAME}"
    return value


def s_prefetch_per_consumer(port: int) -> dict[str, Any]:
    """basic.qos applies to consumers created after it; acks free credit."""
    conn = connect(port)
    ch = conn.channel()
    fresh(ch, "pf-q", QQ)
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", "pf-q", b"%d" % i)
    cch = conn.channel()
    got: dict[str, list[Any]] = {"a": [], "b": []}
    cch.basic_qos(prefetch_count=1)
    cch.basic_consume("pf-q", lambda c, m, p, b: got["a"].append(m.delivery_tag), consumer_tag="a")
    cch.basic_qos(prefetch_count=3)
    cch.basic_consume("pf-q", lambda c, m, p, b: got["b"].append(m.delivery_tag), consumer_tag="b")
    import time
    deadline = time.monotonic() + 10
    while len(got["a"]) + len(got["b"]) < 4 and time.monotonic() < deadline:
        conn.process_data_events(0.01)
    conn.process_data_events(0.2)  # nothing more may come: both are at their limit
    r: dict[str, Any] = {"first": (len(got["a"]), len(got["b"]))}
    cch.basic_ack(got["b"][-1], multiple=True)  # acks a's one too if it came first
    deadline = time.monotonic() + 10
    while len(got["a"]) + len(got["b"]) < 8 and time.monotonic() < deadline:
        conn.process_data_events(0.01)
    conn.process_data_events(0.2)
    r["after_ack"] = len(got["a"]) + len(got["b"])
    r["ready"] = ch.queue_declare("pf-q", passive=True).method.message_count
    ch.queue_delete("pf-q")
    conn.close()
    return r


def _same(r: Any) -> Any:
    return r


def _acks_to_4x(r: dict[str, Any]) -> dict[str, Any]:
    """4.x quorum queues have a delivery limit by default (20): a returned
    message then waits in the returns queue, served before the rest of the
    queue (quorum-queues guide, "Poison Message Handling"; rabbit_fifo). 3.10
    has no default limit and puts a returned message at the back. So the
    rejected c0 comes back before c1 on 4.x."""
    c = r["consumed"]
    return {**r, "consumed": [c[0], c[2], c[1]]}


def _delivery_limit_to_4x(r: dict[str, Any]) -> dict[str, Any]:
    """3.10 adds `x-delivery-count: 0` to first deliveries from a queue with a
    delivery limit; 4.x adds the header only once the count is above zero
    ("included with any redelivered message", quorum-queues guide, Poison
    Message Handling): a first delivery, and the dead-lettered copy's first
    delivery from the target queue, carry none."""
    seen = [(red, None if count == 0 else count) for red, count in r["seen"]]
    dead = r["dead_delivery_count"]
    return {**r, "seen": seen, "dead_delivery_count": None if dead == 0 else dead}


@dataclass(frozen=True)
class Scenario:
    fn: Callable[[int], Any]
    to_4x: Callable[[Any], Any] = _same


SCENARIOS = {s.fn.__name__[2:]: s for s in [
    Scenario(s_exchange_errors),
    Scenario(s_routing),
    Scenario(s_exchange_edges),
    Scenario(s_alternate_exchange),
    Scenario(s_queue_errors),
    Scenario(s_queue_arguments),
    Scenario(s_publish_checks_and_shortcuts),
    Scenario(s_redeclare_and_flow),
    Scenario(s_exclusive_and_temporaries),
    Scenario(s_basic_consume_errors),
    Scenario(s_mandatory_and_confirms),
    Scenario(s_acks_and_redelivery, _acks_to_4x),
    Scenario(s_classic_redelivery),
    Scenario(s_classic_requeue_position),
    Scenario(s_dead_lettering),
    Scenario(s_dead_letter_cycles),
    Scenario(s_ttl),
    Scenario(s_max_length),
    Scenario(s_single_active_consumer),
    Scenario(s_cancel_notify),
    Scenario(s_transactions),
    Scenario(s_bad_acks),
    Scenario(s_recover_in_tx),
    Scenario(s_consumer_priority),
    Scenario(s_prefetch_per_consumer),
    Scenario(s_delivery_limit, _delivery_limit_to_4x),
    Scenario(s_bindings_and_auto_delete),
]}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_same_as_rabbitmq(name: str, broker: BrokerProcess, rabbitmq_defs: int) -> None:
    scenario = SCENARIOS[name]
    theirs = plain(scenario.to_4x(scenario.fn(rabbitmq_defs)))
    ours = plain(scenario.fn(broker.port))
    assert ours == theirs

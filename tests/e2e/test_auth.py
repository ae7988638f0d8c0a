"""Users, vhosts and permissions from configuration (`load_definitions`,
`loopback_users`, `default_user`), against a real broker process and, where
the same definitions can be loaded, compared with RabbitMQ 3.10.

Rule for the default user/vhost (broker/runtime/definitions.py): with a
definitions file, a new cluster holds exactly what the file lists, as
RabbitMQ does ("Will not seed default virtual host and user: have
definitions to load" in its boot log); the file is applied once, when the
cluster is created (RabbitMQ re-imports on every boot unless
`definitions.skip_if_unchanged` is set: a documented difference).
"""
from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pika
import pytest
from pamqp import commands as C
from pamqp import frame as pframe

from broker import metadata as md
from broker.amqp.connection import ServerConfig
from broker.common.config import ConfigError, load_config
from broker.runtime.amqp_server import AmqpConnection
from broker.runtime.definitions import DefinitionsError, parse_definitions, read_definitions

from .broker_proc import BrokerProcess
from .conftest import DefsBrokerProcess
from .test_connection import HEADER, Wire, both, opened

LOGIN_REFUSED = ("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
                 "For details see the broker logfile.")


def _refused(kind: str, name: str, user: str = "alice", vhost: str = "/") -> str:
    return f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '{vhost}' refused for user '{user}'"


# ---------------------------------------------------------------- permissions
# alice: configure ^alice-, write ^(alice-|amq\.default$), read ^alice-  on '/'
def _alice(port: int, *steps: Any) -> tuple[Any, ...]:
    """Run raw methods as alice on channel 1; the channel.close they cause."""
    with opened(port, user="alice", password="alicepw") as w:
        w.open_channel()
        for step in steps:
            if isinstance(step, bytes):
                w.send(step)
            else:
                w.send_method(1, step)
        while True:  # skip the -ok replies of allowed steps
            ch, m = w.read()
            if isinstance(m, C.Connection.Close | C.Channel.Close):
                return ch, m.reply_code, m.reply_text, m.class_id, m.method_id


@pytest.mark.parametrize("steps,reply", [
    ((C.Queue.Declare(queue="x"),), (1, 403, _refused("queue", "x"), 50, 10)),
    ((C.Queue.Declare(queue="defs-qq", passive=True), C.Queue.Delete(queue="defs-qq")),
     (1, 403, _refused("queue", "defs-qq"), 50, 40)),
    ((C.Exchange.Declare(exchange="ex1", exchange_type="direct"),),
     (1, 403, _refused("exchange", "ex1"), 40, 10)),
    ((Wire.publish_frames("k", b"abc", exchange="amq.topic"),),
     (1, 403, _refused("exchange", "amq.topic"), 60, 40)),
    ((C.Basic.Get(queue="defs-qq"),), (1, 403, _refused("queue", "defs-qq"), 60, 70)),
    ((C.Basic.Consume(queue="defs-qq"),), (1, 403, _refused("queue", "defs-qq"), 60, 20)),
    ((C.Queue.Purge(queue="defs-qq"),), (1, 403, _refused("queue", "defs-qq"), 50, 30)),
    ((C.Queue.Declare(queue="alice-q1", exclusive=True),
      C.Queue.Bind(queue="alice-q1", exchange="amq.topic", routing_key="r")),
     (1, 403, _refused("exchange", "amq.topic"), 50, 20)),
    ((C.Queue.Bind(queue="defs-qq", exchange="amq.direct", routing_key="r"),),
     (1, 403, _refused("queue", "defs-qq"), 50, 20)),
], ids=["configure-queue", "delete-queue", "configure-exchange", "write-exchange", "read-get",
        "read-consume", "purge", "bind-read-exchange", "bind-write-queue"])
def test_permissions_refuse_with_rabbitmq_texts(defs_broker: BrokerProcess, rabbitmq_defs: int,
                                                steps: tuple[Any, ...], reply: tuple[Any, ...]) -> None:
    ours, theirs = both(defs_broker, rabbitmq_defs, lambda port: _alice(port, *steps))
    assert ours == theirs == reply


def test_permissions_allow_what_the_patterns_match(defs_broker: BrokerProcess, rabbitmq_defs: int) -> None:
    def scenario(port: int) -> tuple[Any, ...]:
        with opened(port, user="alice", password="alicepw") as w:
            w.open_channel()
            w.send_method(1, C.Queue.Declare(queue="alice-work", exclusive=True))
            w.expect(C.Queue.DeclareOk)
            w.send(Wire.publish_frames("alice-work", b"hello"))   # write on amq.default
            w.send_method(1, C.Basic.Get(queue="alice-work", no_ack=True))
            get_ok = w.expect(C.Basic.GetOk)
            w.frame()
            _, _, body = w.frame()
            return get_ok.routing_key, body, get_ok.message_count

    ours, theirs = both(defs_broker, rabbitmq_defs, scenario)
    assert ours == theirs == ("alice-work", b"hello", 0)


def test_pika_surfaces_permission_refusal(defs_broker: BrokerProcess) -> None:
    params = pika.ConnectionParameters("127.0.0.1", defs_broker.port,
                                       credentials=pika.PlainCredentials("alice", "alicepw"))
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("x")
        assert (info.value.reply_code, info.value.reply_text) == (403, _refused("queue", "x"))
        assert conn.is_open  # a channel error, not a connection error
    finally:
        conn.close()


# ---------------------------------------------------------------- definitions objects
def test_definitions_exchanges_queues_bindings_policies(defs_broker: BrokerProcess,
                                                        rabbitmq_defs: int) -> None:
    """defs-x -k-> defs-qq (a quorum queue) and the defs-lim policy
    (max-length 3, drop-head) came from the definitions file."""
    def scenario(port: int) -> tuple[Any, ...]:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_purge("defs-qq")
            ch.basic_publish("defs-x", "k", b"routed")
            ch.basic_publish("defs-x", "other", b"dropped")
            for i in range(5):
                ch.basic_publish("", "defs-lim", b"%d" % i)
            routed = ch.queue_declare("defs-qq", passive=True).method.message_count
            limited = ch.queue_declare("defs-lim", passive=True).method.message_count
            head = ch.basic_get("defs-lim", auto_ack=True)[2]
            ch.queue_purge("defs-lim")
            ch.queue_purge("defs-qq")
            # redeclaring with the same type is fine; x-queue-type mismatch is not
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                ch.queue_declare("defs-qq", durable=True, arguments={"x-queue-type": "classic"})
            return routed, limited, head, info.value.reply_code
        finally:
            conn.close()

    ours, theirs = both(defs_broker, rabbitmq_defs, scenario)
    assert ours == theirs == (1, 3, b"2", 406)


# ---------------------------------------------------------------- loopback users
def _non_loopback_ipv4() -> str | None:
    """A local address that is not loopback (the address of a real interface)."""
    for target in ("192.0.2.1", "10.255.255.255", "8.8.8.8"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((target, 9))  # UDP: no packet is sent
            except OSError:
                continue
            ip = s.getsockname()[0]
            if not ip.startswith("127."):
                return str(ip)
    return None


NON_LOOPBACK = _non_loopback_ipv4()


def _login_from(host: str, port: int, user: str, password: str) -> Any:
    with Wire(port, host=host) as w:
        w.start()
        w.login(user, password)
        ch, m = w.read()
        return type(m).__name__ if not hasattr(m, "reply_code") else (m.reply_code, m.reply_text)


if NON_LOOPBACK is not None:
    # The brokers listen on every interface; connecting to this host's own
    # non-loopback address makes the peer address non-loopback too.
    @pytest.mark.parametrize("user,password,expected", [
        ("guest", "guest", (403, LOGIN_REFUSED)),     # default loopback user
        ("carol", "carolpw", (403, LOGIN_REFUSED)),   # loopback_users.carol = true
        ("bob", "bobpw", "Tune"),                     # not listed: fine from anywhere
    ])
    def test_loopback_users_refused_from_a_non_loopback_address(
            defs_broker: BrokerProcess, rabbitmq_defs: int, user: str, password: str,
            expected: Any) -> None:
        assert NON_LOOPBACK is not None
        ours, theirs = both(defs_broker, rabbitmq_defs,
                            lambda port: _login_from(NON_LOOPBACK, port, user, password))
        assert ours == theirs == expected
        # ... while the same user may log in over loopback
        assert _login_from("127.0.0.1", defs_broker.port, user, password) == "Tune"

    @pytest.mark.parametrize("setting", ["loopback_users = none", "loopback_users.guest = false"])
    def test_empty_loopback_users_lets_guest_in_remotely(tmp_path: Path, setting: str) -> None:
        b = DefsBrokerProcess(tmp_path / "node", config=setting + "\n").start()
        try:
            assert NON_LOOPBACK is not None
            assert _login_from(NON_LOOPBACK, b.port, "guest", "guest") == "Tune"
        finally:
            b.kill()


class _FakeTransport(asyncio.Transport):
    def __init__(self, peer: tuple[str, int]) -> None:
        super().__init__()
        self.peer = peer
        self.data = b""
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def write(self, data: Any) -> None:
        self.data += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@pytest.mark.parametrize("peer,loopback_users,accepted", [
    ("10.1.2.3", ("guest",), False),
    ("::ffff:10.1.2.3", ("guest",), False),
    ("192.168.0.7", ("guest", "carol"), False),
    ("127.0.0.2", ("guest",), True),       # all of 127/8 is loopback
    ("::1", ("guest",), True),
    ("::ffff:127.0.0.1", ("guest",), True),
    ("10.1.2.3", (), True),                # loopback_users = none
])
async def test_login_path_checks_the_peer_address(peer: str, loopback_users: tuple[str, ...],
                                                  accepted: bool) -> None:
    """The runtime's own login path (AmqpConnection over the metadata state)
    with a peer address no test machine can produce for real."""
    state = md.initial_state(md.hash_password("guest", b"salt"))
    node = SimpleNamespace(amqp_config=ServerConfig(), connections=set(), meta=SimpleNamespace(state=state),
                           config={"loopback_users": loopback_users},
                           declarations=SimpleNamespace(connection_closed=lambda cid: None),
                           incarnation="test")
    conn = AmqpConnection(node)  # type: ignore[arg-type]
    transport = _FakeTransport((peer, 40000))
    conn.connection_made(transport)
    try:
        conn.data_received(HEADER)
        conn.data_received(pframe.marshal(C.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="PLAIN", response="\0guest\0guest", locale="en_US"), 0))
        frames = []
        data = transport.data
        while data:
            size = int.from_bytes(data[3:7], "big")
            frames.append(pframe.unmarshal(data[:8 + size])[2])
            data = data[8 + size:]
        assert isinstance(frames[0], C.Connection.Start)
        if accepted:
            assert isinstance(frames[1], C.Connection.Tune)
        else:
            assert isinstance(frames[1], C.Connection.Close)
            assert (frames[1].reply_code, frames[1].reply_text) == (403, LOGIN_REFUSED)
    finally:
        conn.connection_lost(None)


# ---------------------------------------------------------------- definitions at boot
def _write_defs(path: Path, users: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> None:
    doc = {"users": users, "vhosts": [{"name": "dv"}],
           "permissions": [{"user": u["name"], "vhost": "dv", "configure": ".*", "write": ".*",
                            "read": ".*"} for u in users]}
    doc.update(extra or {})
    path.write_text(json.dumps(doc))


def _connects(port: int, user: str, password: str, vhost: str) -> Any:
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, vhost, pika.PlainCredentials(user, password)))
    except (pika.exceptions.ProbableAuthenticationError, pika.exceptions.ProbableAccessDeniedError) as e:
        return str(e)
    conn.close()
    return "ok"


def test_definitions_without_guest_remove_the_default_user_and_vhost(tmp_path: Path) -> None:
    """A file listing only dave and vhost 'dv': guest cannot log in and vhost
    '/' does not exist. Applied once: a user added to the file later is not
    created at the next boot (the cluster already exists)."""
    defs = tmp_path / "defs.json"
    _write_defs(defs, [{"name": "dave", "password": "davepw", "tags": ["administrator"]}])
    b = BrokerProcess(tmp_path / "node", config=f"load_definitions = {defs}\n").start()
    try:
        assert _connects(b.port, "dave", "davepw", "dv") == "ok"
        assert "403" in _connects(b.port, "guest", "guest", "/")
        assert "NOT_ALLOWED - vhost / not found" in _connects(b.port, "dave", "davepw", "/")
        _write_defs(defs, [{"name": "dave", "password": "davepw"}, {"name": "erin", "password": "erinpw"}])
        b.stop()
        b.start()
        assert _connects(b.port, "dave", "davepw", "dv") == "ok"
        assert "403" in _connects(b.port, "erin", "erinpw", "dv")
    finally:
        b.kill()


def test_default_user_setting_without_definitions(tmp_path: Path) -> None:
    """Without definitions the cluster is seeded with default_user/default_pass
    on default_vhost (RabbitMQ's keys); guest then does not exist."""
    b = BrokerProcess(tmp_path / "node", config="default_user = admin\ndefault_pass = s3cret\n"
                                                "default_vhost = main\n").start()
    try:
        assert _connects(b.port, "admin", "s3cret", "main") == "ok"
        assert "403" in _connects(b.port, "guest", "guest", "main")
    finally:
        b.kill()


def test_invalid_definitions_stop_the_boot_with_a_clear_error(tmp_path: Path) -> None:
    """A command the metadata refuses stops the boot (exit status 2) naming it;
    no listener ever opens."""
    defs = tmp_path / "defs.json"
    defs.write_text(json.dumps({"permissions": [
        {"user": "nobody", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}))
    b = BrokerProcess(tmp_path / "node", config=f"load_definitions = {defs}\n")
    with pytest.raises(RuntimeError, match="broker exited with 2") as info:
        b.start()
    assert f"definitions file {defs}: SetPermissions refused: no user 'nobody'" in str(info.value)
    with pytest.raises(OSError):
        Wire(b.port, timeout=1).start()


@pytest.mark.parametrize("doc,message", [
    ({"users": [{"password": "x"}]}, "users[0]: missing 'name'"),
    ({"vhosts": [{"name": 7}]}, "vhosts[0]: 'name' must be a str, got 7"),
    ({"users": [{"name": "u", "password": "p", "hashing_algorithm": "md4"}]},
     "users[0]: unknown password hashing algorithm 'md4'"),
    ({"bindings": [{"vhost": "/", "source": "x", "destination": "q", "destination_type": "topic"}]},
     "bindings[0]: destination_type must be queue or exchange"),
    ([], "must be a JSON object"),
])
def test_definitions_parser_names_the_bad_item(doc: Any, message: str) -> None:
    with pytest.raises(DefinitionsError) as info:
        parse_definitions(doc, lambda: b"salt")
    assert message in str(info.value)


def test_definitions_file_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text("{not json")
    with pytest.raises(DefinitionsError, match="is not valid JSON"):
        read_definitions(str(path))
    with pytest.raises(DefinitionsError, match="cannot read definitions file"):
        read_definitions(str(tmp_path / "missing.json"))


# ---------------------------------------------------------------- configuration keys
@pytest.mark.parametrize("text,users", [
    ("", ("guest",)),
    ("loopback_users = none\n", ()),
    ("loopback_users =\n", ()),
    ("loopback_users.guest = false\n", ()),
    ("loopback_users.carol = true\n", ("guest", "carol")),
    ("loopback_users.guest = true\nloopback_users.carol = true\n", ("guest", "carol")),
    ("loopback_users.1 = bob\nloopback_users.2 = carol\n", ("bob", "carol")),
])
def test_loopback_users_config_spellings(text: str, users: tuple[str, ...]) -> None:
    """RabbitMQ's `loopback_users.NAME = true|false` and `loopback_users = none`,
    plus our numbered-list form."""
    assert load_config(text)["loopback_users"] == users


@pytest.mark.parametrize("text,message", [
    ("loopback_users.guest = maybe\n", "expected true or false"),
    ("loopback_users = bob\nloopback_users.guest = false\n", "given both by name and as a list"),
])
def test_loopback_users_config_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(text)


def test_load_definitions_key() -> None:
    assert load_config("")["load_definitions"] == ""
    assert load_config("load_definitions = /etc/qq/defs.json\n")["load_definitions"] == "/etc/qq/defs.json"
    assert load_config("", {"QQ__LOAD_DEFINITIONS": "/x.json"})["load_definitions"] == "/x.json"

"""Per-vhost and per-user limits (issue 15) on a real broker with pika,
managed through RabbitMQ's management API paths (/api/vhost-limits,
/api/user-limits). Reply codes and texts are RabbitMQ 3.10.8's: the same
pika scenarios were run against it (limits set with its management API) and
its answers copied here. The limits across a cluster are in
tests/cluster/test_limits.py."""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pika
import pika.exceptions
import pytest

from tests.mgmt.conftest import Api

from .broker_proc import BrokerProcess, free_port


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, Api]]:
    b = BrokerProcess(tmp_path_factory.mktemp("limits") / "node", management_port=free_port(),
                      config="loopback_users = none\n").start()
    api = Api(b.management_port)
    assert api.put("/api/vhosts/lim-v2")[0] in (201, 204)
    assert api.put("/api/users/limuser", {"password": "pw", "tags": ""})[0] in (201, 204)
    for vhost in ("%2F", "lim-v2"):
        for user in ("guest", "limuser"):
            assert api.put(f"/api/permissions/{vhost}/{user}",
                           {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
    yield b, api
    b.stop()


def connect(b: BrokerProcess, vhost: str = "/", user: str = "guest",
            password: str = "guest") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", b.port, vhost, pika.PlainCredentials(user, password)))


def refused(b: BrokerProcess, vhost: str = "/", user: str = "guest",
            password: str = "guest") -> tuple[int, str]:
    """The connection.close a refused connection.open got."""
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as err:
        connect(b, vhost, user, password)
    # pika reports the close as text: 'ConnectionClosedByBroker: (530) "NOT_ALLOWED - ..."'
    found = re.fullmatch(r'ConnectionClosedByBroker: \((\d+)\) (["\'])(.*)\2', str(err.value.args[0]))
    assert found, err.value
    return int(found.group(1)), found.group(3)


def set_limit(api: Api, kind: str, owner: str, name: str, value: int) -> None:
    status, body = api.put(f"/api/{kind}-limits/{quote(owner, safe='')}/{name}", {"value": value})
    assert status == 204, body


def clear_limit(api: Api, kind: str, owner: str, name: str) -> None:
    assert api.delete(f"/api/{kind}-limits/{quote(owner, safe='')}/{name}")[0] == 204


def publish_confirmed(conn: pika.BlockingConnection, queue: str) -> None:
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"m", mandatory=True)
    ch.close()


def test_vhost_max_connections(limited: tuple[BrokerProcess, Api]) -> None:
    b, api = limited
    set_limit(api, "vhost", "/", "max-connections", 1)
    first = connect(b)
    assert refused(b) == (530, "NOT_ALLOWED - access to vhost '/' refused for user 'guest': "
                               "connection limit (1) is reached")
    other = connect(b, "lim-v2")  # another vhost is not limited
    publish_confirmed(first, "lim-vc-q")  # the connection inside the limit works
    set_limit(api, "vhost", "/", "max-connections", 0)  # 0: none allowed (open ones stay)
    assert refused(b) == (530, "NOT_ALLOWED - access to vhost '/' refused for user 'guest': "
                               "connection limit (0) is reached")
    assert first.is_open
    set_limit(api, "vhost", "/", "max-connections", -1)  # negative: no limit
    connect(b).close()
    set_limit(api, "vhost", "/", "max-connections", 1)
    first.close()  # a closed connection frees its place
    second = connect(b)
    clear_limit(api, "vhost", "/", "max-connections")
    connect(b).close()
    second.close()
    other.close()


def test_user_max_connections(limited: tuple[BrokerProcess, Api]) -> None:
    b, api = limited
    set_limit(api, "user", "limuser", "max-connections", 1)
    first = connect(b, user="limuser", password="pw")
    assert refused(b, "lim-v2", "limuser", "pw") == (
        530, "NOT_ALLOWED - connection refused for user 'limuser': user connection limit (1) is reached")
    guest = connect(b)  # another user is not limited
    set_limit(api, "user", "limuser", "max-connections", 0)
    assert refused(b, user="limuser", password="pw") == (
        530, "NOT_ALLOWED - connection refused for user 'limuser': user connection limit (0) is reached")
    publish_confirmed(first, "lim-uc-q")
    clear_limit(api, "user", "limuser", "max-connections")
    connect(b, user="limuser", password="pw").close()
    first.close()
    guest.close()


def test_user_max_channels_closes_the_connection_with_530(limited: tuple[BrokerProcess, Api]) -> None:
    b, api = limited
    set_limit(api, "user", "limuser", "max-channels", 2)
    conn = connect(b, user="limuser", password="pw")
    conn.channel()
    conn.channel()
    guest = connect(b)
    guest_channels = [guest.channel() for _ in range(3)]  # guest has no limit
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        conn.channel()
    assert (err.value.reply_code, err.value.reply_text) == (
        530, "NOT_ALLOWED - number of channels opened for user 'limuser' has reached the "
             "maximum allowed user limit of (2)")
    assert not conn.is_open and guest.is_open and all(ch.is_open for ch in guest_channels)
    # the refused connection's channels are gone: the user may open two again
    conn = connect(b, user="limuser", password="pw")
    conn.channel()
    publish_confirmed(conn, "lim-ch-q")  # a second channel, closed again
    set_limit(api, "user", "limuser", "max-channels", 0)
    conn2 = connect(b, user="limuser", password="pw")  # connecting is allowed, a channel not
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        conn2.channel()
    assert err.value.reply_text.endswith("maximum allowed user limit of (0)")
    clear_limit(api, "user", "limuser", "max-channels")
    conn.channel()
    conn.channel()
    conn.close()
    guest.close()


def test_vhost_max_queues(limited: tuple[BrokerProcess, Api]) -> None:
    b, api = limited
    conn = connect(b, "lim-v2")
    ch = conn.channel()
    set_limit(api, "vhost", "lim-v2", "max-queues", 1)
    ch.queue_declare("lim-q1", durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_declare("lim-q1", durable=True, arguments={"x-queue-type": "quorum"})  # redeclare
    ch.queue_declare("lim-q1", passive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare("lim-q2", durable=True, arguments={"x-queue-type": "quorum"})
    assert (err.value.reply_code, err.value.reply_text) == (
        406, "PRECONDITION_FAILED - cannot declare queue 'lim-q2': queue limit in vhost 'lim-v2' "
             "(1) is reached")
    assert conn.is_open  # a channel error only
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare("", exclusive=True)  # server-named queues count too
    assert err.value.reply_code == 406 and "amq.gen-" in err.value.reply_text
    # the management API's declarations are refused the same way
    status, body = api.put("/api/queues/lim-v2/lim-q3", {"durable": True})
    assert status == 400 and "queue limit in vhost 'lim-v2' (1) is reached" in body["reason"]
    # another vhost is not limited
    other = connect(b).channel()
    other.queue_declare("lim-other-1", durable=True)
    other.queue_declare("lim-other-2", durable=True)
    # deleting a queue makes room; lifting the limit allows any number
    ch = conn.channel()
    ch.queue_delete("lim-q1")
    ch.queue_declare("lim-q2", durable=True, arguments={"x-queue-type": "quorum"})
    set_limit(api, "vhost", "lim-v2", "max-queues", -1)
    ch.queue_declare("lim-q4", durable=True)
    set_limit(api, "vhost", "lim-v2", "max-queues", 0)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare("lim-q5", durable=True)
    assert err.value.reply_text.endswith("queue limit in vhost 'lim-v2' (0) is reached")
    clear_limit(api, "vhost", "lim-v2", "max-queues")
    ch = conn.channel()
    ch.queue_declare("lim-q5", durable=True)
    for q in ("lim-q2", "lim-q4", "lim-q5"):
        ch.queue_delete(q)
    conn.close()


def test_management_api_shapes_and_refusals(limited: tuple[BrokerProcess, Api]) -> None:
    _b, api = limited
    assert api.get("/api/vhost-limits") == (200, [])
    assert api.get("/api/user-limits") == (200, [])
    set_limit(api, "vhost", "/", "max-queues", 5)
    set_limit(api, "vhost", "/", "max-connections", 100)
    set_limit(api, "user", "limuser", "max-channels", 3)
    assert api.get("/api/vhost-limits") == (
        200, [{"vhost": "/", "value": {"max-queues": 5, "max-connections": 100}}])
    assert api.get("/api/vhost-limits/%2F") == api.get("/api/vhost-limits")
    assert api.get("/api/vhost-limits/lim-v2") == (200, [])
    assert api.get("/api/user-limits/limuser") == (200, [{"user": "limuser", "value": {"max-channels": 3}}])
    assert api.get("/api/user-limits/guest") == (200, [])
    assert api.get("/api/users/limuser")[1]["limits"] == {"max-channels": 3}
    # refusals: RabbitMQ's validation texts as 400s, unknown vhosts/users as 404s
    for path, body, status, reason in (
        ("/api/vhost-limits/%2F/max-queues", {"value": "x"}, 400,
         'max-queues should be a number, actually was <<"x">>'),
        ("/api/vhost-limits/%2F/max-queues", {"value": 1.5}, 400,
         "max-queues should be a number, actually was 1.5"),
        ("/api/vhost-limits/%2F/max-queues", {}, 400, "'value' is required"),
        ("/api/vhost-limits/%2F/max-foo", {"value": 1}, 400,
         'Unrecognised terms [{<<"max-foo">>,1}] in limits'),
        ("/api/user-limits/limuser/max-queues", {"value": 1}, 400,
         'Unrecognised terms [{<<"max-queues">>,1}] in user-limits'),
        ("/api/vhost-limits/nope/max-queues", {"value": 1}, 404, "no vhost 'nope'"),
        ("/api/user-limits/nope/max-channels", {"value": 1}, 404, "no user 'nope'"),
    ):
        got = api.put(path, body)
        assert got[0] == status and got[1]["reason"] == reason, (path, got)
    assert api.get("/api/vhost-limits/nope")[0] == 404
    assert api.get("/api/user-limits/nope")[0] == 404
    assert api.as_user("limuser", "pw").put("/api/vhost-limits/%2F/max-queues", {"value": 1})[0] in (401, 403)
    for path in ("/api/vhost-limits/%2F/max-queues", "/api/vhost-limits/%2F/max-connections",
                 "/api/vhost-limits/%2F/max-connections",  # again: still 204
                 "/api/user-limits/limuser/max-channels"):
        assert api.delete(path)[0] == 204
    assert api.get("/api/vhost-limits") == (200, [])
    assert api.get("/api/user-limits") == (200, [])


def test_limits_survive_a_restart(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "node", management_port=free_port()).start()
    try:
        api = Api(b.management_port)
        set_limit(api, "vhost", "/", "max-queues", 0)
        set_limit(api, "user", "guest", "max-channels", 0)
        b.stop()
        b.start()
        assert api.get("/api/vhost-limits") == (200, [{"vhost": "/", "value": {"max-queues": 0}}])
        assert api.get("/api/user-limits") == (200, [{"user": "guest", "value": {"max-channels": 0}}])
        conn = connect(b)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
            conn.channel()
        assert err.value.reply_code == 530
        clear_limit(api, "user", "guest", "max-channels")
        ch = connect(b).channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err2:
            ch.queue_declare("restart-q", durable=True)
        assert err2.value.reply_code == 406
    finally:
        b.kill()


def test_qqctl_sets_lists_and_clears_limits(limited: tuple[BrokerProcess, Api]) -> None:
    import io
    import json

    from broker import cli

    b, api = limited

    def qqctl(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(["--url", api.base, *args], out, err)
        return code, out.getvalue(), err.getvalue()

    assert qqctl("set_vhost_limits", "-p", "lim-v2", '{"max-connections": 4, "max-queues": 9}')[0] == 0
    assert qqctl("set_user_limits", "limuser", '{"max-channels": 3}')[0] == 0
    assert api.get("/api/vhost-limits/lim-v2")[1] == [
        {"vhost": "lim-v2", "value": {"max-connections": 4, "max-queues": 9}}]
    code, out, _ = qqctl("--json", "list_user_limits", "--username", "limuser")
    assert code == 0 and json.loads(out) == [{"user": "limuser", "limits": '{"max-channels": 3}'}]
    code, out, _ = qqctl("list_vhost_limits")
    assert code == 0 and "lim-v2" in out and '"max-queues": 9' in out
    code, _, err = qqctl("set_vhost_limits", '{"max-foo": 1}')
    assert code == 1 and 'Unrecognised terms [{<<"max-foo">>,1}] in limits' in err
    assert qqctl("set_vhost_limits", "[1]")[0] == 2
    assert qqctl("clear_vhost_limits", "max-queues", "-p", "lim-v2")[0] == 0
    assert api.get("/api/vhost-limits/lim-v2")[1] == [{"vhost": "lim-v2", "value": {"max-connections": 4}}]
    assert qqctl("clear_vhost_limits", "-p", "lim-v2")[0] == 0
    assert qqctl("clear_user_limits", "limuser", "all")[0] == 0
    assert api.get("/api/vhost-limits") == (200, []) and api.get("/api/user-limits") == (200, [])
    connect(b, "lim-v2", "limuser", "pw").close()


#: RabbitMQ 3.10.8's export with limits set (GET /api/definitions, trimmed):
#: user limits in users[].limits, vhost limits as a "vhost-limits" parameter
RABBITMQ_EXPORT = {
    "rabbit_version": "3.10.8",
    "users": [{"name": "guest", "password_hash": "5lFZCHRmsbqe3mV9J8H9xqDmzbYg5gwtaMgf9c5oLZRZNeeD",
               "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["administrator"],
               "limits": {"max-channels": 1, "max-connections": 2}},
              {"name": "free", "password": "pw", "tags": [], "limits": {}}],
    "vhosts": [{"name": "/"}, {"name": "cleared"}],
    "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
    "parameters": [{"value": {"max-queues": 0}, "vhost": "/", "component": "vhost-limits",
                    "name": "limits"},
                   {"value": [], "vhost": "cleared", "component": "vhost-limits", "name": "limits"}],
}


def test_definitions_import_rabbitmqs_export_of_limits(tmp_path: Path) -> None:
    import json

    path = tmp_path / "defs.json"
    path.write_text(json.dumps(RABBITMQ_EXPORT))
    b = BrokerProcess(tmp_path / "node", management_port=free_port(),
                      config=f"load_definitions = {path}\n").start()
    try:
        api = Api(b.management_port)
        assert api.get("/api/vhost-limits") == (200, [{"vhost": "/", "value": {"max-queues": 0}}])
        assert api.get("/api/user-limits") == (
            200, [{"user": "guest", "value": {"max-channels": 1, "max-connections": 2}}])
        conn = connect(b)
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare("defs-q")
        assert err.value.reply_code == 406
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err2:
            conn.channel()
            conn.channel()  # the closed channel freed its place: the second one is over
        assert err2.value.reply_code == 530
    finally:
        b.kill()


@pytest.mark.parametrize(("doc", "message"), [
    ({"users": [{"name": "u", "limits": {"max-queues": 1}}]},
     'users[0]: Unrecognised terms [{<<"max-queues">>,1}] in user-limits'),
    ({"users": [{"name": "u", "limits": {"max-channels": "x"}}]},
     'users[0]: max-channels should be a number, actually was <<"x">>'),
    ({"vhosts": [{"name": "v", "limits": 5}]}, "vhosts[0]: 'limits' must be an object, got 5"),
    ({"parameters": [{"component": "vhost-limits", "vhost": "/", "value": {"max-queues": 1.5}}]},
     "parameters[0]: max-queues should be a number, actually was 1.5"),
])
def test_definitions_with_bad_limits_are_refused(doc: dict[str, object], message: str) -> None:
    from broker.runtime.definitions import DefinitionsError, parse_definitions

    with pytest.raises(DefinitionsError) as err:
        parse_definitions(doc, lambda: b"salt")
    assert str(err.value) == message


def test_definitions_plan_sets_limits_after_their_vhost_and_user() -> None:
    from broker import metadata as md
    from broker.runtime.definitions import parse_definitions

    plan = parse_definitions({**RABBITMQ_EXPORT, "vhosts": [{"name": "/", "limits": {"max-connections": 3}}]},
                             lambda: b"salt")
    kinds = [type(c).__name__ for c in plan.commands]
    assert kinds.index("SetVhostLimit") > kinds.index("AddVhost")
    assert kinds.index("SetUserLimit") > kinds.index("AddUser")
    assert md.SetVhostLimit(md.VhostName("/"), "max-connections", 3) in plan.commands
    assert md.SetVhostLimit(md.VhostName("/"), "max-queues", 0) in plan.commands


def test_node_connection_max(tmp_path: Path) -> None:
    """`connection_max`: the node's own limit, whatever the vhost and user.
    The reply is RabbitMQ 4.x's (rabbit_reader at connection.open); 3.10.8
    only caps its listener's acceptors, and answered a third connection with
    connection_max = 2 normally."""
    b = BrokerProcess(tmp_path / "node", config="connection_max = 2\n").start()
    try:
        first, second = connect(b), connect(b)
        assert refused(b) == (530, "NOT_ALLOWED - connection refused: node connection limit (2) is reached")
        publish_confirmed(first, "node-cm-q")  # the connections inside the limit work
        assert first.is_open and second.is_open
        first.close()  # a closed connection frees its place
        third = connect(b)
        assert refused(b)[0] == 530
        third.close()
        second.close()
        assert "node connection limit (2) is reached" in b.log()
    finally:
        b.stop()

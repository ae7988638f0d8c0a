"""Declarations (runtime/declarations.py) with the real metadata machine and
a fake node: no process, no Raft; every command is applied to a metadata
state the way the metadata group would apply it."""
from __future__ import annotations

import asyncio
from typing import Any

from broker import metadata as md
from broker.common.config import load_config
from broker.runtime.declarations import Declarations


class FakeHost:
    def __init__(self, nodes: tuple[str, ...] = ("n1", "n2", "n3"), **config: str) -> None:
        self.node_name = nodes[0]
        self.nodes = nodes
        self.config = load_config("".join(f"{k} = {v}\n" for k, v in config.items()))
        self.state = md.new_state()
        self.index = 0
        self.executed: list[Any] = []
        self._do(md.Bootstrap(md.hash_password("guest", b"salt"), md.UserName("guest"),
                              md.VhostName("/")))

    def _do(self, cmd: Any) -> Any:
        self.index += 1
        self.state, reply, _effects = md.apply(md.CommandMeta(self.index, 1000 + self.index),
                                               cmd, self.state)
        return reply

    @property
    def meta_state(self) -> md.MetadataState:
        return self.state

    async def meta_execute(self, cmd: Any) -> Any:
        self.executed.append(cmd)
        return self._do(cmd)

    def cluster_nodes(self) -> tuple[str, ...]:
        return self.nodes

    def peer_connected(self, node: str) -> bool:
        return True

    def queue(self, vhost: str, name: str) -> Any:
        return None

    async def wait_for_leader(self, q: Any, vhost: str, name: str) -> None:
        pass

    async def commands_settled(self, uid: Any, timeout: float = 5.0) -> None:
        pass


def declare(d: Declarations, name: str, **kw: Any) -> Any:
    args = {"durable": True, "exclusive_owner": None, "auto_delete": False, "arguments": {},
            "passive": False, "server_named": False, **kw}
    return asyncio.run(d.declare_queue("/", name, **args))


def test_a_quorum_queue_is_placed_on_three_nodes_here_first() -> None:
    host = FakeHost()
    reply = declare(Declarations(host), "q1", arguments={"x-queue-type": "quorum"})
    assert not isinstance(reply, md.MetadataError), reply
    record = host.state.queues[("/", "q1")]
    assert record.type == "quorum" and record.members[0] == "n1" and len(record.members) == 3
    assert record.leader == "n1"


def test_the_default_queue_type_applies_to_durable_shared_queues_only() -> None:
    host = FakeHost(default_queue_type="quorum")
    d = Declarations(host)
    declare(d, "shared")
    declare(d, "temp", exclusive_owner="conn-1", durable=False)
    declare(d, "ad", auto_delete=True)
    types = {n: host.state.queues[("/", n)].type for n in ("shared", "temp", "ad")}
    assert types == {"shared": "quorum", "temp": "classic", "ad": "classic"}


def test_invalid_quorum_arguments_are_a_406_reply_before_any_command() -> None:
    host = FakeHost()
    reply = declare(Declarations(host), "bad", arguments={"x-queue-type": "quorum",
                                                           "x-max-length": "lots"})
    assert isinstance(reply, md.MetadataError) and reply.code == 406
    assert reply.reply_text.startswith("PRECONDITION_FAILED - invalid arg 'x-max-length'")
    assert host.executed == []  # refused here: nothing reached the metadata


def test_a_classic_queues_dead_letter_target_of_the_wrong_type_is_a_406() -> None:
    """RabbitMQ 3.10's replies (checked against it): the types of a classic
    queue's x-dead-letter-exchange and -routing-key are checked as a quorum
    queue's are. Kept, an int exchange name stopped the declaring node's
    metadata group on the compiled build (the queue's configuration is typed)."""
    host = FakeHost()
    d = Declarations(host)
    cases = [({"x-dead-letter-exchange": 5}, "invalid type 'signedint' for arg "
              "'x-dead-letter-exchange' in queue 'cq' in vhost '/'"),
             ({"x-dead-letter-exchange": "ok", "x-dead-letter-routing-key": 7},
              "invalid arg 'x-dead-letter-routing-key' for queue 'cq' in vhost '/': "
              "{unacceptable_type,signedint}")]
    for args, text in cases:
        reply = declare(d, "cq", arguments=args)
        assert isinstance(reply, md.MetadataError)
        assert (reply.code, reply.text) == (406, text)
    assert not host.executed and ("/", "cq") not in host.state.queues
    ok = declare(d, "cq", arguments={"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "rk"})
    assert not isinstance(ok, md.MetadataError), ok
    assert host.state.queues[("/", "cq")].type == "classic"


def test_a_redeclaration_with_other_arguments_is_refused_by_the_metadata() -> None:
    host = FakeHost()
    d = Declarations(host)
    declare(d, "q", arguments={"x-queue-type": "quorum", "x-max-length": 10})
    reply = declare(d, "q", arguments={"x-queue-type": "quorum", "x-max-length": 20})
    assert isinstance(reply, md.MetadataError) and reply.code == 406


def test_exclusive_queues_go_with_their_connection() -> None:
    host = FakeHost()
    d = Declarations(host)

    async def run() -> None:
        await d.declare_queue("/", "mine", durable=False, exclusive_owner="conn-7",
                              auto_delete=False, arguments={}, passive=False, server_named=False)
        d.connection_closed("conn-8")  # not its owner: nothing
        d.connection_closed("conn-7")
        await asyncio.sleep(0)  # the background deletion runs
        await asyncio.sleep(0)
    asyncio.run(run())
    assert ("/", "mine") not in host.state.queues
    assert [type(c).__name__ for c in host.executed] == ["DeclareQueue", "DeleteExclusiveQueues"]


def test_server_named_queues_are_amq_gen() -> None:
    names = {Declarations.server_queue_name() for _ in range(50)}
    assert len(names) == 50 and all(n.startswith("amq.gen-") for n in names)

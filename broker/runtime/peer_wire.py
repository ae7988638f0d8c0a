"""Peer messages between nodes: tagged dataclasses and their one codec.

Where it sits: `runtime/cluster.py` sends and receives these over the peer
transport (`runtime/transport.py`: authenticated, batched, length-prefixed
msgpack frames). On the wire a message is a msgpack array, its one-letter
tag first, then its fields in declaration order:

    Hello         ["h", incarnation]               sent first on every (re)connect
    RaftMessage   ["r", raft message]              one Raft message (its group inside)
    QueueRequest  ["q", req_id, vhost, queue, payload]
                                                   a queue command for the leader
    QueueReply    ["a", req_id, status, reply]     its reply ("ok"|"not_leader"|"error")
    Deliveries    ["d", vhost, queue, channel, tag, [deliveries], {index: message}]
    Join          ["j", node_name, host, port]     let this node into the cluster
    Call          ["i", call_id, op, args]         a node-local question (NodeCalls.serve_call)
    CallReply     ["o", call_id, ok, value]        its answer (or the error's text)
    AlarmState    ["w", [resources]]               the sender's resource alarms
                                                   ("disk", "memory"; runtime/alarms.py)
    Ping          ["p", 0]                         "I am alive" (every 0.5 s): a peer
                                                   silent for 2 s is suspected down
    Quiesce       ["z", group, term, commit]       the sender, leader of `group` in
                                                   `term`, went quiet at `commit`
                                                   (runtime/quiesce.py)
    StillQuiet    ["k", [group]]                   the groups the sender still leads
                                                   quietly with the receiver as a
                                                   member (every 2 s): a quiet
                                                   follower of the sender whose
                                                   group is not listed wakes

`decode` refuses anything else with `PeerMessageError` (an unknown tag, the
wrong number of fields): a peer's garbage is dropped with a log line, never
half-interpreted.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, ClassVar


class PeerMessageError(ValueError):
    """Not a peer message this node understands."""


@dataclass(frozen=True, slots=True)
class Hello:
    TAG: ClassVar[str] = "h"
    incarnation: str


@dataclass(frozen=True, slots=True)
class RaftMessage:
    TAG: ClassVar[str] = "r"
    message: Any  # runtime/raft_wire.py's encoding


@dataclass(frozen=True, slots=True)
class QueueRequest:
    TAG: ClassVar[str] = "q"
    req_id: int
    vhost: str
    queue: str
    payload: Any  # a queue payload (runtime/wire.py) or a membership control


@dataclass(frozen=True, slots=True)
class QueueReply:
    TAG: ClassVar[str] = "a"
    req_id: int
    status: str  # "ok" | "not_leader" | "error"
    value: Any


@dataclass(frozen=True, slots=True)
class Deliveries:
    TAG: ClassVar[str] = "d"
    vhost: str
    queue: str
    channel: str
    tag: str
    deliveries: list[Any]
    bodies: dict[int, Any]


@dataclass(frozen=True, slots=True)
class Join:
    TAG: ClassVar[str] = "j"
    node_name: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class Call:
    TAG: ClassVar[str] = "i"
    call_id: int
    op: str
    args: Any


@dataclass(frozen=True, slots=True)
class CallReply:
    TAG: ClassVar[str] = "o"
    call_id: int
    ok: bool
    value: Any


@dataclass(frozen=True, slots=True)
class AlarmState:
    TAG: ClassVar[str] = "w"
    resources: list[str]


@dataclass(frozen=True, slots=True)
class Ping:
    TAG: ClassVar[str] = "p"
    zero: int = 0  # every message has a field (the codec's shape)


@dataclass(frozen=True, slots=True)
class Quiesce:
    TAG: ClassVar[str] = "z"
    group: str
    term: int
    commit: int


@dataclass(frozen=True, slots=True)
class StillQuiet:
    TAG: ClassVar[str] = "k"
    groups: list[str]


PeerMessage = (Hello | RaftMessage | QueueRequest | QueueReply | Deliveries | Join | Call | CallReply
               | AlarmState | Ping | Quiesce | StillQuiet)

_TYPES: tuple[type, ...] = (Hello, RaftMessage, QueueRequest, QueueReply, Deliveries, Join, Call,
                            CallReply, AlarmState, Ping, Quiesce, StillQuiet)
_BY_TAG: dict[str, tuple[type, tuple[str, ...]]] = {
    t.TAG: (t, tuple(f.name for f in fields(t))) for t in _TYPES  # type: ignore[attr-defined]
}


def _encoder(tag: str, names: tuple[str, ...]) -> Callable[[Any], list[Any]]:
    get = attrgetter(*names)
    if len(names) == 1:
        return lambda msg: [tag, get(msg)]
    return lambda msg: [tag, *get(msg)]


# Raft messages and deliveries go through here: one attrgetter call per message
_ENCODERS: dict[type, Callable[[Any], list[Any]]] = {
    t: _encoder(tag, names) for tag, (t, names) in _BY_TAG.items()}


def encode(msg: PeerMessage) -> list[Any]:
    """The wire form: [tag, field values...]."""
    return _ENCODERS[type(msg)](msg)


def decode(raw: Any) -> PeerMessage:
    """A received array back into its message; PeerMessageError if it is none."""
    if type(raw) is not list or not raw:
        raise PeerMessageError(f"not a tagged array: {type(raw).__name__}")
    found = _BY_TAG.get(raw[0]) if isinstance(raw[0], str) else None
    if found is None:
        raise PeerMessageError(f"unknown peer message tag {raw[0]!r}")
    cls, names = found
    if len(raw) != len(names) + 1:
        raise PeerMessageError(f"{cls.__name__}: {len(names)} fields expected, got {len(raw) - 1}")
    msg: PeerMessage = cls(*raw[1:])
    return msg


__all__ = ["AlarmState", "Call", "CallReply", "Deliveries", "Hello", "Join", "PeerMessage", "PeerMessageError",
           "Ping", "QueueReply", "QueueRequest", "Quiesce", "RaftMessage", "StillQuiet", "decode",
           "encode"]

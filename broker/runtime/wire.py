"""Log-entry payload codecs used by the runtime: metadata commands, and the
queue entry format (this module is its one owner; nothing else builds or
takes apart a queue payload).

Queue log entries (a quorum queue's Raft entries, a durable classic queue's
node-local log) are msgpack ``[timestamp_ms, payload]``; the payload is one of
  enqueue: ["E", publisher, seq, size, priority, expiration_ms,
            properties_raw, body, exchange, routing_key]
  batch:   ["B", [enqueue payload, ...]]   (2 to `qm.BATCH_MAX` enqueues)
  settle:  ["S", channel_ref, consumer_tag, [msg_ids]]
  other:   ["C", encode_command(cmd)]
The enqueue entry *is* the message: deliveries read it back by its key, the
entry's index and the enqueue's position in it (`queue_message`). Enqueue,
batch and settle payloads hold only msgpack scalars (`is_plain`): a proposer
may apply its own payload without decoding it again, and applies exactly
what a replica decodes.

Where it sits: between the pure machines' command dataclasses and the bytes
Raft replicates. Metadata commands are frozen dataclasses holding strings,
numbers, tuples and `FrozenTable`s; they are encoded as
``[class name, [field values...]]`` with the value codec of
`broker.metadata.snapshot` (tables as maps, tuples as arrays). AMQP field values that
msgpack cannot carry natively (Decimal, datetime) are converted with ext types.
"""
from __future__ import annotations

import datetime
import decimal
from dataclasses import fields
from typing import Any

import msgpack

import broker.metadata as md
import broker.metadata.commands as mdc
import broker.queue as qm
from broker.common.packing import packb
from broker.metadata.snapshot import decode_value, encode_value
from broker.queue.commands import Enqueue, Settle
from broker.queue.types import BATCH_MAX, ChannelRef, ConsumerId

_EXT_DECIMAL = 1
_EXT_DATETIME = 2

_META_COMMANDS: dict[str, type] = {
    name: obj for name, obj in vars(mdc).items()
    if isinstance(obj, type) and name in md.__all__ and hasattr(obj, "__dataclass_fields__")
}


def _default(obj: object) -> msgpack.ExtType:
    if isinstance(obj, decimal.Decimal):
        return msgpack.ExtType(_EXT_DECIMAL, str(obj).encode())
    if isinstance(obj, datetime.datetime):
        return msgpack.ExtType(_EXT_DATETIME, str(obj.timestamp()).encode())
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _ext_hook(code: int, data: bytes) -> decimal.Decimal | datetime.datetime | msgpack.ExtType:
    if code == _EXT_DECIMAL:
        return decimal.Decimal(data.decode())
    if code == _EXT_DATETIME:
        return datetime.datetime.fromtimestamp(float(data.decode()), tz=datetime.UTC)
    return msgpack.ExtType(code, data)


def pack(obj: object) -> bytes:
    out = packb(obj, _default)
    return out


def unpack(data: bytes) -> Any:  # msgpack-decoded: its shape is the caller's to check
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)


def encode_meta_command(cmd: md.Command) -> list[Any]:
    name = type(cmd).__name__
    if name not in _META_COMMANDS:
        raise TypeError(f"not a metadata command: {cmd!r}")
    return [name, [encode_value(getattr(cmd, f.name)) for f in fields(cmd)]]


def decode_meta_command(raw: list[Any]) -> md.Command:
    """A metadata command from its log entry; fields added since the entry was
    written (trailing, with defaults) take their defaults."""
    name, values = raw
    cls = _META_COMMANDS[name]
    names = [f.name for f in fields(cls)]
    if len(values) > len(names):
        raise ValueError(f"{name}: {len(names)} fields expected, got {len(values)}")
    cmd: md.Command = cls(**{n: decode_value(v) for n, v in zip(names, values, strict=False)})
    return cmd


# ---------------------------------------------------------------- queue entries
ENQUEUE, BATCH, SETTLE, COMMAND = "E", "B", "S", "C"
_PLAIN = frozenset({ENQUEUE, BATCH, SETTLE})

#: (properties_raw, body, exchange, routing_key): what an enqueue entry holds
QueueMessage = tuple[bytes, bytes, str, str]


def enqueue_payload(publisher: str | None, seq: int, props_raw: bytes, body: bytes, exchange: str,
                    routing_key: str, priority: int | None, expiration_ms: int | None,
                    size: int | None = None) -> list[Any]:
    """An enqueue: the machine's Enqueue fields, then the message itself."""
    return [ENQUEUE, publisher, seq, len(body) if size is None else size, priority,
            expiration_ms, props_raw, body, exchange, routing_key]


def enqueue_size(payload: list[Any]) -> int:
    """The body size an enqueue payload declares."""
    size: int = payload[3]
    return size


def batch_payload(enqueues: list[list[Any]]) -> list[Any]:
    """One entry for several enqueue payloads, applied in this order at
    positions 0, 1, ... (`batch_items`)."""
    if not 1 < len(enqueues) <= BATCH_MAX:
        raise ValueError(f"a batch holds 2 to {BATCH_MAX} enqueues, not {len(enqueues)}")
    return [BATCH, enqueues]


def batch_items(payload: list[Any]) -> list[list[Any]] | None:
    """The enqueue payloads of a batch payload, or None for any other payload."""
    if payload and payload[0] == BATCH:
        items: list[list[Any]] = payload[1]
        if not 1 < len(items) <= BATCH_MAX or not all(is_enqueue(p) for p in items):
            raise ValueError(f"bad batch payload of {len(items)} items")
        return items
    return None


def renumbered(payload: list[Any], publisher: str, seq: int) -> list[Any]:
    """The same enqueue under another publisher identity and number."""
    return [payload[0], publisher, seq, *payload[3:]]


def settle_payload(consumer: ConsumerId, msg_ids: list[int] | tuple[int, ...]) -> list[Any]:
    return [SETTLE, consumer.channel, consumer.tag, list(msg_ids)]


def command_payload(cmd: qm.Command) -> list[Any]:
    return [COMMAND, qm.encode_command(cmd)]


def payload_for(cmd: qm.Command) -> list[Any]:
    """The payload of a machine command other than an enqueue: a settle in its
    compact plain form (the hot one), anything else encoded."""
    if type(cmd) is Settle:
        return settle_payload(cmd.consumer, cmd.msg_ids)
    return command_payload(cmd)


def is_enqueue(payload: list[Any]) -> bool:
    return bool(payload) and payload[0] == ENQUEUE


def is_command(payload: list[Any]) -> bool:
    return bool(payload) and payload[0] == COMMAND


def is_plain(payload: Any) -> bool:
    """Made of msgpack scalars only (enqueue, settle): see the module doc."""
    return type(payload) is list and bool(payload) and payload[0] in _PLAIN


def enqueue_properties(payload: list[Any]) -> bytes:
    """The raw content properties of an enqueue payload."""
    props: bytes = payload[6]
    return props


def queue_command(payload: list[Any]) -> tuple[qm.Command, QueueMessage | None]:
    """The machine command a payload carries, and the message for an enqueue."""
    tag = payload[0]
    if tag == ENQUEUE:
        _, publisher, seq, size, priority, expiration, props, body, exchange, rk = payload
        return Enqueue(publisher, seq, size, priority, expiration), (props, body, exchange, rk)
    if tag == SETTLE:
        return Settle(ConsumerId(ChannelRef(payload[1]), payload[2]), tuple(payload[3])), None
    if tag == COMMAND:
        return qm.decode_command(payload[1]), None
    raise ValueError(f"not a queue payload: {tag!r}")


def entry_payload(entry_data: bytes) -> list[Any]:
    """The payload of a stored queue entry (`[timestamp, payload]`)."""
    _ts, payload = unpack(entry_data)
    if type(payload) is not list or not payload:
        raise ValueError("entry is not a queue payload")
    return payload


def payload_message(payload: list[Any], pos: int = 0) -> QueueMessage:
    """The message at `pos` of an enqueue (pos 0) or batch payload. Only that
    message is checked (a batch's are all checked when it is applied:
    `batch_items`), so reading a batch's messages in turn stays linear."""
    if payload[0] == BATCH:
        items = payload[1]
        if not 0 <= pos < len(items):
            raise ValueError(f"batch entry of {len(items)} has no position {pos}")
        payload = items[pos]
    elif pos != 0:
        raise ValueError(f"entry is not a batch: no position {pos}")
    if not is_enqueue(payload):
        raise ValueError(f"entry is not an enqueue at position {pos}: {payload[:1]!r}")
    _, _p, _s, _size, _prio, _exp, props, body, exchange, rk = payload
    return (props, body, exchange, rk)


def queue_message(entry_data: bytes, pos: int = 0) -> QueueMessage:
    """The message at `pos` of an enqueue or batch entry (stored `[timestamp, payload]`)."""
    return payload_message(entry_payload(entry_data), pos)

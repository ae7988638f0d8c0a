"""Identifiers and frozen AMQP field-table values for the metadata machine.

Sits at the bottom of `broker.metadata`: every other module (state, commands,
machine, routing, permissions, policies, snapshot) builds on these names.
Nothing here does I/O.

Field tables (queue/exchange/binding arguments, message headers) arrive as
dicts from the AMQP codec. Records and commands are frozen, so tables are
stored *frozen*: a sorted tuple of ``(key, value)`` pairs whose nested tables
are `FrozenTable` and nested arrays are tuples. `freeze_table`/`thaw_table`
convert; freezing is canonical, so two equal tables freeze to equal values.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NewType, TypeAlias

VhostName = NewType("VhostName", str)
UserName = NewType("UserName", str)
ExchangeName = NewType("ExchangeName", str)
QueueName = NewType("QueueName", str)
NodeName = NewType("NodeName", str)
PolicyName = NewType("PolicyName", str)

ExchangeType: TypeAlias = Literal["direct", "fanout", "topic", "headers"]
EXCHANGE_TYPES: frozenset[str] = frozenset({"direct", "fanout", "topic", "headers"})
QueueType: TypeAlias = Literal["classic", "quorum"]
QUEUE_TYPES: frozenset[str] = frozenset({"classic", "quorum"})
DestinationKind: TypeAlias = Literal["queue", "exchange"]
PermissionKind: TypeAlias = Literal["configure", "write", "read"]
ApplyTo: TypeAlias = Literal["queues", "classic_queues", "quorum_queues", "exchanges", "all"]
APPLY_TO: tuple[str, ...] = ("queues", "classic_queues", "quorum_queues", "exchanges", "all")
QueueStatus: TypeAlias = Literal["running", "deleting"]

FieldValue: TypeAlias = Any
"""An AMQP field value: None (void), bool, int, float, str, bytes, tuple (array)
or `FrozenTable` (nested table) once frozen."""


@dataclass(frozen=True, slots=True)
class FrozenTable:
    """A nested field table, frozen. Invariant: `items` sorted by key, keys unique."""

    items: tuple[tuple[str, FieldValue], ...]


Arguments: TypeAlias = tuple[tuple[str, FieldValue], ...]
"""A frozen top-level field table. Invariant: sorted by key, keys unique."""

NO_ARGUMENTS: Arguments = ()


def freeze_value(value: FieldValue) -> FieldValue:
    if isinstance(value, FrozenTable):
        return value
    if isinstance(value, Mapping):
        return FrozenTable(freeze_table(value))
    if isinstance(value, (list, tuple)):
        return tuple(freeze_value(v) for v in value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def freeze_table(table: Mapping[str, FieldValue] | Arguments | None) -> Arguments:
    """Canonical frozen form of a field table (a dict, or an already-frozen one)."""
    if not table:
        return NO_ARGUMENTS
    if isinstance(table, tuple):
        pairs = list(table)
    else:
        pairs = list(table.items())
    out: dict[str, FieldValue] = {}
    for key, value in pairs:
        if not isinstance(key, str):
            raise TypeError(f"field table keys must be str, got {key!r}")
        out[key] = freeze_value(value)
    return tuple(sorted(out.items(), key=lambda kv: kv[0]))


def thaw_value(value: FieldValue) -> FieldValue:
    if isinstance(value, FrozenTable):
        return thaw_table(value.items)
    if isinstance(value, tuple):
        return [thaw_value(v) for v in value]
    return value


def thaw_table(args: Arguments) -> dict[str, FieldValue]:
    """A plain (mutable) dict copy of a frozen table."""
    return {k: thaw_value(v) for k, v in args}


def lookup(args: Arguments, key: str) -> FieldValue | None:
    for k, v in args:
        if k == key:
            return v
    return None


def has_key(args: Arguments, key: str) -> bool:
    return any(k == key for k, _ in args)


def without_key(args: Arguments, key: str) -> Arguments:
    return tuple((k, v) for k, v in args if k != key)


def with_key(args: Arguments, key: str, value: FieldValue) -> Arguments:
    rest = [(k, v) for k, v in args if k != key]
    return tuple(sorted([*rest, (key, freeze_value(value))], key=lambda kv: kv[0]))

"""Raft messages <-> msgpack-friendly lists, for the peer transport.

Where it sits: `Node.send_raft` encodes a `broker.raft` message with
`encode_message` before handing it to the transport; the receiving node
decodes it with `decode_message` and steps the group named in `msg.group`.

Format: ``[type code, field values in declaration order]`` where entries are
``[term, index, kind, data]``, a snapshot meta is ``[index, term, voters,
learners]``. Field order is the dataclass order, so both ends must run the
same message definitions (one cluster runs one version).
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from broker.raft import (
    AppendEntries,
    Entry,
    EntryKind,
    Index,
    InstallSnapshot,
    Membership,
    Message,
    NodeId,
    SnapshotMeta,
    Term,
)
from broker.raft.types import MESSAGE_TYPES

_CODE = {cls: i for i, cls in enumerate(MESSAGE_TYPES)}
_FIELDS = {cls: tuple(f.name for f in fields(cls)) for cls in MESSAGE_TYPES}
_KINDS = {k.value: k for k in EntryKind}


class WireError(ValueError):
    """A peer sent something that is not a Raft message of this version."""


def _meta(m: SnapshotMeta) -> list[Any]:
    return [m.index, m.term, sorted(m.config.voters), sorted(m.config.learners)]


def _unmeta(raw: list[Any]) -> SnapshotMeta:
    index, term, voters, learners = raw
    return SnapshotMeta(Index(index), Term(term),
                        Membership(frozenset(NodeId(v) for v in voters),
                                   frozenset(NodeId(v) for v in learners)))


def encode_message(msg: Message) -> list[Any]:
    cls = type(msg)
    out: list[Any] = [_CODE[cls]]
    for name in _FIELDS[cls]:
        v = getattr(msg, name)
        if name == "entries":
            v = [[e.term, e.index, int(e.kind), e.data] for e in v]
        elif name == "meta":
            v = _meta(v)
        out.append(v)
    return out


def decode_message(raw: Any) -> Message:
    try:
        cls = MESSAGE_TYPES[raw[0]]
        names = _FIELDS[cls]
        values = raw[1:]
        if len(values) != len(names):
            raise WireError(f"{cls.__name__}: {len(values)} fields, expected {len(names)}")
        kw = dict(zip(names, values, strict=True))
        if cls is AppendEntries:
            kw["entries"] = [Entry(Term(t), Index(i), _KINDS[k], d) for t, i, k, d in kw["entries"]]
        elif cls is InstallSnapshot:
            kw["meta"] = _unmeta(kw["meta"])
        msg: Message = cls(**kw)
        return msg
    except WireError:
        raise
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        raise WireError(f"undecodable raft message: {exc}") from None

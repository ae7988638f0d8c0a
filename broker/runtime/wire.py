"""Log-entry payload codecs used by the runtime.

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

from broker import metadata as md
from broker.metadata import commands as mdc
from broker.metadata.snapshot import decode_value, encode_value

_EXT_DECIMAL = 1
_EXT_DATETIME = 2

_META_COMMANDS: dict[str, type] = {
    name: obj for name, obj in vars(mdc).items()
    if isinstance(obj, type) and name in md.__all__ and hasattr(obj, "__dataclass_fields__")
}


def _default(obj: Any) -> Any:
    if isinstance(obj, decimal.Decimal):
        return msgpack.ExtType(_EXT_DECIMAL, str(obj).encode())
    if isinstance(obj, datetime.datetime):
        return msgpack.ExtType(_EXT_DATETIME, str(obj.timestamp()).encode())
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_DECIMAL:
        return decimal.Decimal(data.decode())
    if code == _EXT_DATETIME:
        return datetime.datetime.fromtimestamp(float(data.decode()), tz=datetime.UTC)
    return msgpack.ExtType(code, data)


def pack(obj: Any) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True, default=_default)
    return out


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)


def encode_meta_command(cmd: Any) -> list[Any]:
    name = type(cmd).__name__
    if name not in _META_COMMANDS:
        raise TypeError(f"not a metadata command: {cmd!r}")
    return [name, [encode_value(getattr(cmd, f.name)) for f in fields(cmd)]]


def decode_meta_command(raw: list[Any]) -> Any:
    name, values = raw
    cls = _META_COMMANDS[name]
    names = [f.name for f in fields(cls)]
    return cls(**{n: decode_value(v) for n, v in zip(names, values, strict=True)})

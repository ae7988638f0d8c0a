"""Typed replies for refused operations, carrying AMQP meaning and RabbitMQ's text.

Where it sits: every handler in `machine`, plus `routing`, `permissions` and
`policies`, returns a `MetadataError` (as data, never raised) when a client
asks for something RabbitMQ would refuse. The AMQP layer turns it into a
channel.close (or connection.close when `hard`) with `reply_code` and
`reply_text`; the management API maps the code to an HTTP status.

Texts marked "verified" in tests/metadata were checked against RabbitMQ 3.10.
Exceptions are for bugs only: `InvalidCommand` (a caller built a malformed
command) and `MetadataInvariantError` (the state itself is inconsistent).
"""
from __future__ import annotations

from dataclasses import dataclass

from .types import FieldValue, FrozenTable

ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
COMMAND_INVALID = 503
NOT_ALLOWED = 530
INTERNAL_ERROR = 541

CODE_NAMES: dict[int, str] = {
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    COMMAND_INVALID: "COMMAND_INVALID",
    NOT_ALLOWED: "NOT_ALLOWED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}
# AMQP 0-9-1 hard (connection-level) errors among the codes we use.
HARD_CODES = frozenset({COMMAND_INVALID, NOT_ALLOWED, INTERNAL_ERROR})


@dataclass(frozen=True, slots=True)
class MetadataError:
    """A refusal: `reply_text` is what goes on the wire, e.g.
    ``NOT_FOUND - no exchange 'x' in vhost '/'``."""

    code: int
    text: str

    @property
    def name(self) -> str:
        return CODE_NAMES[self.code]

    @property
    def reply_text(self) -> str:
        return f"{self.name} - {self.text}"

    @property
    def hard(self) -> bool:
        """True when AMQP requires closing the connection, not just the channel."""
        return self.code in HARD_CODES

    def __str__(self) -> str:
        return f"{self.code} {self.reply_text}"


class InvalidCommand(ValueError):
    """A command was built with malformed fields (the caller's bug, not the client's)."""


class MetadataInvariantError(RuntimeError):
    """The metadata state broke one of its invariants; stop this Raft group."""


# -- text helpers ------------------------------------------------------------------


def rs(kind: str, name: str, vhost: str) -> str:
    """RabbitMQ's rabbit_misc:rs/1: ``queue 'q' in vhost '/'``."""
    return f"{kind} '{name}' in vhost '{vhost}'"


def not_found(kind: str, name: str, vhost: str) -> MetadataError:
    return MetadataError(NOT_FOUND, f"no {rs(kind, name, vhost)}")


def no_vhost(vhost: str) -> MetadataError:
    return MetadataError(NOT_FOUND, f"no vhost '{vhost}'")


def default_exchange_refused() -> MetadataError:
    return MetadataError(ACCESS_REFUSED, "operation not permitted on the default exchange")


def erl(value: FieldValue) -> str:
    """Format a value the way Erlang's ~tp prints the decoded JSON/AMQP term
    (used by RabbitMQ's policy validation messages)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '<<"' + value.replace("\\", "\\\\").replace('"', '\\"') + '">>'
    if isinstance(value, bytes):
        return "<<" + ",".join(str(b) for b in value) + ">>"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, FrozenTable):
        return "[" + ",".join("{" + erl(k) + "," + erl(v) + "}" for k, v in value.items) + "]"
    if isinstance(value, dict):
        return "[" + ",".join("{" + erl(k) + "," + erl(v) + "}" for k, v in value.items()) + "]"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(erl(v) for v in value) + "]"
    return repr(value)


def amqp_type(value: FieldValue) -> str:
    """RabbitMQ's field-table type name for a Python value as pika-style codecs
    encode it (ints fitting 32 bits travel as 'signedint', larger as 'long')."""
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, (str, bytes)):
        return "longstr"
    if isinstance(value, FrozenTable):
        return "table"
    if isinstance(value, (list, tuple)):
        return "array"
    return type(value).__name__


def type_class(value: FieldValue) -> str:
    """rabbit_misc:type_class/1: all integer encodings compare as one class."""
    t = amqp_type(value)
    return "int" if t in ("signedint", "long") else t


def plain(value: FieldValue) -> str:
    """A value inside quotes in an equivalence message (``'10'``, ``'true'``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, FrozenTable):
        return erl(value)
    return str(value)


def typed(value: FieldValue | None, present: bool) -> str:
    """rabbit_misc val/1: ``none`` or ``the value '10' of type 'signedint'``."""
    if not present:
        return "none"
    return f"the value '{plain(value)}' of type '{amqp_type(value)}'"

"""AMQP 0-9-1 reply codes and typed errors.

Pipeline position: shared by the codec (`codec`, `tables`) and the connection
state machine (`connection`). Codec functions raise `FrameDecodeError` for
bytes that cannot be parsed; the state machine turns every protocol violation
into an `AMQPConnectionError` or `AMQPChannelError` carrying RabbitMQ's reply
code and text, and sends the matching `connection.close` / `channel.close`.
Server logic (queues, exchanges) may raise the same two exceptions and hand
them to `ServerConnection.fail()`.
"""

from __future__ import annotations

import enum


class ReplyCode(enum.IntEnum):
    """Reply codes of AMQP 0-9-1 (names as RabbitMQ prints them in reply texts)."""

    REPLY_SUCCESS = 200
    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    CONNECTION_FORCED = 320
    INVALID_PATH = 402
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541


# Codes that are channel-level (soft) errors; everything >= 500 (and 320, 402)
# closes the whole connection.
CHANNEL_LEVEL_CODES = frozenset({311, 312, 313, 403, 404, 405, 406})

MAX_REPLY_TEXT = 255  # reply-text is a shortstr


def reply_text(code: int, detail: str) -> str:
    """RabbitMQ's reply-text format: ``"NOT_FOUND - no queue 'q' in vhost '/'"``.

    Truncated to 255 UTF-8 bytes (a shortstr) without splitting a character.
    """
    try:
        name = ReplyCode(code).name
    except ValueError:
        name = str(code)
    text = f"{name} - {detail}" if detail else name
    raw = text.encode("utf-8")
    if len(raw) > MAX_REPLY_TEXT:
        text = raw[:MAX_REPLY_TEXT].decode("utf-8", "ignore")
    return text


def erlang_binary(data: bytes, limit: int = 48) -> str:
    """Render bytes as Erlang prints a binary (``<<"abc">>`` or ``<<0,60,0>>``),
    as RabbitMQ does in FRAME_ERROR texts. Long payloads are cut at `limit`
    bytes with ``...`` so the reply text stays inside its 255-byte budget."""
    cut = data[:limit]
    tail = "..." if len(data) > limit else ""
    if cut and all(32 <= b < 127 for b in cut):
        body = cut.decode("ascii").replace("\\", "\\\\").replace('"', '\\"')
        return f'<<"{body}"{tail}>>'
    return "<<" + ",".join(str(b) for b in cut) + tail + ">>"


class AMQPError(Exception):
    """Base of every error raised by broker.amqp."""


class FrameDecodeError(AMQPError):
    """Bytes that do not parse as the AMQP structure they should be (the peer's fault)."""


class AMQPProtocolError(AMQPError):
    """A protocol error with its reply code, full reply text and the offending method ids."""

    def __init__(self, code: int, detail: str, class_id: int = 0, method_id: int = 0) -> None:
        self.code = int(code)
        self.text = reply_text(code, detail)
        self.class_id = class_id
        self.method_id = method_id
        super().__init__(self.text)


class AMQPConnectionError(AMQPProtocolError):
    """A hard error: the whole connection is closed with `connection.close`."""


class AMQPChannelError(AMQPProtocolError):
    """A soft error: only the channel is closed with `channel.close`."""


class ProtocolStateError(AMQPError):
    """The local server code used the state machine wrongly (our bug, not the peer's),
    e.g. `accept_login()` when no login is pending."""

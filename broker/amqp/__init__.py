"""Sans-I/O AMQP 0-9-1: codec and connection/channel state machines.

Pipeline position: socket bytes -> `ServerConnection` (connection.py) ->
events (events.py) -> broker logic -> `ServerConnection.send_*` -> bytes.
The codec (codec.py, tables.py) has a struct-based fast path for publish,
deliver, ack/nack, get-ok, return and content frames, and uses pamqp for the
other methods. See docs/amqp.md.
"""

from .codec import (
    FRAME_MIN_SIZE,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    PropertiesCache,
    decode_content_header,
    decode_method,
    decode_properties,
    decode_publish,
    encode_ack,
    encode_content,
    encode_deliver,
    encode_get_ok,
    encode_method,
    encode_nack,
    encode_properties,
    encode_return,
)
from .connection import (
    RABBITMQ_CAPABILITIES,
    ChannelState,
    ConnectionState,
    ServerConfig,
    ServerConnection,
    TickResult,
)
from .errors import (
    AMQPChannelError,
    AMQPConnectionError,
    AMQPError,
    AMQPProtocolError,
    FrameDecodeError,
    ProtocolStateError,
    ReplyCode,
    reply_text,
)
from .events import (
    CLOSED,
    NEED_DATA,
    PAUSED,
    Ack,
    ChannelClose,
    ChannelCloseOk,
    ChannelFlow,
    ChannelOpen,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionLost,
    ConnectionOpen,
    ConnectionStartOk,
    ConnectionTerminated,
    ConnectionTuneOk,
    Event,
    Heartbeat,
    MethodReceived,
    Nack,
    ProtocolHeaderReceived,
    Publish,
    Reject,
)
from .tables import get_header_raw, long_long_value, set_header_raw, validate_properties

__all__ = [
    "CLOSED", "FRAME_MIN_SIZE", "HEARTBEAT_FRAME", "NEED_DATA", "PAUSED", "PROTOCOL_HEADER",
    "RABBITMQ_CAPABILITIES", "AMQPChannelError", "AMQPConnectionError", "AMQPError",
    "AMQPProtocolError", "Ack", "ChannelClose", "ChannelCloseOk", "ChannelFlow",
    "ChannelOpen", "ChannelState", "ConnectionClose", "ConnectionCloseOk",
    "ConnectionLost", "ConnectionOpen", "ConnectionStartOk", "ConnectionState",
    "ConnectionTerminated", "ConnectionTuneOk", "Event", "FrameDecodeError", "Heartbeat",
    "MethodReceived", "Nack", "PropertiesCache", "ProtocolHeaderReceived", "ProtocolStateError",
    "Publish", "Reject", "ReplyCode", "ServerConfig", "ServerConnection", "TickResult",
    "decode_content_header", "decode_method", "decode_properties", "decode_publish",
    "encode_ack", "encode_content", "encode_deliver", "encode_get_ok", "encode_method",
    "encode_nack", "encode_properties", "encode_return", "get_header_raw", "long_long_value",
    "reply_text", "set_header_raw", "validate_properties",
]

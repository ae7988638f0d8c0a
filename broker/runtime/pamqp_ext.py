"""pamqp method classes the channel needs changed. They subclass pamqp's
classes (which have __slots__), so this module stays interpreted when the
broker is compiled (scripts/build_native.py)."""
from __future__ import annotations

from pamqp import commands as C


class _AnyNameDeclareOk(C.Queue.DeclareOk):
    """queue.declare-ok for any queue name: pamqp's validation (in __init__ and
    marshal) refuses names outside [a-zA-Z0-9-_.:@#,/+ ], e.g. non-ASCII ones,
    which RabbitMQ accepts (any UTF-8 up to 255 bytes, as the codec checks)."""

    def validate(self) -> None:
        pass


def declare_ok(queue: str, message_count: int, consumer_count: int) -> C.Queue.DeclareOk:
    return _AnyNameDeclareOk(queue=queue, message_count=message_count, consumer_count=consumer_count)

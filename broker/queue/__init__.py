"""The quorum-queue state machine (RabbitMQ 4.x rabbit_fifo semantics), pure.

Pipeline position: AMQP channel -> runtime builds a command -> Raft commits it
-> every replica runs ``apply(meta, command, state)`` -> the leader's runtime
interprets the effects (deliveries read bodies from the local log by message
key: the raft index of the entry that holds it and its position in a batch
entry, see ``types.msg_key``) and returns the reply to the client.

Public API (names others integrate against):

- ``Meta(index, term, timestamp_ms, pos=0)``: the committed entry's metadata
  (and the command's position in a batch entry); the only clock the machine
  has. ``msg_key``/``key_index``/``key_pos``, ``KEY_POS_BITS``, ``BATCH_MAX``.
- ``new_state(config, created_ms=None) -> QueueState``;
  ``apply(meta, command, state) -> (state, reply, effects)`` (the state is
  mutated in place and returned; see `machine` for why);
  ``snapshot(state) -> bytes`` / ``restore(bytes) -> QueueState``;
  ``to_plain(state)`` for equality checks; ``QueueState.overview()`` and
  ``QueueState.smallest_live_index()`` (a raft index) for metrics and storage;
  ``pack``/``rec_key``/``rec_expiry`` for the packed message record.
- Config: ``QueueConfig``; ``parse_queue_arguments(args, queue, vhost,
  policy=None, operator_policy=None) -> QueueConfig`` raising
  ``QueueArgumentError(reply_code=406, reply_text="PRECONDITION_FAILED - ...")``.
- Commands (``commands``): Enqueue, Checkout, Credit, Cancel, Dequeue, Settle,
  Return, Discard, Modify, Purge, ConsumerDown, ChannelDown, UpdateConfig,
  Tick, DlxCheckout, DlxSettle; ``encode_command``/``decode_command``.
- Effects (``effects``): Deliver, DeadLetter, DeadLetterDeliver,
  RejectPublish, ResumePublish, SetTimer, DeleteQueue, ReleaseCursor,
  ActiveConsumerChanged, ConsumerCancelled — what the runtime must do with
  each is documented in `broker.queue.effects`.
- Replies: EnqueueResult (ACCEPTED/DUPLICATE/REJECTED), OutOfOrder, OK, Dequeued,
  DequeueEmpty, DequeueRefused, CheckoutOk, CreditReply, Purged, NotFound.
- ``x_death_headers(...)``: the headers of a dead-lettered copy.
- Errors: QueueError, QueueArgumentError, QueueCommandError,
  QueueInvariantError, SnapshotError.
"""
from .commands import (
    COMMAND_TYPES,
    Cancel,
    ChannelDown,
    Checkout,
    Command,
    ConsumerDown,
    Credit,
    CreditMode,
    Dequeue,
    Discard,
    DlxCheckout,
    DlxSettle,
    Enqueue,
    Modify,
    Purge,
    Return,
    Settle,
    Tick,
    UpdateConfig,
    decode_command,
    encode_command,
)
from .config import (
    AT_LEAST_ONCE,
    AT_MOST_ONCE,
    DEFAULT_DELIVERY_LIMIT,
    OVERFLOW_DROP_HEAD,
    OVERFLOW_REJECT_PUBLISH,
    QueueConfig,
    parse_queue_arguments,
)
from .deadletter import x_death_headers
from .effects import (
    OK,
    ActiveConsumerChanged,
    CheckoutOk,
    ConsumerCancelled,
    CreditReply,
    DeadLetter,
    DeadLetterDeliver,
    DeadLetterReason,
    DeleteQueue,
    Deliver,
    Delivery,
    Dequeued,
    DequeueEmpty,
    DequeueRefused,
    Effect,
    EnqueueResult,
    NotFound,
    Ok,
    OutOfOrder,
    Purged,
    RejectPublish,
    ReleaseCursor,
    Reply,
    ResumePublish,
    SetTimer,
)
from .errors import (
    QueueArgumentError,
    QueueCommandError,
    QueueError,
    QueueInvariantError,
    SnapshotError,
)
from .machine import QueueState, apply, new_state, pack, rec_expiry, rec_key
from .snapshot import from_plain, restore, snapshot, to_plain
from .types import (
    BATCH_MAX,
    DEQUEUE_TAG,
    KEY_POS_BITS,
    ChannelRef,
    ConsumerId,
    Meta,
    MsgId,
    RaftIndex,
    key_index,
    key_pos,
    msg_key,
)

__all__ = [
    "AT_LEAST_ONCE", "AT_MOST_ONCE", "BATCH_MAX", "COMMAND_TYPES", "DEFAULT_DELIVERY_LIMIT", "DEQUEUE_TAG",
    "OK", "OVERFLOW_DROP_HEAD", "OVERFLOW_REJECT_PUBLISH",
    "ActiveConsumerChanged", "Cancel", "ChannelDown", "ChannelRef", "Checkout", "CheckoutOk",
    "Command", "ConsumerCancelled", "ConsumerDown", "ConsumerId", "Credit", "CreditMode",
    "CreditReply", "DeadLetter", "DeadLetterDeliver", "DeadLetterReason", "DeleteQueue",
    "Deliver", "Delivery", "Dequeue", "DequeueEmpty", "DequeueRefused", "Dequeued", "Discard",
    "DlxCheckout", "DlxSettle", "Effect", "Enqueue", "EnqueueResult", "KEY_POS_BITS", "OutOfOrder", "Meta", "Modify", "MsgId",
    "NotFound", "Ok", "Purge", "Purged", "QueueArgumentError", "QueueCommandError",
    "QueueConfig", "QueueError", "QueueInvariantError", "QueueState", "RaftIndex",
    "RejectPublish", "ReleaseCursor", "Reply", "ResumePublish", "Return", "SetTimer", "Settle",
    "SnapshotError", "Tick", "UpdateConfig", "apply", "decode_command", "encode_command",
    "from_plain", "key_index", "key_pos", "msg_key", "new_state", "pack", "parse_queue_arguments", "rec_expiry", "rec_key",
    "restore", "snapshot",
    "to_plain", "x_death_headers",
]

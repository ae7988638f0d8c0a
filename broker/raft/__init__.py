"""Sans-I/O Raft in the etcd-raft shape.

Pipeline position: the host (broker/runtime) drives one `RaftNode` per Raft
group: `step(msg)`, `tick()`, `propose*()`, then drains `ready()` /
`advance()` / `persisted()`. See `broker.raft.node` and docs/raft.md for the
Ready contract. No I/O, no clocks, no ambient randomness in this package.
"""
from broker.raft.errors import (
    Compacted,
    ConfChangePending,
    InvalidConfChange,
    InvariantViolation,
    NotLeader,
    ProposalDropped,
    RaftError,
    RaftUsageError,
    StorageError,
    TransferInProgress,
    TransferRefused,
    Unavailable,
)
from broker.raft.node import PeerStatus, RaftConfig, RaftNode, RandomSource, Ready, Status
from broker.raft.progress import ProgressState
from broker.raft.storage import LogStorage, MemoryStorage
from broker.raft.types import (
    EMPTY_HARD_STATE,
    AppendEntries,
    AppendResponse,
    ConfChange,
    ConfChangeKind,
    Entry,
    EntryKind,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    Index,
    InstallSnapshot,
    InstallSnapshotResponse,
    Membership,
    Message,
    NodeId,
    RequestVote,
    RequestVoteResponse,
    Role,
    Snapshot,
    SnapshotMeta,
    SoftState,
    Term,
    TimeoutNow,
    decode_conf_entry,
    encode_conf_entry,
)

__all__ = [
    "AppendEntries", "AppendResponse", "Compacted", "ConfChange", "ConfChangeKind", "ConfChangePending",
    "EMPTY_HARD_STATE", "Entry", "EntryKind", "HardState", "Heartbeat", "HeartbeatResponse",
    "Index", "InstallSnapshot", "InstallSnapshotResponse", "InvalidConfChange",
    "InvariantViolation", "LogStorage", "Membership", "MemoryStorage", "Message", "NodeId",
    "NotLeader", "PeerStatus", "ProgressState", "ProposalDropped", "RaftConfig", "RaftError",
    "RaftNode", "RaftUsageError", "RandomSource", "Ready", "RequestVote", "RequestVoteResponse",
    "Role", "Snapshot", "SnapshotMeta", "SoftState", "Status", "StorageError", "Term",
    "TimeoutNow", "TransferInProgress", "TransferRefused", "Unavailable", "decode_conf_entry", "encode_conf_entry",
]

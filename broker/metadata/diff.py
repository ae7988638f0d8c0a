"""The effects that take a runtime from one metadata state to another.

Applying an entry hands the runtime that entry's effects (machine.py). A
replica that jumps over entries instead, by installing the leader's snapshot
(it lagged behind the leader's compaction point), never sees theirs: the
queues declared meanwhile would have no member or proxy on its node, the
deleted ones would keep running there. `effects_between(old, new)` are the
effects that bring a runtime which acted on everything up to `old` to where
it would be had it applied every entry up to `new`: for the queues, their
members and the policies that apply to them, which is what the runtime acts on.
Users and vhosts that disappeared are reported too. Exchanges and bindings
have no runtime outside the state (routing reads the state), so none.

Pure, deterministic (sorted by key), and checked against replaying the
entries in tests/metadata/test_diff.py.
"""
from __future__ import annotations

from .commands import (
    Effect,
    MembersChanged,
    PolicyChanged,
    QueueDeclared,
    QueueDeleted,
    UserChanged,
    UserDeleted,
    VhostAdded,
    VhostDeleted,
)
from .policies import applying
from .state import MetadataState, QueueKey


def effects_between(old: MetadataState, new: MetadataState) -> list[Effect]:
    out: list[Effect] = []
    for name in sorted(old.vhosts.keys() - new.vhosts.keys()):
        out.append(VhostDeleted(name))
    for name in sorted(new.vhosts.keys() - old.vhosts.keys()):
        out.append(VhostAdded(new.vhosts[name]))
    for user in sorted(old.users.keys() - new.users.keys()):
        out.append(UserDeleted(user))
    for user in sorted(new.users.keys()):
        before = old.users.get(user)
        if before is not None and before != new.users[user]:
            out.append(UserChanged(new.users[user]))
    # A queue that is gone, or was deleted and declared again (another
    # created_at: another incarnation), is deleted before anything is declared.
    for key in sorted(old.queues):
        q, n = old.queues[key], new.queues.get(key)
        if n is None or n.created_at != q.created_at:
            out.append(QueueDeleted(q))
    policy: list[QueueKey] = []
    for key in sorted(new.queues):
        n, o = new.queues[key], old.queues.get(key)
        if o is None or o.created_at != n.created_at:
            out.append(QueueDeclared(n))  # started with the policy in force in `new`
            continue
        if o.members != n.members:
            out.append(MembersChanged(n.vhost, n.name, o.members, n.members))
        if applying(old, o) != applying(new, n):
            policy.append(key)
    if policy:
        out.append(PolicyChanged(tuple(policy)))
    return out


__all__ = ["effects_between"]

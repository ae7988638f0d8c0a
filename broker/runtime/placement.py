"""Where a new queue's members and leader go: a pure function of the cluster
as this node sees it.

Where it sits: `Declarations.declare_queue` (runtime/declarations.py) calls `place` with the cluster's nodes,
which of them are connected, the queue records of the metadata and the
declaration's arguments; the result goes into the `DeclareQueue` command.

Quorum queues get `x-quorum-initial-group-size` members (default
`quorum_queue.initial_cluster_size`), capped at the cluster size, always
including the declaring node; the others are the connected nodes hosting
the fewest queue members (then the unreachable ones, by name). The leader
is the declaring node (`client-local`) or the member leading the fewest
queues (`balanced`, ties to the declaring node). Classic queues live on the
declaring node only.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable
from itertools import chain
from operator import attrgetter
from typing import Any

import broker.metadata as md

_members = attrgetter("members")
_leader = attrgetter("leader")


def place(me: str, nodes: Collection[str], connected: Callable[[str], bool],
          records: Iterable[md.QueueRecord], arguments: dict[str, Any], *, quorum: bool,
          default_size: int, default_locator: str) -> tuple[tuple[md.NodeName, ...], md.NodeName]:
    node = md.NodeName(me)
    if not quorum or len(nodes) <= 1:
        return (node,), node
    size = arguments.get("x-quorum-initial-group-size") or default_size
    size = max(1, min(int(size), len(nodes)))
    # One pass over every queue record per declaration, at C speed (Counter
    # over iterators): at 10,000 queues the Python loop it replaces was a
    # sixth of a declaration's CPU (bench/scale.py).
    rs = list(records)
    members_of = Counter(chain.from_iterable(map(_members, rs)))
    leaders_of = Counter(map(_leader, rs))
    load = {n: members_of.get(n, 0) for n in nodes}
    leaders = {n: leaders_of.get(n, 0) for n in nodes}
    others = sorted((n for n in nodes if n != me), key=lambda n: (not connected(n), load[n], n))
    members = (node, *[md.NodeName(n) for n in others[: size - 1]])
    locator = arguments.get("x-queue-leader-locator") or default_locator
    if locator == "balanced":
        leader = min(members, key=lambda n: (leaders.get(n, 0), n != me, n))
    else:
        leader = node
    return members, md.NodeName(leader)


__all__ = ["place"]

"""Quorum-queue membership operations: add/delete member, grow, shrink,
rebalance leaders, drain a node, quorum status and quorum-critical checks.

Where it sits: called by the management API and the CLI (through it) as
`node.membership`. Raft changes are single-server changes proposed on the
queue's leader (forwarded there with the cluster's ordered requests): a new
member joins as a non-voting learner and the leader promotes it once it has
caught up; the metadata record's member list is updated after the Raft
change commits, which makes the joining node start (or the leaving node stop)
its local member.

Every refusal raises `MembershipError(status, reason)` with an HTTP status.
The node is a `MembershipHost` (below), never runtime/node.py itself.
"""
from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import broker.metadata as md

from .errors import Refused

if TYPE_CHECKING:
    from broker.raft import RaftNode

    from .queues import QueueProcess, QuorumQueue
    from .raft_group import RaftGroup

Progress = Callable[[dict[str, Any]], None] | None
PROMOTION_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class RaftConfigReport:
    """A queue group's committed configuration and the Raft index where it
    took effect (reports of one group are ordered by it)."""

    voters: frozenset[str]
    learners: frozenset[str]
    index: int

    @property
    def members(self) -> frozenset[str]:
        return self.voters | self.learners

    @classmethod
    def read(cls, raft: RaftNode) -> RaftConfigReport:
        c = raft.config
        return cls(frozenset(map(str, c.voters)), frozenset(map(str, c.learners)), raft.config_index)

    def wire(self) -> dict[str, Any]:
        return {"voters": sorted(self.voters), "learners": sorted(self.learners), "index": self.index}

    @classmethod
    def of(cls, raw: Any) -> RaftConfigReport:  # raw: msgpack-decoded (a peer's answer)
        if not isinstance(raw, dict) or not {"voters", "learners", "index"} <= raw.keys():
            raise MembershipError(503, f"unexpected answer from the queue's leader: {raw!r}")
        return cls(frozenset(raw["voters"]), frozenset(raw["learners"]), int(raw["index"]))


class MembershipError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _quorum(n: int) -> int:
    return n // 2 + 1


class _Metadata(Protocol):
    """The metadata replica and its Raft group (runtime/metastore.py `MetadataStore`)."""

    @property
    def state(self) -> md.MetadataState: ...
    @property
    def group(self) -> RaftGroup: ...


class _Records(Protocol):
    """The node's queue records (runtime/registry.py `Registry`)."""

    def queue_record(self, vhost: str, name: str) -> md.QueueRecord | None: ...


class MembershipHost(Protocol):
    """What membership operations need from the node (runtime/node.py
    `Node`, which this module never imports): the cluster's nodes and which
    are connected, the metadata, and where a queue's commands go."""

    @property
    def node_name(self) -> str: ...
    @property
    def meta(self) -> _Metadata: ...
    @property
    def registry(self) -> _Records: ...

    def cluster_nodes(self) -> Collection[str]: ...

    def peer_connected(self, node: str) -> bool: ...

    def queue(self, vhost: str, name: str) -> QueueProcess | None: ...

    def queue_leader(self, vhost: str, name: str) -> str | None: ...

    # payload: a membership control payload (`control`); the future's result, its answer
    def submit_as_leader(self, vhost: str, name: str, payload: Any) -> Awaitable[Any]: ...

    def forward(self, leader: str, vhost: str, name: str, payload: Any) -> Awaitable[Any]: ...

    async def meta_execute(self, cmd: md.Command) -> md.Reply | None: ...


class Membership:
    def __init__(self, node: MembershipHost) -> None:
        self.node = node

    # ------------------------------------------------------------ helpers
    def _record(self, vhost: str, queue: str) -> md.QueueRecord:
        r = self.node.registry.queue_record(vhost, queue)
        if r is None:
            raise MembershipError(404, f"no queue '{queue}' in vhost '{vhost}'")
        if r.type != "quorum":
            raise MembershipError(400, f"queue '{queue}' in vhost '{vhost}' is not a quorum queue")
        return r

    def _cluster_nodes(self) -> list[str]:
        return list(self.node.cluster_nodes())

    def _online(self, name: str) -> bool:
        return name == self.node.node_name or self.node.peer_connected(name)

    async def _leader_call(self, vhost: str, queue: str, payload: list[Any], timeout: float = 30.0) -> Any:
        """Run a control payload on the queue's leader (here or forwarded)."""
        node = self.node
        deadline = time.monotonic() + timeout
        while True:
            leader = node.queue_leader(vhost, queue)
            try:
                if leader == node.node_name:
                    return await node.submit_as_leader(vhost, queue, payload)
                if leader:
                    return await asyncio.wait_for(node.forward(leader, vhost, queue, payload),
                                                  max(0.1, deadline - time.monotonic()))
            except MembershipError:
                raise
            except TimeoutError:
                raise MembershipError(504, f"queue '{queue}' in vhost '{vhost}': the leader did not "
                                           f"answer within {timeout:.0f}s") from None
            except Exception as exc:  # not leader any more / change in progress: retry
                if time.monotonic() > deadline:
                    raise MembershipError(503, f"queue '{queue}' in vhost '{vhost}': {exc}") from None
            if time.monotonic() > deadline:
                raise MembershipError(503, f"queue '{queue}' in vhost '{vhost}' has no leader")
            await asyncio.sleep(0.1)

    async def raft_config(self, vhost: str, queue: str) -> RaftConfigReport:
        """The queue's committed Raft configuration, as its leader knows it."""
        self._record(vhost, queue)
        return RaftConfigReport.of(await self._leader_call(vhost, queue, ["M", "config"]))

    async def _record_members(self, r: md.QueueRecord, cfg: RaftConfigReport) -> None:
        """Write the committed configuration `cfg` to the metadata as the
        queue's members. Never a list built here: the metadata machine keeps
        the report of the latest configuration (by Raft index) whatever order
        reports arrive in, so the member list cannot fall behind the group's
        configuration (a node whose replica the list no longer names deletes
        it). Members keep the record's order; new ones follow."""
        members: list[str] = [m for m in r.members if m in cfg.members]
        members += sorted(m for m in cfg.members if m not in members)
        reply = await self.node.meta_execute(md.SetQueueMembers(
            r.vhost, r.name, tuple(md.NodeName(m) for m in members), cfg.index, r.created_at))
        if isinstance(reply, md.MetadataError):
            raise MembershipError(400, reply.text)

    async def _change(self, r: md.QueueRecord, op: str, node_name: str) -> RaftConfigReport:
        """Propose a single-server change on the leader and return the
        configuration once it is committed. A change that committed though
        its answer was lost (the leader changed, a retry is refused as
        already done) counts as done: the leader's configuration says so.
        Refused (503) while this node's metadata group is stopped (a failed
        write; it restarts by itself): the change could be made in Raft but
        not recorded, leaving the two disagreeing."""
        stopped = self.node.meta.group.stopped
        if stopped is not None:
            raise MembershipError(503, f"the metadata store on node '{self.node.node_name}' is "
                                       f"stopped ({stopped}): a membership change made here could "
                                       "not be recorded; retry once it has restarted, or through "
                                       "another node")
        result = await self._leader_call(r.vhost, r.name, ["M", op, node_name])
        if isinstance(result, Refused):
            cfg = await self.raft_config(r.vhost, r.name)
            if (node_name in cfg.members) == (op == "add"):
                return cfg
            raise MembershipError(400, result.reason)
        return RaftConfigReport.of(result)

    async def sync_members(self, vhost: str, queue: str) -> None:
        """Write the leader's committed configuration to the metadata as the
        queue's members (a repair: nothing changes in Raft)."""
        r = self._record(vhost, queue)
        await self._record_members(r, await self.raft_config(vhost, queue))

    # ------------------------------------------------------------ single queue
    async def add_member(self, vhost: str, queue: str, node_name: str,
                         if_missing: bool = False) -> None:
        """Add a member on `node_name` (a learner until it has caught up and
        the leader promotes it). With `if_missing`, a member already there
        is fine (grow, drain)."""
        r = self._record(vhost, queue)
        if node_name not in self._cluster_nodes():
            raise MembershipError(400, f"node '{node_name}' is not a member of this cluster")
        await self._add(r, node_name, await self.raft_config(vhost, queue), if_missing)

    async def _add(self, r: md.QueueRecord, node_name: str, cfg: RaftConfigReport,
                   if_missing: bool) -> None:
        """add_member given the leader's configuration `cfg`."""
        if node_name in cfg.members:
            if node_name in r.members and not if_missing:
                raise MembershipError(400, f"node '{node_name}' is already a member of queue "
                                           f"'{r.name}' in vhost '{r.vhost}'")
            # Joined in Raft (maybe the metadata has not caught up): finish.
        else:
            cfg = await self._change(r, "add", node_name)
        await self._record_members(r, cfg)
        await self._await_voter(r.vhost, r.name, node_name)

    async def _await_voter(self, vhost: str, queue: str, node_name: str) -> None:
        """The leader promotes the learner once caught up; wait for that."""
        deadline = time.monotonic() + PROMOTION_TIMEOUT_S
        while time.monotonic() < deadline:
            status = await self.quorum_status(vhost, queue)
            for m in status:
                if m["node"] == node_name and m.get("voter"):
                    return
            await asyncio.sleep(0.1)
        raise MembershipError(504, f"node '{node_name}' joined queue '{queue}' as a learner but was "
                                   f"not promoted within {PROMOTION_TIMEOUT_S:.0f}s")

    async def delete_member(self, vhost: str, queue: str, node_name: str, force: bool = False) -> None:
        r = self._record(vhost, queue)
        await self._delete(r, node_name, await self.raft_config(vhost, queue), force)

    async def _delete(self, r: md.QueueRecord, node_name: str, cfg: RaftConfigReport,
                      force: bool = False) -> None:
        """delete_member given the leader's configuration `cfg`."""
        queue, vhost = r.name, r.vhost
        if node_name not in cfg.members:
            if node_name in r.members:  # removed in Raft, not yet in the metadata: finish
                await self._record_members(r, cfg)
                return
            raise MembershipError(404, f"node '{node_name}' is not a member of queue '{queue}' in "
                                       f"vhost '{vhost}'")
        if len(cfg.members) == 1:
            raise MembershipError(400, f"cannot delete the last member of queue '{queue}' in vhost "
                                       f"'{vhost}'")
        voters = [m for m in cfg.voters if m != node_name]
        online = [m for m in voters if self._online(m)]
        if not force and len(online) < _quorum(len(voters)):
            raise MembershipError(409, f"deleting member '{node_name}' would leave queue '{queue}' in "
                                       f"vhost '{vhost}' without an online quorum "
                                       f"({len(online)} of {len(voters)} online); use force")
        cfg = await self._change(r, "remove", node_name)
        await self._record_members(r, cfg)

    async def transfer_leader(self, vhost: str, queue: str, target: str) -> None:
        r = self._record(vhost, queue)
        if target not in r.members:
            raise MembershipError(400, f"node '{target}' is not a member of queue '{queue}'")
        if self.node.queue_leader(vhost, queue) == target:
            return
        result = await self._leader_call(vhost, queue, ["M", "transfer", target])
        if isinstance(result, Refused):
            raise MembershipError(409, result.reason)
        deadline = time.monotonic() + 10
        while self.node.queue_leader(vhost, queue) != target:
            if time.monotonic() > deadline:
                raise MembershipError(504, f"leadership of '{queue}' did not move to '{target}'")
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------ many queues
    def _matching(self, vhost_pattern: str, queue_pattern: str) -> list[md.QueueRecord]:
        try:
            vre, qre = re.compile(vhost_pattern), re.compile(queue_pattern)
        except re.error as exc:
            raise MembershipError(400, f"invalid pattern: {exc}") from None
        return sorted((r for r in self.node.meta.state.queues.values()
                       if r.type == "quorum" and vre.search(r.vhost) and qre.search(r.name)),
                      key=lambda r: (r.vhost, r.name))

    async def _each(self, records: list[md.QueueRecord], op: Callable[[md.QueueRecord], Any],
                    progress: Progress) -> list[dict[str, Any]]:
        results = []
        for i, r in enumerate(records, 1):
            item: dict[str, Any]  # JSON-shaped (the management API's answer)
            try:
                await op(r)
                item = {"vhost": r.vhost, "name": r.name, "result": "ok"}
            except MembershipError as exc:
                item = {"vhost": r.vhost, "name": r.name, "result": "error", "reason": exc.reason}
            item["done"], item["total"] = i, len(records)
            results.append(item)
            if progress is not None:
                progress(item)
        return results

    async def grow(self, node_name: str, strategy: str = "all", vhost_pattern: str = ".*",
                   queue_pattern: str = ".*", progress: Progress = None) -> list[dict[str, Any]]:
        if strategy not in ("all", "even"):
            raise MembershipError(400, f"strategy must be 'all' or 'even', got '{strategy}'")
        if node_name not in self._cluster_nodes():
            raise MembershipError(400, f"node '{node_name}' is not a member of this cluster")
        todo = [r for r in self._matching(vhost_pattern, queue_pattern)
                if node_name not in r.members and (strategy == "all" or len(r.members) % 2 == 0)]
        return await self._each(todo, lambda r: self.add_member(r.vhost, r.name, node_name,
                                                                if_missing=True), progress)

    async def shrink(self, node_name: str, errors_only: bool = False,
                     progress: Progress = None) -> list[dict[str, Any]]:
        todo = [r for r in self._matching(".*", ".*") if node_name in r.members]
        results = await self._each(todo, lambda r: self.delete_member(r.vhost, r.name, node_name),
                                   progress)
        return [x for x in results if x["result"] != "ok"] if errors_only else results

    async def rebalance(self, vhost_pattern: str = ".*", queue_pattern: str = ".*",
                        progress: Progress = None) -> list[dict[str, Any]]:
        """Move leaders so every node leads about the same number of the
        matching queues (only onto online members)."""
        records = self._matching(vhost_pattern, queue_pattern)
        nodes = [n for n in self._cluster_nodes() if self._online(n)]
        if not nodes:
            return []
        counts = {n: 0 for n in nodes}
        for r in records:
            lead = self.node.queue_leader(r.vhost, r.name)
            if lead in counts:
                counts[lead] += 1
        target = -(-len(records) // len(nodes))  # ceil

        async def move(r: md.QueueRecord) -> None:
            lead = self.node.queue_leader(r.vhost, r.name)
            if lead in counts and counts[lead] <= target and counts[lead] <= min(counts.values()) + 1:
                return
            candidates = sorted((m for m in r.members if m in counts and m != lead),
                                key=lambda m: (counts[m], m))
            if not candidates or (lead in counts and counts[candidates[0]] + 1 > counts[lead] - 1
                                  and counts[lead] <= target):
                return
            dest = candidates[0]
            await self.transfer_leader(r.vhost, r.name, dest)
            if lead in counts:
                counts[lead] -= 1
            counts[dest] += 1
        return await self._each(records, move, progress)

    async def drain(self, node_name: str, progress: Progress = None,
                    exclude: Collection[str] = ()) -> list[dict[str, Any]]:
        """Move every member (and leader) off `node_name`: add a member on the
        least loaded other node that has none, then delete the one here.
        Nodes in `exclude` (leaving too, e.g. the other pods of a scale-down
        that stop at the same time) receive neither members nor leaderships."""
        others = [n for n in self._cluster_nodes()
                  if n != node_name and n not in exclude and self._online(n)]

        async def move(r: md.QueueRecord) -> None:
            # Decided from the leader's configuration, not this node's copy
            # of the metadata (which may lag behind it); read again only after
            # a member was added (its promotion changed the voters).
            cfg = await self.raft_config(r.vhost, r.name)
            if node_name in cfg.members:
                if self.node.queue_leader(r.vhost, r.name) == node_name:
                    voters = [m for m in sorted(cfg.voters) if m != node_name and m in others]
                    if voters:
                        await self.transfer_leader(r.vhost, r.name, voters[0])
                spare = [n for n in others if n not in cfg.members]
                if spare:
                    load = {n: sum(n in q.members for q in self.node.meta.state.queues.values())
                            for n in spare}
                    await self._add(r, min(spare, key=lambda n: (load[n], n)), cfg, if_missing=True)
                    cfg = await self.raft_config(r.vhost, r.name)
            await self._delete(r, node_name, cfg)  # (gone from Raft already: the list catches up)
        todo = [r for r in self._matching(".*", ".*") if node_name in r.members]
        return await self._each(todo, move, progress)

    # ------------------------------------------------------------ a node stopping (Kubernetes preStop)
    async def hand_off_leaders(self, node_name: str, progress: Progress = None) -> list[dict[str, Any]]:
        """Move every quorum-queue leadership `node_name` holds to another online
        member (the one leading fewest first); when `node_name` is this node,
        hand its metadata leadership away too."""
        others = [n for n in self._cluster_nodes() if n != node_name and self._online(n)]
        records = self._matching(".*", ".*")
        counts = {n: 0 for n in others}
        for r in records:
            lead = self.node.queue_leader(r.vhost, r.name)
            if lead in counts:
                counts[lead] += 1

        async def move(r: md.QueueRecord) -> None:
            if self.node.queue_leader(r.vhost, r.name) != node_name:
                return
            candidates = sorted((m for m in r.members if m in counts), key=lambda m: (counts[m], m))
            if not candidates:
                raise MembershipError(409, f"queue '{r.name}' in vhost '{r.vhost}' has no other "
                                           "online member to lead it")
            await self.transfer_leader(r.vhost, r.name, candidates[0])
            counts[candidates[0]] += 1
        results = await self._each([r for r in records if node_name in r.members], move, progress)
        if node_name == self.node.node_name:
            await self.hand_off_metadata()
        return results

    async def hand_off_metadata(self, timeout: float = 10.0) -> str | None:
        """If this node leads the metadata group, transfer that to another online
        voter; returns the metadata leader afterwards."""
        g = self.node.meta.group
        if not g.is_leader:
            return g.leader
        voters = sorted(str(v) for v in g.node.config.voters
                        if v != self.node.node_name and self._online(str(v)))
        if not voters:
            return g.leader
        from broker.raft import RaftError

        deadline = time.monotonic() + timeout
        why = ""
        while g.is_leader or g.leader is None:
            if g.stopped is not None:
                raise MembershipError(503, f"the metadata store on this node stopped: {g.stopped}")
            if g.is_leader and g.node.transferee is None:
                try:  # refused while the target catches up: retried
                    g.node.transfer_leadership(voters[0])
                    g._kick()
                except RaftError as exc:
                    why = f": {exc}"
            if time.monotonic() > deadline:
                raise MembershipError(504, f"metadata leadership did not move to '{voters[0]}'{why}")
            await asyncio.sleep(0.05)
        return g.leader

    async def forget_node(self, node_name: str) -> None:
        """Remove a node that left for good from the metadata group (and its
        recorded address): `rabbitmqctl forget_cluster_node`. Runs on the
        metadata leader only; the node must hold no queue member any more."""
        from broker.raft import ConfChange, ConfChangeKind, NodeId

        from .metastore import CLUSTER_NODES

        g = self.node.meta.group
        if node_name == self.node.node_name:
            raise MembershipError(409, "a node cannot remove itself from the cluster: hand its "
                                       "metadata leadership away and ask the new leader")
        if not g.is_leader:
            # 409, not 5xx: the request is fine, this node is the wrong one to ask.
            raise MembershipError(409, f"not the metadata leader; ask '{g.leader or 'unknown'}'")
        held = sorted(f"'{r.name}' in vhost '{r.vhost}'" for r in self.node.meta.state.queues.values()
                      if node_name in r.members)
        if held:
            raise MembershipError(409, f"node '{node_name}' still holds members of queue(s) "
                                       f"{', '.join(held[:5])}: drain it first")
        if node_name in g.node.config.members:
            try:
                await g.propose_conf(ConfChange(ConfChangeKind.REMOVE, NodeId(node_name)))
            except Exception as exc:  # a change in progress, lost leadership: retry
                raise MembershipError(503, f"removing '{node_name}' from the metadata group: "
                                           f"{exc}") from None
        key = (md.VhostName("/"), CLUSTER_NODES, node_name)
        if key in self.node.meta.state.parameters:
            await self.node.meta_execute(md.ClearParameter(md.VhostName("/"), CLUSTER_NODES, node_name))

    # ------------------------------------------------------------ status
    async def quorum_status(self, vhost: str, queue: str) -> list[dict[str, Any]]:
        self._record(vhost, queue)
        result = await self._leader_call(vhost, queue, ["M", "status"])
        if not isinstance(result, list):
            raise MembershipError(503, f"no status for queue '{queue}': {result}")
        return result

    def quorum_critical(self, node_name: str) -> list[tuple[str, str]]:
        out = []
        for r in self.node.meta.state.queues.values():
            if r.type != "quorum" or node_name not in r.members:
                continue
            online = [m for m in r.members if self._online(m) and m != node_name]
            if len(online) < _quorum(len(r.members)):
                out.append((r.vhost, r.name))
        return sorted(out)

    async def queue_overview(self, vhost: str, queue: str) -> dict[str, Any]:
        q = self.node.queue(vhost, queue)
        if q is not None and q.kind == "classic":
            return q.overview()
        if q is not None and hasattr(q, "group") and q.is_leader:
            return q.overview()
        result = await self._leader_call(vhost, queue, ["M", "overview"])
        return result if isinstance(result, dict) else {}


def control(q: QuorumQueue, payload: list[Any], unreachable: Collection[str] = ()) -> object:
    """Run a membership control payload (msgpack-decoded) on the leader's
    queue process; the result is msgpack-friendly, a `Refused`, or a future of
    one. Called by Forwarding.submit_as_leader.
    `unreachable`: the nodes this node's failure detector holds down (a
    quiet leader's `recent_active` flags are as old as its last heartbeat)."""
    from broker.raft import (
        ConfChange,
        ConfChangeKind,
        ConfChangePending,
        NodeId,
        ProposalDropped,
        RaftError,
        TransferInProgress,
    )

    op = payload[1]
    g = q.group
    if op == "config":
        if g.node.pending_conf_index > g.node.commit_index:
            # A new leader's first entry (or a change) is not committed yet:
            # its committed configuration may be older than the group's.
            raise RuntimeError("the leader's configuration is not settled yet")  # retried
        return RaftConfigReport.read(g.node).wire()
    if op == "status":
        st = g.node.status()
        members = []
        for name in sorted(set(st.config.voters) | set(st.config.learners)):
            pr = st.progress.get(name)
            members.append({
                "node": name, "voter": name in st.config.voters,
                "raft_state": "leader" if name == st.id else ("follower" if name in st.config.voters else "learner"),
                "term": st.term, "commit_index": st.commit, "last_applied": st.applied if name == st.id else None,
                "match_index": pr.match if pr is not None else None,
                "online": (pr.recent_active and name not in unreachable)
                if pr is not None and name != st.id else True,
            })
        return members
    if op == "overview":
        return q.overview()
    try:
        if op == "transfer":
            target = g.node.progress.get(payload[2])
            if target is not None and target.recent_active and target.match < g.node.commit_index:
                # The core refuses a target behind the commit; one that answers
                # is only catching up (an entry in flight): transient, retried.
                raise RuntimeError(f"{payload[2]} is catching up (match {target.match} < commit "
                                   f"{g.node.commit_index})")
            g.node.transfer_leadership(payload[2])
            g._kick()
            return "ok"
        kind = {"add": ConfChangeKind.ADD_LEARNER, "remove": ConfChangeKind.REMOVE}[op]
        applied = g.propose_conf(ConfChange(kind, NodeId(payload[2])))
    except (ConfChangePending, TransferInProgress, ProposalDropped) as exc:
        raise RuntimeError(str(exc)) from None  # transient: the caller retries
    except RaftError as exc:
        return Refused(str(exc))
    # Answered once committed and applied, with the configuration then in force.
    out: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def done(f: asyncio.Future[Any]) -> None:
        if out.done():
            return
        if f.cancelled():
            out.set_exception(RuntimeError("the change was cancelled"))
        elif (exc := f.exception()) is not None:
            out.set_exception(exc)
        else:
            out.set_result(RaftConfigReport.read(g.node).wire())
    applied.add_done_callback(done)
    return out

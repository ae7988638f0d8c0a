"""The queue registry (runtime/registry.py) with the real metadata machine,
real storage and real queue processes, and a fake node: no process, no
peers. Metadata commands are applied to a state the way the metadata group
applies them, and their effects handed to the registry as the group does."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker import metadata as md
from broker import queue as qm
from broker import storage as st
from broker.raft import RaftConfig
from broker.runtime.classic import DurableClassicQueue
from broker.runtime.classic import group_id as classic_group_id
from broker.runtime.queues import ClassicQueue, QuorumQueue, RemoteQueue
from broker.runtime.registry import Registry, classic_config
from tests.storage.helpers import manager

ME = md.NodeName("a")


class FakeMembership:
    def __init__(self) -> None:
        self.synced: list[tuple[str, str]] = []

    async def sync_members(self, vhost: str, name: str) -> None:
        self.synced.append((vhost, name))


class FakeNode:
    """The registry's host: the metadata (applied here), storage, and the
    queues' Host calls (recorded, answered with nothing)."""

    node_name = "a"
    incarnation = "a|test"

    def __init__(self, storage: st.LogManager) -> None:
        self.storage: st.LogManager | None = storage
        self.raft_config = RaftConfig(election_tick=10, heartbeat_tick=1)
        self.membership = FakeMembership()
        self.state = md.new_state()
        self.index = 0
        self.reliable: list[tuple[Any, qm.Command]] = []
        self.executed: list[Any] = []
        self.registry = Registry(self, snapshot_interval=100)
        self.do(md.Bootstrap(md.hash_password("guest", b"salt"), md.UserName("guest"),
                             md.VhostName("/")))

    def do(self, cmd: Any) -> Any:
        """Apply a metadata command and hand its effects to the registry."""
        self.index += 1
        self.state, reply, effects = md.apply(md.CommandMeta(self.index, 1000 + self.index),
                                              cmd, self.state)
        self.registry.meta_effects(effects)
        return reply

    # RegistryHost
    @property
    def meta_state(self) -> md.MetadataState:
        return self.state

    async def meta_execute(self, cmd: Any) -> Any:
        self.executed.append(cmd)
        return self.do(cmd)

    def queue_command_reliable(self, uid: Any, cmd: qm.Command, on_applied: Any = None) -> None:
        self.reliable.append((uid, cmd))

    # the queues' Host
    def dead_letter(self, *a: Any) -> None: ...
    def queue_expired(self, vhost: str, name: str) -> None: ...
    def send_raft(self, dst: str, msg: Any) -> None: ...
    def forward(self, *a: Any) -> Any: raise AssertionError("no forwarding here")
    def recorded_leader(self, vhost: str, name: str) -> str | None: return None
    def send_deliveries(self, *a: Any) -> None: ...
    def leader_elected(self, vhost: str, name: str, term: int) -> None: ...
    @property
    def forwarding(self) -> Any:  # nothing forwarded here to drain
        return SimpleNamespace(flush_forwarded=lambda vhost, name: None)
    def queue_leader(self, vhost: str, name: str) -> str | None: return None
    def channel_dead(self, channel: str) -> bool: return False
    def channel_gone(self, channel: str) -> bool: return False


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[st.LogManager]:
    with manager(tmp_path / "raft") as m:
        yield m


def declare(node: FakeNode, name: str, members: tuple[str, ...] = ("a",), **kw: Any) -> Any:
    ms = tuple(md.NodeName(m) for m in members)
    reply = node.do(md.DeclareQueue(md.VhostName("/"), md.QueueName(name), members=ms,
                                    leader=ms[0], **kw))
    assert not isinstance(reply, md.MetadataError), reply
    return node.state.queues[("/", name)]


def run(coro_fn: Any, storage: st.LogManager) -> Any:
    async def main() -> Any:
        node = FakeNode(storage)
        try:
            return await coro_fn(node)
        finally:
            for q in node.registry.queues.values():
                q.close()
    return asyncio.run(main())


def test_each_declared_queue_gets_the_process_its_record_asks_for(storage: st.LogManager) -> None:
    async def body(node: FakeNode) -> None:
        qq = declare(node, "qq", ("a", "b", "c"), arguments=md.freeze_table({"x-queue-type": "quorum"}))
        declare(node, "elsewhere", ("b", "c", "d"), arguments=md.freeze_table({"x-queue-type": "quorum"}))
        declare(node, "durable-classic")
        declare(node, "temp", durable=False)
        reg = node.registry
        q = reg.queue("/", "qq")
        assert isinstance(q, QuorumQueue) and q.uid == ("/", "qq", qq.created_at)
        assert reg.groups[reg.group_id(qq)] is q.group and q.snapshot_every == 100
        assert reg.live_queue(q.uid) is q and reg.live_queue(("/", "qq", qq.created_at + 1)) is None
        remote = reg.queue("/", "elsewhere")
        assert isinstance(remote, RemoteQueue) and remote.uid[1] == "elsewhere"
        dc = reg.queue("/", "durable-classic")
        assert isinstance(dc, DurableClassicQueue) and reg.classic_logs[dc.group_id] is dc
        assert type(reg.queue("/", "temp")) is ClassicQueue
        assert reg.storage_group(dc.group_id) is dc and reg.storage_group(reg.group_id(qq)) is q.group
        assert reg.group_id(qq) in storage.group_ids() and dc.group_id in storage.group_ids()
    run(body, storage)


def test_a_deleted_queue_stops_and_its_data_goes(storage: st.LogManager) -> None:
    async def body(node: FakeNode) -> None:
        qq = declare(node, "qq", ("a", "b", "c"), arguments=md.freeze_table({"x-queue-type": "quorum"}))
        declare(node, "dc")
        reg = node.registry
        gid, dc_gid = reg.group_id(qq), reg.queue("/", "dc").group_id  # type: ignore[union-attr]
        for name in ("qq", "dc"):
            node.do(md.DeleteQueue(md.VhostName("/"), md.QueueName(name)))
        assert reg.queue("/", "qq") is None and reg.queue("/", "dc") is None
        assert gid not in reg.groups and dc_gid not in reg.classic_logs
        assert gid not in storage.group_ids() and dc_gid not in storage.group_ids()
    run(body, storage)


def test_the_deletion_of_an_earlier_incarnation_leaves_the_queue_declared_since(
        storage: st.LogManager) -> None:
    """A QueueDeleted handed over again (a metadata replica that installed
    the leader's snapshot after a restart in place) names the record it
    deleted: the queue of that name declared since keeps running, data and all."""
    async def body(node: FakeNode) -> None:
        qq = {"x-queue-type": "quorum"}
        first = declare(node, "qq", ("a", "b", "c"), arguments=md.freeze_table(qq))
        node.do(md.DeleteQueue(md.VhostName("/"), md.QueueName("qq")))
        second = declare(node, "qq", ("a", "b", "c"), arguments=md.freeze_table(qq))
        reg = node.registry
        q = reg.queue("/", "qq")
        assert isinstance(q, QuorumQueue) and q.uid[2] == second.created_at != first.created_at
        reg.meta_effects([md.QueueDeleted(first), md.QueueDeclared(second)])
        assert reg.queue("/", "qq") is q and not q.deleted
        assert reg.group_id(second) in storage.group_ids()
        reg.meta_effects([md.QueueDeleted(second)])  # its own deletion still deletes it
        assert reg.queue("/", "qq") is None and reg.group_id(second) not in storage.group_ids()
    run(body, storage)


def test_a_member_whose_configuration_is_invalid_is_reported_and_kept_reachable_by_a_proxy(
        storage: st.LogManager) -> None:
    """Arguments the queue machine refuses (here one no declaration would
    have passed; a policy could do it): the member cannot start, which the
    health check reports, and a proxy keeps the queue reachable from here
    (it had no process at all: its clients got 404)."""
    async def body(node: FakeNode) -> None:
        bad = md.freeze_table({"x-queue-type": "quorum", "x-max-length": "lots"})
        declare(node, "bad", ("a", "b", "c"), arguments=bad)
        reg = node.registry
        assert isinstance(reg.queue("/", "bad"), RemoteQueue)
        assert "x-max-length" in reg.failed_members[("/", "bad")]
    run(body, storage)


def test_a_member_whose_storage_fails_is_reported_and_replaced_by_a_proxy(
        storage: st.LogManager, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(gid: str) -> Any:
        raise st.StorageError("disk full")

    async def body(node: FakeNode) -> None:
        monkeypatch.setattr(storage, "open_group", broken)
        declare(node, "qq", ("a", "b", "c"), arguments=md.freeze_table({"x-queue-type": "quorum"}))
        assert isinstance(node.registry.queue("/", "qq"), RemoteQueue)
        assert node.registry.failed_members == {("/", "qq"): "StorageError: disk full"}
    run(body, storage)


def test_a_member_leaving_is_replaced_by_a_proxy_that_keeps_the_consumers(storage: st.LogManager) -> None:
    async def body(node: FakeNode) -> None:
        qq = declare(node, "qq", ("a", "b", "c"), arguments=md.freeze_table({"x-queue-type": "quorum"}))
        reg = node.registry
        old = reg.queue("/", "qq")
        assert old is not None
        consumer = type("C", (), {"queue": old})()
        old.consumers[qm.ConsumerId("ch", "t")] = consumer  # type: ignore[assignment]
        # a report of a later configuration (index 7) than this replica's (0) without it
        node.do(md.SetQueueMembers(md.VhostName("/"), md.QueueName("qq"),
                                   (md.NodeName("b"), md.NodeName("c")), 7, qq.created_at))
        new = reg.queue("/", "qq")
        assert isinstance(new, RemoteQueue) and new.uid == old.uid
        assert consumer.queue is new and qm.ConsumerId("ch", "t") in new.consumers
        assert reg.group_id(qq) not in storage.group_ids() and not reg.groups
    run(body, storage)


def test_an_unindexed_list_without_this_member_keeps_it_and_writes_the_configuration_back(
        storage: st.LogManager) -> None:
    async def body(node: FakeNode) -> None:
        declare(node, "qq", ("a", "b", "c"), arguments=md.freeze_table({"x-queue-type": "quorum"}))
        q = node.registry.queue("/", "qq")
        node.do(md.SetQueueMembers(md.VhostName("/"), md.QueueName("qq"),
                                   (md.NodeName("b"), md.NodeName("c"))))
        await asyncio.sleep(0)
        assert node.registry.queue("/", "qq") is q and node.membership.synced == [("/", "qq")]
    run(body, storage)


def test_a_member_joining_here_starts_as_a_learner(storage: st.LogManager) -> None:
    async def body(node: FakeNode) -> None:
        qq = declare(node, "qq", ("b", "c"), arguments=md.freeze_table({"x-queue-type": "quorum"}))
        assert isinstance(node.registry.queue("/", "qq"), RemoteQueue)
        node.do(md.SetQueueMembers(md.VhostName("/"), md.QueueName("qq"),
                                   (md.NodeName("b"), md.NodeName("c"), ME), 9, qq.created_at))
        q = node.registry.queue("/", "qq")
        assert isinstance(q, QuorumQueue) and not q.group.node.config.voters
    run(body, storage)


def test_a_policy_change_is_pushed_reliably_to_the_queues_led_here(storage: st.LogManager) -> None:
    async def body(node: FakeNode) -> None:
        declare(node, "c1", durable=False)
        declare(node, "qq", ("a", "b", "c"), arguments=md.freeze_table({"x-queue-type": "quorum"}))
        node.do(md.SetPolicy(md.VhostName("/"), md.PolicyName("p"), ".*",
                             md.freeze_table({"max-length": 5})))
        # the classic queue (always its own leader) gets it; the quorum
        # member here is no leader (no election ran), its leader pushes it
        assert [(uid[1], type(cmd)) for uid, cmd in node.reliable] == [("c1", qm.UpdateConfig)]
    run(body, storage)


def test_start_up_deletes_transient_queues_homed_here_and_orphan_classic_logs(
        storage: st.LogManager) -> None:
    async def body(node: FakeNode) -> None:
        declare(node, "temp", durable=False)
        declare(node, "excl", exclusive_owner="conn-1")
        declare(node, "kept")
        declare(node, "theirs", ("b",), durable=False)
        storage.open_group(classic_group_id("/", "gone", 5)).close()
        node.registry.drop_orphan_classic_logs()
        assert classic_group_id("/", "gone", 5) not in storage.group_ids()
        await node.registry.delete_stale_temporaries()
        assert sorted(n for _v, n in node.state.queues) == ["kept", "theirs"]
    run(body, storage)


QQ_ARGS = md.freeze_table({"x-queue-type": "quorum"})


def test_a_member_a_failed_write_stopped_starts_again_from_its_durable_log(
        storage: st.LogManager) -> None:
    """Ra's supervisor restarts a crashed server; here the node's
    housekeeping calls `restart_stopped` while its disk is not in alarm. The
    new member is a new process over the same log, with the consumers
    carried over; a second stop waits out a back-off; a broken invariant
    stays stopped."""
    async def body(node: FakeNode) -> None:
        qq = declare(node, "qq", ("a", "b", "c"), arguments=QQ_ARGS)
        declare(node, "broken", ("a", "b", "c"), arguments=QQ_ARGS)
        reg = node.registry
        old = reg.queue("/", "qq")
        assert isinstance(old, QuorumQueue)
        consumer = type("C", (), {"queue": old})()
        old.consumers[qm.ConsumerId("ch", "t")] = consumer  # type: ignore[assignment]
        assert reg.restart_stopped() == []  # nothing stopped
        old.group.on_storage_error(st.StorageIOError(28, "No space left on device"))
        broken = reg.queue("/", "broken")
        assert isinstance(broken, QuorumQueue)
        broken.group.on_storage_error(st.InvariantError("a bug"))
        assert reg.restart_stopped() == ["//qq"]
        new = reg.queue("/", "qq")
        assert isinstance(new, QuorumQueue) and new is not old and new.group.stopped is None
        assert old.deleted and new.uid == old.uid and reg.groups[reg.group_id(qq)] is new.group
        assert new.glog.group_id == old.glog.group_id and reg.group_id(qq) in storage.group_ids()
        assert consumer.queue is new and qm.ConsumerId("ch", "t") in new.consumers
        assert reg.queue("/", "broken") is broken and broken.group.stopped is not None
        new.group.on_storage_error(st.StorageIOError(28, "No space left on device"))
        assert reg.restart_stopped() == []  # the back-off: not again at once
        assert reg.queue("/", "qq") is new
    run(body, storage)


def test_a_stopped_member_waits_while_a_write_of_its_old_self_is_in_flight(
        storage: st.LogManager, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(node: FakeNode) -> None:
        declare(node, "qq", ("a", "b", "c"), arguments=QQ_ARGS)
        reg = node.registry
        q = reg.queue("/", "qq")
        assert isinstance(q, QuorumQueue)
        q.group.on_storage_error(st.StorageIOError(28, "No space left on device"))
        # (a write of the old member still in flight: GroupLog.settled() says
        # so, tests/storage/test_log.py holds a real one back)
        monkeypatch.setattr(q.glog, "settled", lambda: False)
        assert reg.restart_stopped() == [] and reg.queue("/", "qq") is q
        monkeypatch.undo()
        assert reg.restart_stopped() == ["//qq"]
    run(body, storage)


def test_a_member_that_could_not_be_created_on_a_full_disk_is_created_again(
        storage: st.LogManager, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(gid: str) -> Any:
        raise st.StorageIOError(28, f"group {gid!r}: creating its directory: No space left on device")

    async def body(node: FakeNode) -> None:
        monkeypatch.setattr(storage, "open_group", full)
        declare(node, "qq", ("a", "b", "c"), arguments=QQ_ARGS)
        reg = node.registry
        proxy = reg.queue("/", "qq")
        assert isinstance(proxy, RemoteQueue) and ("/", "qq") in reg.failed_members
        monkeypatch.undo()
        assert reg.restart_stopped() == ["//qq"]
        q = reg.queue("/", "qq")
        assert isinstance(q, QuorumQueue) and q.uid == proxy.uid and not reg.failed_members
        assert reg.restart_stopped() == []
    run(body, storage)


def test_a_member_stopped_by_what_a_dropped_write_caused_starts_again(storage: st.LogManager) -> None:
    """Under load the report of a failed WAL write (on_error) can reach the
    loop after the member already tried to append past the entries the
    failure dropped. The log then refuses that append with the write error
    (not a gap error), so the member stops on the StorageIOError and starts
    again; a gap with no I/O failure behind it stays stopped."""
    async def body(node: FakeNode) -> None:
        declare(node, "qq", ("a", "b", "c"), arguments=QQ_ARGS)
        declare(node, "other", ("a", "b", "c"), arguments=QQ_ARGS)
        reg = node.registry
        q, other = reg.queue("/", "qq"), reg.queue("/", "other")
        assert isinstance(q, QuorumQueue) and isinstance(other, QuorumQueue)
        # what the WAL writer does (under the log's lock) on ENOSPC
        q.glog.wal_failed(st.StorageIOError(28, "WAL write failed: No space left on device"))
        past_end = q.glog.last_index() + 3
        with pytest.raises(st.StorageIOError) as refused:
            q.glog.append([st.Entry(past_end, 1, b"x")])
        q.group.on_storage_error(refused.value)  # as the group's Ready loop stops on it
        with pytest.raises(st.LogGapError) as gap:
            other.glog.append([st.Entry(other.glog.last_index() + 3, 1, b"x")])
        other.group.on_storage_error(gap.value)
        assert reg.restart_stopped() == ["//qq"]
        new = reg.queue("/", "qq")
        assert isinstance(new, QuorumQueue) and new.group.stopped is None and not new.glog.io_failed
        assert reg.queue("/", "other") is other
    run(body, storage)


def test_a_member_whose_log_breaks_a_raft_invariant_at_start_is_reported_not_lost(
        storage: st.LogManager, monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart that meets an inconsistent log (Raft's InvariantViolation,
    e.g. a durable commit beyond the durable last index) leaves a proxy and a
    failed member, as a corrupt log does: the queue stays usable through
    its leader elsewhere and the health check says why."""
    from broker.raft import InvariantViolation
    from broker.runtime import registry as registry_mod

    async def body(node: FakeNode) -> None:
        declare(node, "qq", ("a", "b", "c"), arguments=QQ_ARGS)
        reg = node.registry
        q = reg.queue("/", "qq")
        assert isinstance(q, QuorumQueue)
        q.group.on_storage_error(st.StorageIOError(28, "No space left on device"))

        def broken(*a: Any, **kw: Any) -> Any:  # (RaftNode's check, raised building the member)
            raise InvariantViolation("durable commit 12 beyond durable last index 9")
        monkeypatch.setattr(registry_mod, "bootstrap_voters", broken)
        assert reg.restart_stopped() == []
        assert isinstance(reg.queue("/", "qq"), RemoteQueue)
        assert reg.failed_members[("/", "qq")].startswith("InvariantViolation")
    run(body, storage)


def test_a_classic_queues_odd_dead_letter_arguments_give_a_configuration() -> None:
    """Declarations refuse these now; a record from before that check must
    still give a configuration (strings only: the compiled QueueConfig
    refuses anything else with a TypeError, which stopped the metadata
    group applying the declaration)."""
    cfg = classic_config("q", "/", {"x-dead-letter-exchange": b"\xffdlx", "x-dead-letter-routing-key": 7})
    assert (cfg.dead_letter_exchange, cfg.dead_letter_routing_key) == ("\ufffddlx", None)
    cfg = classic_config("q", "/", {"x-dead-letter-exchange": 5, "x-dead-letter-routing-key": "rk"})
    assert (cfg.dead_letter_exchange, cfg.dead_letter_routing_key) == (None, "rk")

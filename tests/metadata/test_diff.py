"""effects_between(old, new) against replaying the entries between them: a
runtime that acted on every effect up to `old` and then on the diff runs the
same queues, with the same members, as one that acted on every entry's
effects; and it pushes policies only to queues whose applying policy changed."""
from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.metadata import (
    AddVhost,
    ClearOperatorPolicy,
    ClearPolicy,
    DeclareQueue,
    DeleteQueue,
    DeleteVhost,
    MembersChanged,
    PolicyChanged,
    QueueDeclared,
    QueueDeleted,
    SetOperatorPolicy,
    SetPolicy,
    SetQueueMembers,
    UserDeleted,
    VhostAdded,
    VhostDeleted,
    effects_between,
    from_bytes,
    queue_operator_policy,
    queue_policy,
    to_bytes,
)
from broker.metadata.commands import DeleteUser

from .helpers import Driver
from .test_snapshot import commands as any_command

vhosts = st.sampled_from(["/", "v"])
qnames = st.sampled_from(["a", "b", "c"])
queue_commands = st.one_of(
    st.builds(DeclareQueue, vhosts, qnames, arguments=st.sampled_from([{}, {"x-queue-type": "quorum"}]),
              members=st.sampled_from([("n1", "n2"), ("n2", "n3", "n1")])),
    st.builds(DeleteQueue, vhosts, qnames),
    st.builds(SetQueueMembers, vhosts, qnames, st.sampled_from([("n1",), ("n2", "n3"), ("n1", "n2", "n3")])),
    st.builds(SetPolicy, vhosts, st.sampled_from(["p", "q"]), st.sampled_from(["^a", "b", ".*"]),
              st.sampled_from([{"max-length": 3}, {"delivery-limit": 5}]), priority=st.integers(0, 2)),
    st.builds(ClearPolicy, vhosts, st.sampled_from(["p", "q"])),
    st.builds(SetOperatorPolicy, vhosts, st.just("o"), st.sampled_from(["^a", ".*"]),
              st.just({"max-length": 2})),
    st.builds(ClearOperatorPolicy, vhosts, st.just("o")),
    st.builds(DeleteVhost, st.just("v")),
    st.builds(AddVhost, st.just("v")),
)


def _running(state: Any) -> dict[tuple[str, str], tuple[int, tuple[str, ...]]]:
    return {k: (q.created_at, q.members) for k, q in state.queues.items()}


def _act(running: dict[tuple[str, str], tuple[int, tuple[str, ...]]], effects: list[Any],
         pushed: set[tuple[str, str]]) -> None:
    """What the node's registry does with the queue effects, as a model."""
    for eff in effects:
        if isinstance(eff, QueueDeclared):
            running.setdefault((eff.record.vhost, eff.record.name),
                               (eff.record.created_at, eff.record.members))
        elif isinstance(eff, QueueDeleted):
            running.pop((eff.record.vhost, eff.record.name), None)
        elif isinstance(eff, MembersChanged):
            key = (eff.vhost, eff.name)
            if key in running:
                running[key] = (running[key][0], eff.new)
        elif isinstance(eff, PolicyChanged):
            pushed.update(eff.queues)


def _copy(state: Any) -> Any:
    return from_bytes(to_bytes(state))


@settings(max_examples=150)
@given(st.lists(st.one_of(queue_commands, queue_commands, any_command), min_size=8, max_size=30),
       st.lists(st.one_of(queue_commands, queue_commands, any_command), min_size=4, max_size=40))
def test_the_diff_converges_like_replaying_the_entries(before: list[Any], between: list[Any]) -> None:
    d = Driver()
    d.ok(AddVhost("v"))
    for c in before:
        d(c)
    old = _copy(d.state)
    replayed = _running(old)
    replay_pushed: set[tuple[str, str]] = set()
    for c in between:
        d(c)
        _act(replayed, list(d.effects), replay_pushed)
    new = d.state
    diff = effects_between(old, new)
    jumped = _running(old)
    diff_pushed: set[tuple[str, str]] = set()
    _act(jumped, diff, diff_pushed)
    assert jumped == _running(new) == replayed
    # policies: pushed exactly to the queues (of the same incarnation at both
    # ends) whose applying policy or operator policy differs, each of which
    # replaying pushed too
    same = [k for k, q in new.queues.items() if k in old.queues and old.queues[k].created_at == q.created_at]

    def applying(state: Any, q: Any) -> Any:
        return queue_policy(state, q), queue_operator_policy(state, q)
    changed = {k for k in same if applying(old, old.queues[k]) != applying(new, new.queues[k])}
    assert diff_pushed == changed
    assert changed <= replay_pushed
    # vhosts and users that went away are reported; nothing for no change
    assert {e.name for e in diff if isinstance(e, VhostDeleted)} == old.vhosts.keys() - new.vhosts.keys()
    assert {e.record.name for e in diff if isinstance(e, VhostAdded)} == new.vhosts.keys() - old.vhosts.keys()
    assert {e.name for e in diff if isinstance(e, UserDeleted)} == old.users.keys() - new.users.keys()
    assert effects_between(new, _copy(new)) == []


def test_a_queue_declared_again_is_deleted_then_declared() -> None:
    d = Driver()
    d.ok(DeclareQueue("/", "q", members=("n1", "n2")))
    old = _copy(d.state)
    d.ok(DeleteQueue("/", "q"))
    d.ok(DeclareQueue("/", "q", members=("n2", "n3")))
    d.ok(DeleteUser("guest"))
    diff = effects_between(old, d.state)
    kinds = [type(e).__name__ for e in diff]
    assert kinds == ["UserDeleted", "QueueDeleted", "QueueDeclared"], kinds
    deleted, declared = diff[1], diff[2]
    assert isinstance(deleted, QueueDeleted) and isinstance(declared, QueueDeclared)
    assert deleted.record.created_at < declared.record.created_at
    assert declared.record.members == ("n2", "n3")

"""The Raft configuration a quorum-queue member starts from (real storage,
real files): decided once when the group is created on a node, kept beside
its log, and never today's member list for a member created after a
membership change (an empty-log member taking that list for its voters could
win an election among other such members and overwrite committed entries)."""
from __future__ import annotations

from pathlib import Path

from broker import metadata as md
from broker.runtime.registry import bootstrap_voters
from tests.storage.helpers import Durable, entries, manager

DECLARED = ("a", "b", "c")


def record(members: tuple[str, ...] = DECLARED, members_index: int = 0) -> md.QueueRecord:
    return md.QueueRecord(
        md.VhostName("/"), md.QueueName("q"), "quorum", True, False, None, md.freeze_table({}),
        tuple(md.NodeName(m) for m in members), None, 1, members_index=members_index)


def test_a_declared_member_starts_from_the_declared_members_and_keeps_them(tmp_path: Path) -> None:
    with manager(tmp_path) as m:
        g = m.open_group("q1")
        assert bootstrap_voters(record(), g, joining=False) == list(DECLARED)
        g.close()
        # Restarted after membership changes: the record now lists other
        # members, the group still starts from what it was created with (its
        # log's CONFIG entries take it on from there).
        g = m.open_group("q1")
        assert bootstrap_voters(record(("a", "d"), 57), g, joining=False) == list(DECLARED)


def test_a_member_created_after_a_membership_change_starts_without_voters(tmp_path: Path) -> None:
    with manager(tmp_path) as m:
        joined = m.open_group("joined")
        assert bootstrap_voters(record(("a", "b", "d"), 40), joined, joining=True) == []
        # Listed as a member while its node was down: first started at restart.
        late = m.open_group("late")
        assert bootstrap_voters(record(("a", "b", "d"), 40), late, joining=False) == []
        joined.close()
        late.close()
        # Restarted with its log still empty: still no voters, though the
        # record (and a majority of the nodes it lists) says it is a member.
        for gid in ("joined", "late"):
            g = m.open_group(gid)
            assert bootstrap_voters(record(("a", "b", "d"), 40), g, joining=False) == []
            g.close()


def test_a_log_from_before_bootstrap_records_starts_from_the_record(tmp_path: Path) -> None:
    durable = Durable()
    with manager(tmp_path, durable=durable) as m:
        g = m.open_group("old")
        g.append(entries("old", 1, 4, 1))
        assert durable.wait_index("old", 3)
        assert bootstrap_voters(record(("a", "b"), 12), g, joining=False) == ["a", "b"]
        assert g.read_bootstrap() is None  # not guessed into a record

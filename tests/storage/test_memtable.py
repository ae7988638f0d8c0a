"""MemTable.drop_below: released entries leave the memory table and the WAL
generation marks follow, so each generation's flush gets exactly its entries
that are still needed."""
from __future__ import annotations

from broker.storage.memtable import Mark, MemTable

from .helpers import entries


def test_drop_below_moves_the_first_mark_and_keeps_later_generations() -> None:
    mt = MemTable()
    mt.put(1, entries("g", 1, 11, 1), gen=1, reset=False)
    mt.put(11, entries("g", 11, 21, 1), gen=2, reset=False)
    mt.drop_below(5)
    assert mt.first == 5 and [e.index for e in mt.entries] == list(range(5, 21))
    assert mt.marks == [Mark(1, 5, False), Mark(2, 11, False)]
    got = mt.flush_portion(1)
    assert got is not None and [e.index for e in got[0]] == list(range(5, 11)) and not got[1]
    mt.drop_below(5)  # already below: nothing changes
    mt.drop_below(3)
    assert mt.first == 5 and len(mt.marks) == 2
    mt.drop_below(15)  # all of generation 1 and part of 2
    assert mt.marks == [Mark(2, 15, False)]
    assert mt.flush_portion(1) is None
    got = mt.flush_portion(2)
    assert got is not None and [e.index for e in got[0]] == list(range(15, 21))
    mt.drop_below(11)  # a lower bound than before: nothing changes
    assert mt.first == 15


def test_drop_below_everything_empties_the_table_and_appends_go_on() -> None:
    mt = MemTable()
    mt.put(1, entries("g", 1, 11, 1), gen=1, reset=False)
    mt.drop_below(100)
    assert mt.entries == [] and mt.marks == [] and mt.flush_portion(1) is None
    assert not mt.put(11, entries("g", 11, 13, 1), gen=1, reset=False)
    assert mt.first == 11 and mt.marks == [Mark(1, 11, False)]


def test_drop_below_keeps_a_restarted_log_until_its_flush() -> None:
    """A RESET mark first (a snapshot installed): the flush must write that
    generation's first file, whose flag voids older segment files."""
    mt = MemTable()
    mt.put(101, entries("g", 101, 111, 3), gen=4, reset=True)
    mt.drop_below(106)
    assert mt.first == 101 and len(mt.entries) == 10 and mt.marks == [Mark(4, 101, True)]
    got = mt.flush_portion(4)
    assert got is not None and got[0][0].index == 101 and got[1]

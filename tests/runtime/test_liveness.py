"""Liveness (runtime/liveness.py) against a fake cluster: no process, a
hand-driven clock."""
from __future__ import annotations

from dataclasses import dataclass, field

from broker.runtime.liveness import Liveness


@dataclass
class FakeCluster:
    peers: dict[str, object] = field(default_factory=dict)
    incarnations: dict[str, str] = field(default_factory=dict)
    up: set[str] = field(default_factory=set)
    removed: list[str] = field(default_factory=list)

    def transport_up(self, peer: str) -> bool:
        return peer in self.up

    def remove_peer(self, name: str) -> None:
        self.peers.pop(name, None)
        self.incarnations.pop(name, None)
        self.removed.append(name)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(known: set[str] | None = None, open_refs: set[str] | None = None
         ) -> tuple[Liveness, FakeCluster, Clock, dict[str, set[str] | None]]:
    cluster = FakeCluster(peers={"b": (), "c": ()}, incarnations={"b": "b|1", "c": "c|1"},
                          up={"b", "c"})
    clock = Clock()
    k: dict[str, set[str] | None] = {"known": {"a", "b", "c"} if known is None else known}
    refs = open_refs or set()
    lv = Liveness("a", cluster, lambda: k["known"], lambda ref: ref in refs, clock, grace_s=10)
    return lv, cluster, clock, k


def test_a_peer_is_down_only_after_the_grace_period() -> None:
    lv, cluster, clock, _ = make()
    cluster.up.discard("b")
    lv.observe()
    assert not lv.channel_dead("b|1/c/1") and not lv.peer_gone("b")
    clock.t += 10.5
    lv.observe()  # still down: the first time it was seen down counts
    assert lv.channel_dead("b|1/c/1") and lv.peer_gone("b")
    assert not lv.channel_gone("b|1/c/1")  # only suspected: it may come back
    cluster.up.add("b")
    lv.observe()
    assert not lv.channel_dead("b|1/c/1")


def test_a_restarted_node_has_another_incarnation_so_its_old_channels_are_gone() -> None:
    lv, cluster, _, _ = make()
    cluster.incarnations["c"] = "c|2"
    assert lv.channel_gone("c|1/c/7") and lv.channel_dead("c|1/c/7")
    assert not lv.channel_gone("c|2/c/7")


def test_own_channels_are_gone_unless_open_here() -> None:
    lv, _, _, _ = make(open_refs={"a|1/c/1"})
    assert not lv.channel_gone("a|1/c/1")
    assert lv.channel_gone("a|1/c/2")
    assert not lv.channel_dead("a|1/c/1")


def test_a_departed_peer_is_forgotten_after_two_passes_and_its_channels_are_gone() -> None:
    lv, cluster, _, k = make()
    k["known"] = {"a", "b"}  # c left: not a member of anything any more
    assert lv.observe() == []  # first pass: only noted
    assert "c" in cluster.peers and not lv.channel_gone("c|1/c/1")
    assert lv.observe() == ["c"]  # second pass agrees: forgotten
    assert cluster.removed == ["c"] and "c" not in cluster.peers
    assert lv.channel_gone("c|1/c/1") and lv.channel_dead("c|1/c/1")
    assert lv.peer_gone("c")


def test_a_peer_missing_from_one_pass_only_stays() -> None:
    lv, cluster, _, k = make()
    k["known"] = {"a", "b"}
    lv.observe()
    k["known"] = {"a", "b", "c"}  # e.g. a join recorded meanwhile
    lv.observe()
    k["known"] = {"a", "b"}
    assert lv.observe() == []  # two passes in a row are needed
    assert cluster.removed == []


def test_no_authority_no_forgetting() -> None:
    """While this node is not a metadata member (None), nothing is forgotten."""
    lv, cluster, _, k = make()
    k["known"] = None
    lv.observe()
    lv.observe()
    assert cluster.removed == [] and set(cluster.peers) == {"b", "c"}


def test_a_departed_node_that_joins_again_is_a_peer_again() -> None:
    lv, cluster, _, k = make()
    k["known"] = {"a", "b"}
    lv.observe()
    lv.observe()
    assert lv.channel_gone("c|1/c/1")
    cluster.peers["c"] = ()  # its join re-added it
    cluster.incarnations["c"] = "c|2"
    assert not lv.channel_gone("c|2/c/1")


def test_single_node() -> None:
    lv = Liveness("a", None, lambda: {"a"}, lambda ref: False)
    assert lv.observe() == []
    assert lv.channel_gone("b|1/c/1") and lv.peer_gone("b")

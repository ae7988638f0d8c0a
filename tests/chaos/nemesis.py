"""The nemesis: faults from a seeded schedule, recorded in the history.

Two threads. The fault thread repeats: pick one fault kind (sometimes two at
once), start it, hold it for a random duration, stop it (heal), stay quiet
for a random time. The membership thread (when "membership" is enabled)
runs one membership operation after another over the management HTTP API,
during everything else. Every operation is a `start` and a `stop` event from
process "nemesis" with the same "id".

Fault kinds (`--nemesis` takes a comma-separated list of these or of the
groups `partitions`, `process`, `all`):

| kind | what |
| --- | --- |
| partition-halves | random halves, cut both ways (the leader may be on either side) |
| partition-ring | 5+ nodes: shuffled ring, each node reaches only its neighbours (a majority each, no two the same); 3 nodes: a bridge |
| partition-bridge | two halves and one node that reaches both |
| isolate-leader | the queue's leader cut off from every peer |
| isolate-random | a random node cut off from every peer |
| one-way | a node's packets to its peers dropped, or its peers' packets to it (one direction only) |
| kill | kill -9 a node (the leader half the time), restart it at stop |
| pause | SIGSTOP a node (the leader half the time), SIGCONT at stop |
| rolling-restart | SIGTERM and restart every node, one after the other |
| disk-full | fill the file system of one node's data directory (a 64 MiB tmpfs), free it at stop |
| membership | add_member, delete_member, grow, shrink, drain, transfer (`POST /api/nodes/{leader}/hand-off-leaders`), rebalance, in a loop |

The schedule is a function of the seed; what the cluster does with it is
not (real processes and clocks), so a replay repeats the faults, not the
exact history.
"""
from __future__ import annotations

import base64
import itertools
import json
import random
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .netns import ChaosCluster
from .workers import History

PARTITIONS = ("partition-halves", "partition-ring", "partition-bridge", "isolate-leader",
              "isolate-random", "one-way")
PROCESS = ("kill", "pause", "rolling-restart")
FAULTS = PARTITIONS + PROCESS + ("disk-full",)
ALL = FAULTS + ("membership",)
GROUPS = {"partitions": PARTITIONS, "process": PROCESS, "all": ALL}


def parse_kinds(spec: str) -> list[str]:
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part in GROUPS:
            out.extend(GROUPS[part])
        elif part in ALL:
            out.append(part)
        elif part != "none":
            raise ValueError(f"unknown nemesis {part!r}; known: {', '.join(ALL)}, "
                             f"{', '.join(GROUPS)}, none")
    return list(dict.fromkeys(out))


_AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


def http(method: str, url: str, body: Any = None, timeout: float = 5.0) -> tuple[int, Any]:
    """(status, decoded JSON or text); status 0 when the node did not answer."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", _AUTH)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode(errors="replace")
            status = r.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read().decode(errors="replace"), exc.code
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw


def q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


class Nemesis:
    def __init__(self, cluster: ChaosCluster, queue: str, history: History, seed: int,
                 kinds: list[str], fault_s: tuple[float, float] = (3.0, 8.0),
                 quiet_s: tuple[float, float] = (2.0, 5.0),
                 membership_s: tuple[float, float] = (1.0, 4.0), combine_p: float = 0.3) -> None:
        self.c = cluster
        self.queue = queue
        self.h = history
        self.seed = seed
        self.faults = [k for k in kinds if k in FAULTS]
        self.membership = "membership" in kinds
        self.rng = random.Random(f"{seed}/nemesis")
        self.mrng = random.Random(f"{seed}/membership")
        self.fault_s, self.quiet_s, self.membership_s = fault_s, quiet_s, membership_s
        self.combine_p = combine_p
        self.names = cluster.names()
        self.stop_event = threading.Event()
        self._ids = itertools.count(1)
        self._cuts: dict[int, set[tuple[int, int]]] = {}
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self.membership_ops = 0
        self.restart_timeout = 60.0
        # a membership operation may run longer on the broker (add_member waits
        # up to 60 s for the promotion); the loop moves on after this and the
        # operation finishes (or not) on its own
        self.http_timeout = 30.0

    # ------------------------------------------------------------ observation
    def leader(self) -> tuple[int | None, list[int]]:
        """(leader index, member indexes) as the live nodes report them: a node
        that names itself leader wins; else the most common answer."""
        answers: dict[int, dict[str, Any]] = {}

        def ask(i: int) -> None:
            st, body = http("GET", f"{self.c.mgmt_url(i)}/api/queues/%2F/{q(self.queue)}", timeout=3.0)
            if st == 200 and isinstance(body, dict):
                answers[i] = body
        ts = [threading.Thread(target=ask, args=(i,), daemon=True) for i in self.c.alive()]
        for t in ts:
            t.start()
        for t in ts:
            t.join(4.0)
        idx = {n: i for i, n in enumerate(self.names)}
        members: list[int] = []
        votes: dict[int, int] = {}
        leader = None
        for i, body in list(answers.items()):
            lead = idx.get(str(body.get("leader")))
            members = [idx[m] for m in body.get("members", []) if m in idx] or members
            if lead is None:
                continue
            if lead == i:
                leader = i
            votes[lead] = votes.get(lead, 0) + 1
        if leader is None and votes:
            leader = max(votes, key=lambda k: votes[k])
        return leader, members

    def _reach(self, blocked: set[tuple[int, int]], a: int, b: int) -> bool:
        return (a, b) not in blocked and (b, a) not in blocked

    def _leader_cut_by(self, blocked: set[tuple[int, int]], leader: int | None,
                       members: list[int]) -> bool:
        if leader is None:
            return False
        mem = members or list(range(self.c.n))
        reach = sum(1 for m in mem if m == leader or self._reach(blocked, leader, m))
        return reach < len(mem) // 2 + 1

    # ------------------------------------------------------------ cuts
    def _apply_cuts(self) -> None:
        with self._lock:
            union = set().union(*self._cuts.values()) if self._cuts else set()
        self.c.net.set_blocked(union)

    def _partition(self, kind: str, leader: int | None) -> tuple[str, set[tuple[int, int]]]:
        n, rng = self.c.n, self.rng
        nodes = list(range(n))
        rng.shuffle(nodes)
        cut: set[tuple[int, int]] = set()

        def both(a: int, b: int) -> None:
            cut.add((a, b))
            cut.add((b, a))
        if kind == "partition-halves":
            k = n // 2
            side_a, side_b = nodes[:k], nodes[k:]
            for a in side_a:
                for b in side_b:
                    both(a, b)
            return f"{sorted(side_a)}|{sorted(side_b)}", cut
        if kind == "partition-ring" and n >= 5:
            # each node reaches the nodes within distance k on a shuffled ring
            k = (n // 2 + 1) // 2
            for x in range(n):
                for y in range(x + 1, n):
                    d = min((x - y) % n, (y - x) % n)
                    if d > k:
                        both(nodes[x], nodes[y])
            return f"ring {nodes} reach ±{k}", cut
        if kind in ("partition-bridge", "partition-ring"):
            bridge, rest = nodes[0], nodes[1:]
            half = len(rest) // 2
            side_a, side_b = rest[:half], rest[half:]
            for a in side_a:
                for b in side_b:
                    both(a, b)
            return f"bridge {bridge}: {sorted(side_a)}|{sorted(side_b)}", cut
        if kind in ("isolate-leader", "isolate-random"):
            x = leader if kind == "isolate-leader" and leader is not None else rng.randrange(n)
            for y in range(n):
                if y != x:
                    both(x, y)
            return f"isolate {x}", cut
        if kind == "one-way":
            x = leader if leader is not None and rng.random() < 0.5 else rng.randrange(n)
            outbound = rng.random() < 0.5
            for y in range(n):
                if y != x:
                    cut.add((x, y) if outbound else (y, x))
            return f"{x} {'->' if outbound else '<-'} all dropped", cut
        raise ValueError(kind)

    # ------------------------------------------------------------ one fault
    def _start(self, kind: str, fid: int) -> Any:
        """Start fault `kind`; return what _stop needs."""
        leader, members = self.leader()
        if kind in PARTITIONS:
            desc, cut = self._partition(kind, leader)
            with self._lock:
                self._cuts[fid] = cut
            self._apply_cuts()
            self._event(kind, fid, "start", desc, leader, self._leader_cut_by(cut, leader, members))
            return None
        if kind in ("kill", "pause"):
            alive = self.c.alive()
            if not alive:
                return None
            x = leader if leader in alive and self.rng.random() < 0.5 else self.rng.choice(alive)
            self._event(kind, fid, "start", x, leader, x == leader)
            (self.c.kill if kind == "kill" else self.c.pause)(x)
            return x
        if kind == "disk-full":
            x = self.c.tmpfs_node
            if x is None:
                raise ValueError("disk-full needs a tmpfs node (RunConfig sets one up)")
            self._event(kind, fid, "start", x, leader, False)
            self.c.fill_disk()
            return x
        if kind == "rolling-restart":
            self._event(kind, fid, "start", "all", leader, False)
            for i in range(self.c.n):
                if self.stop_event.is_set():
                    break
                lead, _ = self.leader()
                sub = f"{fid}.{i}"
                self._event(kind, sub, "start", i, lead, i == lead)
                if i in self.c.down or i in self.c.paused:
                    self._event(kind, sub, "stop", i, lead, False)
                    continue
                self.c.nodes[i].stop()
                self.c.down.add(i)
                self.c.restart(i, timeout=self.restart_timeout)
                self._event(kind, sub, "stop", i, None, False)
            return None
        raise ValueError(kind)

    def _stop(self, kind: str, fid: int, state: Any) -> None:
        if kind in PARTITIONS:
            with self._lock:
                self._cuts.pop(fid, None)
            self._apply_cuts()
        elif kind == "kill" and state is not None:
            self.c.restart(state, timeout=self.restart_timeout)
        elif kind == "pause" and state is not None:
            self.c.resume(state)
        elif kind == "disk-full":
            self.c.free_disk()
        self._event(kind, fid, "stop", state, None, False)

    def _event(self, kind: str, fid: Any, phase: str, value: Any, leader: int | None,
               leader_cut: bool, **extra: Any) -> None:
        self.h.add(process="nemesis", type="info", f=kind, id=str(fid), phase=phase, value=value,
                   leader=leader, leader_cut=leader_cut, **extra)

    # ------------------------------------------------------------ loops
    def _fault_loop(self) -> None:
        while not self.stop_event.is_set() and self.faults:
            n_at_once = 2 if len(self.faults) > 1 and self.rng.random() < self.combine_p else 1
            kinds = self.rng.sample(self.faults, n_at_once)
            if "rolling-restart" in kinds:
                kinds = ["rolling-restart"]
            hold = self.rng.uniform(*self.fault_s)
            quiet = self.rng.uniform(*self.quiet_s)
            active = []
            for kind in kinds:
                fid = next(self._ids)
                try:
                    active.append((kind, fid, self._start(kind, fid)))
                except Exception as exc:  # noqa: BLE001 - recorded; the run goes on
                    self.errors.append(f"{kind} start: {exc!r}")
                    if kind == "disk-full":
                        self.c.free_disk()
                    self._event(kind, fid, "stop", f"error: {exc!r}"[:300], None, False)
            if kinds != ["rolling-restart"]:
                self.stop_event.wait(hold)
            # disk and network first: a node restarted by the kill's stop needs them
            order = {"disk-full": 0, **dict.fromkeys(PARTITIONS, 1)}
            for kind, fid, state in sorted(active, key=lambda a: order.get(a[0], 2)):
                if kind == "rolling-restart":
                    self._event(kind, fid, "stop", "all", None, False)
                    continue
                try:
                    self._stop(kind, fid, state)
                except Exception as exc:  # noqa: BLE001
                    self.errors.append(f"{kind} stop: {exc!r}")
            self.stop_event.wait(quiet)

    def _membership_loop(self) -> None:
        while not self.stop_event.is_set():
            self.stop_event.wait(self.mrng.uniform(*self.membership_s))
            if self.stop_event.is_set():
                break
            try:
                self._membership_op()
            except Exception as exc:  # noqa: BLE001 - recorded; the run goes on
                self.errors.append(f"membership: {exc!r}")

    def _membership_op(self) -> None:
        rng = self.mrng
        leader, members = self.leader()
        alive = self.c.alive()
        if not alive or not members:
            return
        nonmembers = [i for i in range(self.c.n) if i not in members]
        ops = ["rebalance"]
        if leader is not None:
            ops += ["transfer", "transfer"]  # leadership transfer in a loop
        if nonmembers:
            ops += ["add_member", "grow"]
        if len(members) > 2:
            ops += ["delete_member", "shrink", "drain"]
        elif nonmembers:
            ops += ["drain"]
        if nonmembers and len(members) < 3:
            # two members survive no fault: restore a third before anything else
            ops = ["add_member", "grow"]
        op = rng.choice(ops)
        via = rng.choice(alive)
        base = self.c.mgmt_url(via)
        vq = f"/api/queues/%2F/{q(self.queue)}"
        if op == "add_member":
            x = rng.choice(nonmembers)
            req = ("POST", f"{vq}/members", {"node": self.names[x]})
        elif op == "grow":
            x = rng.choice(nonmembers)
            req = ("POST", "/api/quorum-queues/grow", {"node": self.names[x], "strategy": "all"})
        elif op == "delete_member":
            x = rng.choice(members)
            req = ("DELETE", f"{vq}/members/{q(self.names[x])}", None)
        elif op == "shrink":
            x = rng.choice(members)
            req = ("POST", "/api/quorum-queues/shrink", {"node": self.names[x]})
        elif op == "drain":
            # the leader's node half the time: a leadership transfer, then a move
            x = leader if leader is not None and rng.random() < 0.5 else rng.choice(members)
            req = ("POST", f"/api/nodes/{q(self.names[x])}/drain", {})
        elif op == "transfer":
            # every leadership the leader's node holds moves to another member
            x = leader
            assert x is not None
            req = ("POST", f"/api/nodes/{q(self.names[x])}/hand-off-leaders", {})
        else:
            x = None
            req = ("POST", "/api/quorum-queues/rebalance", {})
        fid = next(self._ids)
        self._event("membership", fid, "start", {"op": op, "node": x, "via": via,
                                                 "members": members}, leader, False)
        status, body = http(req[0], base + req[1], req[2], timeout=self.http_timeout)
        self.membership_ops += 1
        self._event("membership", fid, "stop", {"op": op, "node": x, "status": status,
                                                "result": str(body)[:300]}, None, False)

    def _observe_loop(self) -> None:
        """Record the queue's leader and members whenever they change (about
        once a second), so a lost value can be matched to the leader of the
        time."""
        last: tuple[int | None, tuple[int, ...]] | None = None
        while not self.stop_event.wait(1.0):
            try:
                leader, members = self.leader()
            except Exception as exc:  # noqa: BLE001
                self.errors.append(f"observer: {exc!r}")
                continue
            now = (leader, tuple(members))
            if now != last:
                self.h.add(process="observer", type="info", f="leader",
                           value={"leader": leader, "members": members})
                last = now

    # ------------------------------------------------------------ control
    def start(self) -> None:
        self.threads.append(threading.Thread(target=self._observe_loop, name="nemesis-observer",
                                             daemon=True))
        if self.faults:
            self.threads.append(threading.Thread(target=self._fault_loop, name="nemesis-faults",
                                                 daemon=True))
        if self.membership:
            self.threads.append(threading.Thread(target=self._membership_loop,
                                                 name="nemesis-membership", daemon=True))
        for t in self.threads:
            t.start()

    def stop(self, timeout: float = 200.0) -> None:
        """Stop the schedule (the current fault is stopped by its loop)."""
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout)
            if t.is_alive():
                self.errors.append(f"{t.name} did not stop within {timeout:.0f}s")

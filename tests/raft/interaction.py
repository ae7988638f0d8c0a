"""A tiny interpreter for Raft scenario transcripts (in the style of
etcd-raft's `testdata/*.txt` interaction tests).

A transcript is a sequence of blocks separated by blank lines:

    # comments start with '#'
    <command> <args...>
    ----
    <expected output lines>

Commands (node ids are strings):
    cluster 1 2 3 [spares=4,5] [check_quorum=false] [pre_vote=false] [auto_promote=false] [chunk=16]
    campaign N | propose N DATA | propose-batch N COUNT
    add-learner N TARGET | promote N TARGET | remove N TARGET | transfer N TARGET
    tick [N...] [xCOUNT]  tick the given nodes (all by default) COUNT times, stabilizing each time
    stabilize            deliver messages until quiet, printing each one
    isolate N... | heal | crash N | restart N | snapshot N
    async-disk N...      N's writes stay pending until `flush N`
    flush N              N's pending writes become durable (persisted() is called)
    status N... | log N
Output of `stabilize`/`tick` lists every message as `src->dst Kind fields`
(with `DROPPED` when the network is cut) and every role change.
"""
from __future__ import annotations

from pathlib import Path

from broker.raft import (
    AppendEntries,
    AppendResponse,
    ConfChange,
    ConfChangeKind,
    Entry,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    Message,
    NodeId,
    RaftConfig,
    RaftError,
    RequestVote,
    RequestVoteResponse,
    TimeoutNow,
)
from tests.raft.harness import Cluster


def fmt_entry(e: Entry) -> str:
    data = e.data.decode(errors="replace").replace("\n", "|")
    return f"{e.index}/{e.term} {e.kind.name}" + (f" {data!r}" if e.data else "")


def fmt_msg(m: Message) -> str:
    h = f"{m.src}->{m.dst}"
    if isinstance(m, RequestVote):
        kind = "MsgPreVote" if m.pre_vote else "MsgVote"
        extra = " transfer" if m.transfer else ""
        return f"{h} {kind} term={m.term} last=({m.last_log_index},{m.last_log_term}){extra}"
    if isinstance(m, RequestVoteResponse):
        kind = "MsgPreVoteResp" if m.pre_vote else "MsgVoteResp"
        return f"{h} {kind} term={m.term} {'granted' if m.granted else 'rejected'}"
    if isinstance(m, AppendEntries):
        ents = ", ".join(fmt_entry(e) for e in m.entries)
        return f"{h} MsgApp term={m.term} prev=({m.prev_log_index},{m.prev_log_term}) commit={m.commit} [{ents}]"
    if isinstance(m, AppendResponse):
        if m.reject:
            return f"{h} MsgAppResp term={m.term} reject index={m.index} hint=({m.hint_index},{m.hint_term})"
        return f"{h} MsgAppResp term={m.term} index={m.index}"
    if isinstance(m, Heartbeat):
        return f"{h} MsgHeartbeat term={m.term} commit={m.commit}"
    if isinstance(m, HeartbeatResponse):
        return f"{h} MsgHeartbeatResp term={m.term}"
    if isinstance(m, InstallSnapshot):
        return (
            f"{h} MsgSnap term={m.term} snap=({m.meta.index},{m.meta.term}) offset={m.offset} "
            f"len={len(m.data)}{' done' if m.done else ''}"
        )
    if isinstance(m, InstallSnapshotResponse):
        return f"{h} MsgSnapResp term={m.term} snap={m.snapshot_index} next={m.next_offset}{' done' if m.done else ''}"
    if isinstance(m, TimeoutNow):
        return f"{h} MsgTimeoutNow term={m.term}"
    raise TypeError(m)


class Interpreter:
    def __init__(self) -> None:
        self.c: Cluster | None = None

    @property
    def cluster(self) -> Cluster:
        if self.c is None:
            raise ValueError("no cluster: start with `cluster ...`")
        return self.c

    def run(self, cmd: str) -> list[str]:
        words = cmd.split()
        op, args = words[0], words[1:]
        out: list[str] = []
        try:
            getattr(self, "cmd_" + op.replace("-", "_"))(args, out)
        except RaftError as exc:
            out.append(f"error: {type(exc).__name__}: {exc}")
        return out

    # --- setup
    def cmd_cluster(self, args: list[str], out: list[str]) -> None:
        ids = [a for a in args if "=" not in a]
        opts = dict(a.split("=", 1) for a in args if "=" in a)
        cfg = RaftConfig(
            check_quorum=opts.get("check_quorum", "true") == "true",
            pre_vote=opts.get("pre_vote", "true") == "true",
            auto_promote=opts.get("auto_promote", "true") == "true",
            snapshot_chunk_size=int(opts.get("chunk", "1048576")),
        )
        spares = [s for s in opts.get("spares", "").split(",") if s]
        self.c = Cluster(ids, seed=int(opts.get("seed", "0")), cfg=cfg, spares=spares)
        out.append("ok")

    # --- driving
    def _stabilize(self, out: list[str]) -> None:
        c = self.cluster
        for _ in range(1000):
            for h in c.hosts.values():
                if h.alive:
                    h.process()
                    out.extend(h.events)
                    h.events.clear()
            msgs = []
            for h in c.hosts.values():
                msgs.extend(h.outbox)
                h.outbox.clear()
            if not msgs:
                return
            for m in msgs:
                dst = c.hosts.get(m.dst)
                if dst is None or not dst.alive or not c.can_reach(m.src, m.dst):
                    out.append(fmt_msg(m) + " DROPPED")
                    continue
                out.append(fmt_msg(m))
                dst.node.step(m)
        raise AssertionError("did not stabilize")

    def cmd_stabilize(self, args: list[str], out: list[str]) -> None:
        self._stabilize(out)

    def cmd_tick(self, args: list[str], out: list[str]) -> None:
        count = 1
        ids = []
        for a in args:
            if a.startswith("x"):
                count = int(a[1:])
            else:
                ids.append(a)
        for _ in range(count):
            self.cluster.tick(ids or None)
            self._stabilize(out)

    def cmd_campaign(self, args: list[str], out: list[str]) -> None:
        self.cluster.node(args[0]).campaign()
        self._stabilize(out)

    def cmd_propose(self, args: list[str], out: list[str]) -> None:
        idx = self.cluster.node(args[0]).propose(" ".join(args[1:]).encode())
        out.append(f"index {idx}")
        self._stabilize(out)

    def cmd_propose_batch(self, args: list[str], out: list[str]) -> None:
        idxs = self.cluster.node(args[0]).propose_batch([b"b%d" % k for k in range(int(args[1]))])
        out.append(f"indexes {idxs[0]}..{idxs[-1]}")
        self._stabilize(out)

    def _conf(self, kind: ConfChangeKind, args: list[str], out: list[str]) -> None:
        idx = self.cluster.node(args[0]).propose_conf_change(ConfChange(kind, NodeId(args[1])))
        out.append(f"index {idx}")
        self._stabilize(out)

    def cmd_add_learner(self, args: list[str], out: list[str]) -> None:
        self._conf(ConfChangeKind.ADD_LEARNER, args, out)

    def cmd_promote(self, args: list[str], out: list[str]) -> None:
        self._conf(ConfChangeKind.PROMOTE, args, out)

    def cmd_remove(self, args: list[str], out: list[str]) -> None:
        self._conf(ConfChangeKind.REMOVE, args, out)

    def cmd_transfer(self, args: list[str], out: list[str]) -> None:
        self.cluster.node(args[0]).transfer_leadership(args[1])
        self._stabilize(out)

    # --- asynchronous durability
    def cmd_async_disk(self, args: list[str], out: list[str]) -> None:
        """Writes of these nodes stay pending until `flush N` (a slow fsync)."""
        for nid in args:
            self.cluster.hosts[nid].persist_delay = lambda: 1 << 40
        out.append("ok")

    def cmd_flush(self, args: list[str], out: list[str]) -> None:
        """Complete the pending writes of N: they are now durable."""
        h = self.cluster.hosts[args[0]]
        out.append(f"{args[0]}: {len(h.pending)} write(s) now durable")
        h.flush_writes(1 << 41)
        self._stabilize(out)

    # --- faults
    def cmd_isolate(self, args: list[str], out: list[str]) -> None:
        self.cluster.isolated = set(args)
        out.append("ok")

    def cmd_heal(self, args: list[str], out: list[str]) -> None:
        self.cluster.isolated = set()
        out.append("ok")

    def cmd_crash(self, args: list[str], out: list[str]) -> None:
        self.cluster.crash(args[0])
        out.append("ok")

    def cmd_restart(self, args: list[str], out: list[str]) -> None:
        self.cluster.restart(args[0])
        self.cmd_status(args, out)

    def cmd_snapshot(self, args: list[str], out: list[str]) -> None:
        h = self.cluster.hosts[args[0]]
        h.take_snapshot()
        m = h.storage.snapshot().meta
        out.append(f"snapshot at ({m.index},{m.term}) first index now {h.node.log.first_index()}")

    # --- inspection
    def cmd_status(self, args: list[str], out: list[str]) -> None:
        for nid in args:
            s = self.cluster.node(nid).status()
            voters = ",".join(sorted(s.config.voters))
            learners = ",".join(sorted(s.config.learners))
            out.append(
                f"{nid}: {s.role.value} term={s.term} leader={s.leader} commit={s.commit} "
                f"applied={s.applied} last={s.last_index} voters={voters}"
                + (f" learners={learners}" if learners else "")
            )
            for p, ps in sorted(s.progress.items()):
                out.append(
                    f"  {p}: match={ps.match} next={ps.next} {ps.state}"
                    + (" learner" if ps.is_learner else "")
                )

    def cmd_log(self, args: list[str], out: list[str]) -> None:
        n = self.cluster.node(args[0])
        lo = n.log.first_index()
        out.extend(fmt_entry(e) for e in n.log.slice(lo, n.log.last_index() + 1, None))
        if lo > 1:
            out.insert(len(out) - (n.log.last_index() + 1 - lo), f"(compacted up to {lo - 1})")


def parse(text: str) -> list[tuple[int, list[str], list[str]]]:
    """Blocks of (line number, command lines, expected output lines)."""
    blocks = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            i += 1
            continue
        start = i
        cmds = []
        while i < len(lines) and lines[i] != "----":
            if lines[i].strip() and not lines[i].startswith("#"):
                cmds.append(lines[i])
            i += 1
        i += 1  # skip ----
        expected = []
        while i < len(lines) and lines[i].strip():
            expected.append(lines[i])
            i += 1
        blocks.append((start + 1, cmds, expected))
    return blocks


def replay(path: Path, rewrite: bool = False) -> list[str]:
    """Run a transcript; return mismatch descriptions (rewrite: update the file)."""
    text = path.read_text()
    interp = Interpreter()
    problems = []
    out_text = []
    for lineno, cmds, expected in parse(text):
        got: list[str] = []
        for cmd in cmds:
            got.extend(interp.run(cmd))
        if got != expected:
            diff = "\n".join(f"  - {e}" for e in expected) + "\n" + "\n".join(f"  + {g}" for g in got)
            problems.append(f"{path.name}:{lineno}: {' / '.join(cmds)}\n{diff}")
        out_text.append((cmds, got))
    if rewrite:
        # Keep comments that precede each block by re-emitting the original
        # text up to each '----' and replacing the outputs.
        res = []
        lines = text.split("\n")
        i = 0
        k = 0
        while i < len(lines):
            res.append(lines[i])
            if lines[i] == "----":
                i += 1
                while i < len(lines) and lines[i].strip():
                    i += 1
                res.extend(out_text[k][1])
                k += 1
                continue
            i += 1
        path.write_text("\n".join(res))
    return problems

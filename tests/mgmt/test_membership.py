"""Quorum-queue membership operations through the management API and qqctl,
against a real 3-node cluster: add/delete member, grow, shrink, rebalance,
drain, quorum status, quorum-critical checks, and their refusals. The last
test kills a node (the module's cluster is not reused after it)."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

from broker import cli

from .conftest import ROOT_DIR, Api, MgmtCluster, wait_for

QQ = {"durable": True, "arguments": {"x-queue-type": "quorum"}}


def qq(size: int) -> dict[str, Any]:
    return {"durable": True, "arguments": {"x-queue-type": "quorum",
                                           "x-quorum-initial-group-size": size}}


def qqctl(c: MgmtCluster, node: int, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    url = f"http://127.0.0.1:{c.nodes[node].management_port}"
    code = cli.main(["--url", url, *args], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def members(api: Api, name: str) -> list[str]:
    status, body = api.get(f"/api/queues/%2F/{name}")
    assert status == 200, body
    return sorted(body["members"])


def declare(c: MgmtCluster, node: int, name: str, size: int) -> None:
    assert c.apis[node].put(f"/api/queues/%2F/{name}", qq(size))[0] == 201
    for api in c.apis:
        wait_for(lambda api=api: api.get(f"/api/queues/%2F/{name}")[0] == 200,
                 what=f"queue {name} everywhere")


def test_add_and_delete_member(mgmt_cluster: MgmtCluster) -> None:
    c = mgmt_cluster
    a0, a1, _ = c.apis
    declare(c, 0, "m1", 2)
    before = members(a0, "m1")
    assert len(before) == 2 and c.names[0] in before
    missing = next(n for n in c.names if n not in before)
    assert a1.post("/api/queues/%2F/m1/members", {"node": missing}) == (204, None)
    wait_for(lambda: members(a0, "m1") == sorted(c.names), what="three members")
    status = a1.get("/api/queues/%2F/m1/quorum-status")[1]
    assert sorted(m["node"] for m in status) == sorted(c.names)
    assert all(m["voter"] for m in status)
    assert sum(m["raft_state"] == "leader" for m in status) == 1
    # refusals
    status_code, body = a0.post("/api/queues/%2F/m1/members", {"node": missing})
    assert status_code == 400 and "already a member" in body["reason"]
    assert a0.post("/api/queues/%2F/m1/members", {"node": "rabbit@nowhere"})[0] == 404
    assert a0.post("/api/queues/%2F/m1/members", {"node": missing, "x": 1})[0] == 400
    assert a0.post("/api/queues/%2F/nope/members", {"node": missing})[0] == 404
    # delete it again (via qqctl)
    code, out, err = qqctl(c, 2, "delete_member", "m1", missing)
    assert code == 0, err
    assert "deleted the member" in out
    wait_for(lambda: members(a1, "m1") == before, what="two members again")
    code, _, err = qqctl(c, 2, "delete_member", "m1", missing)
    assert code == 1 and "is not a member" in err and "HTTP 404" in err
    # a classic queue has no members to manage
    assert a0.put("/api/queues/%2F/classic-q", {"durable": True, "type": "classic"})[0] == 201
    status_code, body = a0.post("/api/queues/%2F/classic-q/members", {"node": missing})
    assert status_code == 400 and "not a quorum queue" in body["reason"]
    code, out, err = qqctl(c, 1, "add_member", "m1", missing)
    assert code == 0, err
    wait_for(lambda: members(a0, "m1") == sorted(c.names), what="three members (qqctl)")
    code, out, _ = qqctl(c, 0, "--json", "quorum_status", "m1")
    assert code == 0 and sorted(m["node"] for m in json.loads(out)) == sorted(c.names)
    code, out, _ = qqctl(c, 0, "quorum_status", "m1")
    assert out.splitlines()[0].split()[:2] == ["node", "raft_state"]
    assert len(out.splitlines()) == 4


def test_grow_with_progress_and_shrink(mgmt_cluster: MgmtCluster) -> None:
    c = mgmt_cluster
    a0 = c.apis[0]
    for name in ("g1", "g2"):
        declare(c, 0, name, 1)
    declare(c, 0, "other1", 1)
    target = c.names[1]
    status, text = a0.call("POST", "/api/quorum-queues/grow?progress=true",
                           {"node": target, "strategy": "all", "queue_pattern": "^g"})
    assert status == 200
    lines = [json.loads(x) for x in text.splitlines()] if isinstance(text, str) else [text]
    progress = [x["progress"] for x in lines if "progress" in x]
    assert [(p["name"], p["result"], p["done"], p["total"]) for p in progress] == [
        ("g1", "ok", 1, 2), ("g2", "ok", 2, 2)]
    assert [r["name"] for r in lines[-1]["result"]] == ["g1", "g2"]
    for name in ("g1", "g2"):
        wait_for(lambda name=name: target in members(a0, name), what=f"{name} grown")
    assert members(a0, "other1") == [c.names[0]]  # the pattern kept it out
    # qqctl grow onto the third node, 'even' strategy: only queues with an even member count
    code, out, err = qqctl(c, 2, "grow", c.names[2], "even", "--queue-pattern", "^g|^other")
    assert code == 0, err
    assert "[1/2] queue 'g1' in vhost '/': ok" in err
    assert "[2/2] queue 'g2' in vhost '/': ok" in err  # other1 has 1 member: odd
    assert "g1" in out and "ok" in out
    for name in ("g1", "g2"):
        wait_for(lambda name=name: members(a0, name) == sorted(c.names), what=f"{name} on 3")
    assert members(a0, "other1") == [c.names[0]]
    # shrink the third node off everything, reporting errors only
    code, out, err = qqctl(c, 0, "shrink", c.names[2], "--errors-only")
    assert code == 0, err
    assert out.strip() == "(none)"
    for name in ("g1", "g2"):
        wait_for(lambda name=name: c.names[2] not in members(a0, name), what=f"{name} shrunk")
    status, body = a0.post("/api/quorum-queues/grow", {"node": target, "strategy": "most"})
    assert status == 400 and "strategy" in body["reason"]


def test_rebalance_spreads_leaders(mgmt_cluster: MgmtCluster) -> None:
    c = mgmt_cluster
    a0 = c.apis[0]
    names = [f"rb{i}" for i in range(6)]
    for name in names:
        declare(c, 0, name, 1)  # one member: led by node 1 ...
    for node in c.names[1:]:  # ... and still after growing onto the others
        status, results = a0.post("/api/quorum-queues/grow",
                                  {"node": node, "strategy": "all", "queue_pattern": "^rb"})
        assert status == 200 and [r["result"] for r in results] == ["ok"] * 6, results
    for name in names:
        wait_for(lambda name=name: members(a0, name) == sorted(c.names), what=f"{name} on 3")

    def leaders() -> dict[str, int]:
        out = {n: 0 for n in c.names}
        for name in names:
            out[a0.get(f"/api/queues/%2F/{name}")[1]["leader"]] += 1
        return out
    assert leaders()[c.names[0]] == 6
    code, out, err = qqctl(c, 1, "rebalance", "quorum", "--queue-pattern", "^rb")
    assert code == 0, err
    assert "[6/6]" in err
    spread = wait_for(lambda: (x := leaders()) and max(x.values()) - min(x.values()) <= 1 and x,
                      what="leaders spread")
    assert sorted(spread.values()) == [2, 2, 2]
    status, results = a0.post("/api/quorum-queues/rebalance", {"queue_pattern": "^rb"})
    assert status == 200 and len(results) == 6 and all(r["result"] == "ok" for r in results)


def test_drain_moves_everything_off_a_node(mgmt_cluster: MgmtCluster) -> None:
    c = mgmt_cluster
    a0 = c.apis[0]
    gone = c.names[2]
    declare(c, 2, "dr1", 2)  # a member (and the leader) on the node to drain
    assert gone in members(a0, "dr1")
    code, out, err = qqctl(c, 0, "drain", gone)
    assert code == 0, err
    assert "dr1" in out
    for r in a0.get("/api/queues")[1]:
        if r["type"] == "quorum":
            assert gone not in r["members"], r
            assert r["leader"] != gone
    assert len(members(a0, "dr1")) == 2
    code, out, _ = qqctl(c, 0, "check_if_node_is_quorum_critical", "--node", gone)
    assert code == 0 and out.startswith("ok")


def test_cluster_status_and_list_queues(mgmt_cluster: MgmtCluster) -> None:
    c = mgmt_cluster
    code, out, _ = qqctl(c, 1, "cluster_status")
    assert code == 0
    rows = out.splitlines()
    assert rows[0].split()[0] == "name" and len(rows) == 4
    code, out, _ = qqctl(c, 1, "--json", "cluster_status")
    status = json.loads(out)
    assert sorted(n["name"] for n in status["nodes"]) == sorted(c.names)
    code, out, _ = qqctl(c, 0, "--json", "list_queues")
    listed = {q["name"]: q for q in json.loads(out)}
    assert {"m1", "g1", "rb0"} <= set(listed)
    code, out, _ = qqctl(c, 0, "list_queues", "--columns", "name,type,members")
    assert out.splitlines()[0].split() == ["name", "type", "members"]
    assert any(line.split()[:2] == ["m1", "quorum"] for line in out.splitlines())


def test_cli_policies_and_failures(mgmt_cluster: MgmtCluster) -> None:
    c = mgmt_cluster
    code, out, err = qqctl(c, 0, "set_policy", "lim", "^m1$", '{"max-length": 7}',
                           "--apply-to", "queues", "--priority", "2")
    assert code == 0, err
    wait_for(lambda: c.apis[1].get("/api/queues/%2F/m1")[1]["effective_policy_definition"]
             == {"max-length": 7}, what="the policy applied")
    code, _, err = qqctl(c, 0, "set_policy", "bad", ".*", '{"max-length": "x"}')
    assert code == 1 and "not a valid maximum length" in err
    code, _, err = qqctl(c, 0, "set_policy", "bad", ".*", "{nope")
    assert code == 2 and "not valid JSON" in err
    code, out, err = qqctl(c, 0, "set_policy", "--operator", "op", "^m1$", '{"max-length": 4}')
    assert code == 0, err
    wait_for(lambda: c.apis[2].get("/api/queues/%2F/m1")[1]["operator_policy"] == "op",
             what="the operator policy")
    assert qqctl(c, 0, "clear_policy", "--operator", "op")[0] == 0
    assert qqctl(c, 0, "clear_policy", "lim")[0] == 0
    code, _, err = qqctl(c, 0, "clear_policy", "lim")
    assert code == 1 and "no policy 'lim'" in err and "HTTP 404" in err
    code, _, err = qqctl(c, 0, "--password", "wrong", "list_queues")
    assert code == 1 and "HTTP 401" in err
    out, errio = io.StringIO(), io.StringIO()
    code = cli.main(["--url", "http://127.0.0.1:1", "cluster_status"], out=out, err=errio)
    assert code == 69 and "cannot reach" in errio.getvalue()
    assert cli.main(["no_such_command"], out=out, err=io.StringIO()) == 2


def test_qqctl_entry_point_runs(mgmt_cluster: MgmtCluster) -> None:
    env_url = f"http://127.0.0.1:{mgmt_cluster.nodes[0].management_port}"
    proc = subprocess.run([sys.executable, "-m", "broker.cli", "--json", "cluster_status"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT_DIR,
                          env={"QQCTL_URL": env_url, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["nodes"]) == 3


def test_storage_of_each_member_and_node(mgmt_cluster: MgmtCluster) -> None:
    """`GET /api/queues/{vhost}/{name}/storage`: each member's own segment and
    snapshot files (every node answers for its replica); `/api/nodes`: each
    node's WAL and segment bytes. Compared with the files on disk."""
    c = mgmt_cluster
    declare(c, 0, "st1", 2)
    holders = members(c.apis[0], "st1")
    status, body = c.apis[2].get("/api/queues/%2F/st1/storage")
    assert status == 200, body
    assert sorted(m["node"] for m in body) == holders
    for m in body:
        assert {"segment_files", "segment_bytes", "snapshot_bytes"} <= m.keys()
        assert m["segment_files"] >= 0 and m["segment_bytes"] >= 0 and m["snapshot_bytes"] >= 0
    classic = c.apis[0].put("/api/queues/%2F/st-classic", {"durable": True})
    assert classic[0] == 201
    code, err = c.apis[0].get("/api/queues/%2F/st-classic/storage")
    assert code == 400 and "not a quorum queue" in err["reason"]
    assert c.apis[0].get("/api/queues/%2F/nope/storage")[0] == 404
    _, nodes = c.apis[1].get("/api/nodes")
    for n in nodes:
        assert n["wal_bytes"] > 0, n  # the metadata's log at least
        assert n["segment_files"] >= 0 and n["segment_bytes"] >= 0 and n["snapshot_bytes"] >= 0
    # a 2-member queue is always quorum-critical: the next test must not see it
    for q in ("st1", "st-classic"):
        assert c.apis[0].delete(f"/api/queues/%2F/{q}")[0] == 204


def test_quorum_critical_and_forced_delete_with_a_node_down(mgmt_cluster: MgmtCluster) -> None:
    """Runs last: kills the third node."""
    c = mgmt_cluster
    a0, a1, _ = c.apis
    declare(c, 0, "crit", 3)
    declare(c, 0, "crit2", 3)
    code, _, err = qqctl(c, 0, "await_online_quorum_plus_one", "--node", c.names[2],
                         "--timeout", "10")
    assert code == 0, err
    c.nodes[2].kill()
    wait_for(lambda: not {n["name"]: n for n in a0.get("/api/nodes")[1]}[c.names[2]]["running"],
             what="node 3 seen down")
    status, body = a0.get("/api/health/checks/node-is-quorum-critical")
    assert status == 503 and body["status"] == "failed"
    assert {"name": "crit", "vhost": "/", "readable_name": "queue 'crit' in vhost '/'"} in body["queues"]
    code, out, err = qqctl(c, 0, "check_if_node_is_quorum_critical")
    assert code == 69 and "crit" in err
    code, out, err = qqctl(c, 1, "await_online_quorum_plus_one", "--timeout", "0.5",
                           "--interval", "0.1")
    assert code == 75 and "timed out" in err and "crit" in err
    assert a0.get("/api/queues/%2F/crit")[1]["online"] == sorted(c.names[:2])
    # the dead node's member can go: {node1, node2} are both online
    assert a0.delete(f"/api/queues/%2F/crit2/members/{c.names[2]}") == (204, None)
    wait_for(lambda: members(a1, "crit2") == sorted(c.names[:2]), what="dead member removed")
    # deleting a live member of crit would leave {other, node3}: one online of two
    leader = a0.get("/api/queues/%2F/crit")[1]["leader"]
    victim = c.names[1] if leader == c.names[0] else c.names[0]
    status, body = a1.delete(f"/api/queues/%2F/crit/members/{victim}")
    assert status == 409 and "without an online quorum" in body["reason"]
    assert members(a0, "crit") == sorted(c.names)
    code, _, err = qqctl(c, 0, "delete_member", "crit", victim)
    assert code == 1 and "use force" in err and "HTTP 409" in err
    code, _, err = qqctl(c, 0, "delete_member", "--force", "crit", victim)
    assert code == 0, err
    wait_for(lambda: members(a0, "crit") == sorted({leader, c.names[2]}), what="forced removal")


"""`qqctl`: the operator's command line over the management HTTP API.

Where it sits: outside the broker process; it speaks only HTTP to one node's
management API (`broker.mgmt`), so it works against any node of a cluster,
local or in Kubernetes (`kubectl port-forward`). Command names follow
`rabbitmq-queues` / `rabbitmqctl`.

Connection settings: `--url` (env QQCTL_URL, default http://localhost:15672),
`--user` (QQCTL_USER, guest), `--password` (QQCTL_PASSWORD, guest).
Output: aligned tables by default, `--json` for scripts. Long operations
(grow, shrink, rebalance, drain) stream progress lines to stderr.

Exit codes: 0 success; 1 the broker refused or an operation failed (the
message says why); 2 bad usage; 69 the broker is unreachable or a health
check failed (EX_UNAVAILABLE); 75 a wait timed out (EX_TEMPFAIL).

Why one file of this size: one small function per `qqctl` command over the
management API, plus the argument table; each command is independent and
short.
"""
from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TextIO

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69
EXIT_TIMEOUT = 75


class CliError(Exception):
    """A failure reported to the user as `qqctl: <message>` with `code`."""

    def __init__(self, message: str, code: int = EXIT_REFUSED, http_status: int | None = None,
                 body: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.http_status = http_status  # the API's answer, when it gave one
        self.body = body


# ---------------------------------------------------------------- HTTP client
class Client:
    def __init__(self, url: str, user: str, password: str, timeout: float = 120.0) -> None:
        self.url = url.rstrip("/")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.auth = f"Basic {token}"
        self.timeout = timeout

    def _open(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", self.auth)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise _http_error(exc.code, exc.read()) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CliError(f"cannot reach the management API at {self.url}: {reason}",
                           EXIT_UNAVAILABLE) from None

    def call(self, method: str, path: str, body: Any = None) -> Any:
        with self._open(method, path, body) as resp:
            raw = resp.read()
        return json.loads(raw) if raw.strip() else None

    def status(self, path: str) -> tuple[int, Any]:
        """GET that returns (status, body) for 2xx and 503 (health checks)."""
        try:
            return 200, self.call("GET", path)
        except CliError as exc:
            if exc.http_status == 503:
                return 503, exc.body
            raise

    def stream(self, path: str, body: Any) -> Iterator[dict[str, Any]]:
        """POST returning NDJSON lines (progress, then result or error)."""
        sep = "&" if "?" in path else "?"
        with self._open("POST", path + sep + "progress=true", body) as resp:
            for line in resp:
                if line.strip():
                    yield json.loads(line)


def _http_error(status: int, raw: bytes) -> CliError:
    try:
        body = json.loads(raw)
        reason = body.get("reason") or body.get("error") or raw.decode()
    except (ValueError, AttributeError):
        body, reason = None, raw.decode(errors="replace") or "no reason given"
    hint = {401: " (check --user/--password)", 403: " (the user lacks the needed tag)"}.get(status, "")
    return CliError(f"{reason}{hint} (HTTP {status})",
                    EXIT_UNAVAILABLE if status in (502, 503, 504) else EXIT_REFUSED, status, body)


def q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


# ---------------------------------------------------------------- output
def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], out: TextIO) -> None:
    def cell(v: Any) -> str:
        if isinstance(v, list):
            return ",".join(str(x) for x in v)
        if v is None:
            return ""
        return str(v)

    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    out.write("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip() + "\n")
    for row in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() + "\n")


class Output:
    def __init__(self, as_json: bool, out: TextIO, err: TextIO) -> None:
        self.as_json = as_json
        self.out = out
        self.err = err

    def rows(self, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
        if self.as_json:
            self.out.write(json.dumps(list(rows), indent=2) + "\n")
        elif rows:
            table(rows, columns, self.out)
        else:
            self.out.write("(none)\n")

    def message(self, text: str, data: Any = None) -> None:
        if self.as_json:
            self.out.write(json.dumps(data if data is not None else {"result": "ok",
                                                                     "message": text}) + "\n")
        else:
            self.out.write(text + "\n")


# ---------------------------------------------------------------- commands
QUEUE_COLUMNS = ("vhost", "name", "type", "leader", "members", "online", "messages_ready",
                 "messages_unacknowledged", "consumers", "policy")


def cmd_list_queues(c: Client, o: Output, a: argparse.Namespace) -> int:
    path = "/api/queues" + (f"/{q(a.vhost)}" if a.vhost else "")
    rows = c.call("GET", path)
    columns = a.columns.split(",") if a.columns else QUEUE_COLUMNS
    o.rows(rows, columns)
    return EXIT_OK


def cmd_quorum_status(c: Client, o: Output, a: argparse.Namespace) -> int:
    rows = c.call("GET", f"/api/queues/{q(a.vhost)}/{q(a.queue)}/quorum-status")
    o.rows(rows, ("node", "raft_state", "voter", "term", "commit_index", "last_applied",
                  "match_index", "online"))
    return EXIT_OK


def cmd_add_member(c: Client, o: Output, a: argparse.Namespace) -> int:
    c.call("POST", f"/api/queues/{q(a.vhost)}/{q(a.queue)}/members", {"node": a.node})
    o.message(f"added a member on {a.node} to queue '{a.queue}' in vhost '{a.vhost}'")
    return EXIT_OK


def cmd_delete_member(c: Client, o: Output, a: argparse.Namespace) -> int:
    suffix = "?force=true" if a.force else ""
    c.call("DELETE", f"/api/queues/{q(a.vhost)}/{q(a.queue)}/members/{q(a.node)}{suffix}")
    o.message(f"deleted the member on {a.node} from queue '{a.queue}' in vhost '{a.vhost}'")
    return EXIT_OK


def _long(c: Client, o: Output, path: str, body: dict[str, Any], what: str) -> int:
    result: list[dict[str, Any]] | None = None
    for line in c.stream(path, body):
        if "progress" in line:
            p = line["progress"]
            extra = f": {p['reason']}" if p.get("reason") else ""
            o.err.write(f"[{p.get('done', '?')}/{p.get('total', '?')}] queue '{p.get('name', '')}'"
                        f" in vhost '{p.get('vhost', '')}': {p.get('result', '')}{extra}\n")
            o.err.flush()
        elif "result" in line:
            result = line["result"]
        elif "error" in line:
            raise CliError(f"{line.get('reason', line['error'])} (HTTP {line.get('status', '?')})")
    if result is None:
        raise CliError(f"{what}: the broker closed the stream without a result", EXIT_UNAVAILABLE)
    o.rows(result, ("vhost", "name", "result", "reason"))
    failed = [r for r in result if r.get("result") not in ("ok", None)]
    if failed:
        o.err.write(f"qqctl: {what}: {len(failed)} queue(s) failed\n")
        return EXIT_REFUSED
    return EXIT_OK


def cmd_grow(c: Client, o: Output, a: argparse.Namespace) -> int:
    return _long(c, o, "/api/quorum-queues/grow",
                 {"node": a.node, "strategy": a.strategy, "vhost_pattern": a.vhost_pattern,
                  "queue_pattern": a.queue_pattern}, "grow")


def cmd_shrink(c: Client, o: Output, a: argparse.Namespace) -> int:
    return _long(c, o, "/api/quorum-queues/shrink",
                 {"node": a.node, "errors_only": a.errors_only}, "shrink")


def cmd_rebalance(c: Client, o: Output, a: argparse.Namespace) -> int:
    return _long(c, o, "/api/quorum-queues/rebalance",
                 {"vhost_pattern": a.vhost_pattern, "queue_pattern": a.queue_pattern}, "rebalance")


def cmd_drain(c: Client, o: Output, a: argparse.Namespace) -> int:
    if a.if_leaving:
        return drain_if_leaving(c, o, a)
    node = a.node or this_node(c)
    return _long(c, o, f"/api/nodes/{q(node)}/drain", {}, "drain")


def this_node(c: Client) -> str:
    """The name of the node whose management API is at --url."""
    return str(c.call("GET", "/api/overview")["node"])


# ---------------------------------------------------------------- preStop: drain --if-leaving
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def desired_replicas(a: argparse.Namespace, environ: dict[str, str], log: Callable[[str], None],
                     statefulset: str) -> int | None:
    """The StatefulSet's desired replicas: --desired-replicas, else
    QQ_DESIRED_REPLICAS, else read from the Kubernetes API with the pod's
    service-account token (the downward API cannot give spec.replicas).
    None when unknown (the caller then treats the pod as restarting)."""
    if a.desired_replicas is not None:
        return int(a.desired_replicas)
    if environ.get("QQ_DESIRED_REPLICAS", "").strip().isdigit():
        return int(environ["QQ_DESIRED_REPLICAS"])
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        log("desired replicas unknown (no --desired-replicas, no Kubernetes API in this environment)")
        return None
    import ssl

    try:
        token = open(f"{SA_DIR}/token").read().strip()
        namespace = a.namespace or environ.get("POD_NAMESPACE") or open(f"{SA_DIR}/namespace").read().strip()
        ctx = ssl.create_default_context(cafile=f"{SA_DIR}/ca.crt")
        host = f"[{host}]" if ":" in host else host
        req = urllib.request.Request(
            f"https://{host}:{port}/apis/apps/v1/namespaces/{q(namespace)}/statefulsets/{q(statefulset)}",
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return int(json.loads(resp.read())["spec"]["replicas"])
    except (OSError, ValueError, KeyError, urllib.error.URLError) as exc:
        log(f"desired replicas unknown: cannot read StatefulSet {statefulset}: {exc}")
        return None


def drain_if_leaving(c: Client, o: Output, a: argparse.Namespace,
                     environ: dict[str, str] | None = None) -> int:
    """A pod's preStop. LEAVING (its ordinal is at or above the StatefulSet's
    desired replicas: a scale-down): move its members and leaderships to the
    remaining nodes, then leave the cluster (metadata group included).
    RESTARTING (any other stop): hand its leaderships away, then wait until
    stopping it leaves every quorum queue with a quorum. Bounded by --wait:
    it logs why it waits and gives up in time, so the pod never hangs in
    Terminating."""
    from broker.common.discovery import DiscoveryError, parse_pod_name

    env = dict(os.environ if environ is None else environ)
    deadline = time.monotonic() + float(a.wait)

    def log(text: str) -> None:
        o.err.write(f"qqctl drain --if-leaving: {text}\n")
        o.err.flush()

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    pod = a.pod or env.get("POD_NAME") or env.get("HOSTNAME") or ""
    try:
        ident = parse_pod_name(pod)
    except DiscoveryError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    me = this_node(c)
    desired = desired_replicas(a, env, log, a.statefulset or ident.statefulset)
    if desired is not None and ident.ordinal >= desired:  # leaving
        log(f"{me} (pod {pod}, ordinal {ident.ordinal}) is LEAVING: the StatefulSet wants "
            f"{desired} replicas")
        return _leave(c, o, a, me, deadline, log, left, desired)
    log(f"{me} (pod {pod}, ordinal {ident.ordinal}) is RESTARTING"
        + (f" (desired replicas {desired})" if desired is not None else ""))
    c.timeout = left()
    try:
        _long(c, o, f"/api/nodes/{q(me)}/hand-off-leaders", {}, "hand-off-leaders")
    except CliError as exc:
        log(f"handing leaderships away: {exc}")
    return _await_not_critical(c, o, me, deadline, log, a.interval)


def _await_not_critical(c: Client, o: Output, me: str, deadline: float,
                        log: Callable[[str], None], interval: float) -> int:
    last: list[Any] = []
    last_log = 0.0
    while True:
        c.timeout = max(1.0, min(10.0, deadline - time.monotonic()))
        try:
            status, body = c.status(_critical_path(me))
        except CliError as exc:
            status, body = 503, {"reason": str(exc)}
        if status == 200:
            log("ok: every quorum queue keeps a quorum without this node")
            return EXIT_OK
        queues = [f"{x.get('vhost')}/{x.get('name')}" for x in _critical_queues(body)]
        if time.monotonic() > deadline:
            log(f"giving up waiting, stopping anyway; still quorum-critical: {', '.join(queues)}")
            return EXIT_TIMEOUT
        if queues != last or time.monotonic() - last_log > 10:
            log(f"waiting: stopping now would leave {len(queues)} quorum queue(s) without a "
                f"quorum ({', '.join(queues[:10]) or body}); "
                f"{deadline - time.monotonic():.0f}s left")
            last, last_log = queues, time.monotonic()
        time.sleep(interval)


def _leave(c: Client, o: Output, a: argparse.Namespace, me: str, deadline: float,
           log: Callable[[str], None], left: Callable[[], float], desired: int) -> int:
    c.timeout = left()
    try:
        # every pod at or above `desired` is leaving too (they stop together
        # under podManagementPolicy: Parallel): none of them receives a member
        try:
            _long(c, o, f"/api/nodes/{q(me)}/drain", {"desired_replicas": desired}, "drain")
        except CliError as exc:
            if exc.http_status != 400:
                raise
            # the option refused (a node without StatefulSet discovery cannot
            # tell ordinals; the drain itself was not started): a plain drain
            log(f"draining without excluding the other leaving pods: {exc}")
            _long(c, o, f"/api/nodes/{q(me)}/drain", {}, "drain")
    except CliError as exc:
        log(f"draining: {exc}")
    parts = urllib.parse.urlsplit(c.url)
    while True:
        c.timeout = max(1.0, min(10.0, deadline - time.monotonic()))
        try:
            nodes = c.call("GET", "/api/nodes")
            leader = next((n["name"] for n in nodes if n.get("metadata_leader")), None)
            if leader == me:
                log("handing the metadata leadership away")
                c.call("POST", f"/api/nodes/{q(me)}/hand-off-leaders", {})
                continue
            if leader is None:
                raise CliError("no metadata leader yet", EXIT_UNAVAILABLE)
            if not any(n["name"] == me for n in nodes):
                log(f"{me} has left the cluster")
                return EXIT_OK
            # Only the metadata leader removes a node: ask it at its own
            # management API (same scheme and port, its host).
            port = f":{parts.port}" if parts.port else ""
            other = Client(f"{parts.scheme}://{leader.rpartition('@')[2]}{port}", "", "", c.timeout)
            other.auth = c.auth
            other.call("DELETE", f"/api/nodes/{q(me)}")
            log(f"{me} has left the cluster (removed by the metadata leader {leader})")
            return EXIT_OK
        except CliError as exc:
            if time.monotonic() > deadline:
                log(f"giving up leaving the cluster, stopping anyway: {exc}")
                return EXIT_TIMEOUT
            log(f"not left yet: {exc}")
        time.sleep(a.interval)


def _policy_path(a: argparse.Namespace) -> str:
    kind = "operator-policies" if a.operator else "policies"
    return f"/api/{kind}/{q(a.vhost)}/{q(a.name)}"


def cmd_set_policy(c: Client, o: Output, a: argparse.Namespace) -> int:
    try:
        definition = json.loads(a.definition)
    except ValueError as exc:
        raise CliError(f"the policy definition is not valid JSON: {exc}", EXIT_USAGE) from None
    if not isinstance(definition, dict):
        raise CliError("the policy definition must be a JSON object", EXIT_USAGE)
    body: dict[str, Any] = {"pattern": a.pattern, "definition": definition, "priority": a.priority}
    if a.apply_to:
        body["apply-to"] = a.apply_to
    c.call("PUT", _policy_path(a), body)
    o.message(f"set {'operator ' if a.operator else ''}policy '{a.name}' in vhost '{a.vhost}'")
    return EXIT_OK


def cmd_clear_policy(c: Client, o: Output, a: argparse.Namespace) -> int:
    c.call("DELETE", _policy_path(a))
    o.message(f"cleared {'operator ' if a.operator else ''}policy '{a.name}' in vhost '{a.vhost}'")
    return EXIT_OK


# ---------------------------------------------------------------- limits
# rabbitmqctl's set_vhost_limits / set_user_limits take a JSON object of limits
# and set each; clear_* take one limit's name or "all".
VHOST_LIMITS = ("max-connections", "max-queues")
USER_LIMITS = ("max-connections", "max-channels")


def _limits_json(text: str) -> dict[str, Any]:
    try:
        limits = json.loads(text)
    except ValueError as exc:
        raise CliError(f"the limits are not valid JSON: {exc}", EXIT_USAGE) from None
    if not isinstance(limits, dict) or not limits:
        raise CliError("the limits must be a JSON object, e.g. '{\"max-connections\": 64}'",
                       EXIT_USAGE)
    return limits


# kind -> (the API's collection, the argument naming the owner, the row field, limit names)
_LIMIT_KINDS = {
    "vhost": ("vhost-limits", "vhost", "vhost", VHOST_LIMITS),
    "user": ("user-limits", "username", "user", USER_LIMITS),
}


def _set_limits(kind: str, c: Client, o: Output, a: argparse.Namespace) -> int:
    path, arg, _field, _names = _LIMIT_KINDS[kind]
    owner = getattr(a, arg)
    limits = _limits_json(a.definition)
    for name, value in limits.items():
        c.call("PUT", f"/api/{path}/{q(owner)}/{q(name)}", {"value": value})
    o.message(f"set limits of {kind} '{owner}': {json.dumps(limits)}")
    return EXIT_OK


def _clear_limits(kind: str, c: Client, o: Output, a: argparse.Namespace) -> int:
    path, arg, _field, names = _LIMIT_KINDS[kind]
    owner = getattr(a, arg)
    for name in names if a.limit == "all" else (a.limit,):
        c.call("DELETE", f"/api/{path}/{q(owner)}/{q(name)}")
    o.message(f"cleared {a.limit} limits of {kind} '{owner}'" if a.limit == "all"
              else f"cleared limit {a.limit} of {kind} '{owner}'")
    return EXIT_OK


def _list_limits(kind: str, c: Client, o: Output, a: argparse.Namespace) -> int:
    path, arg, field, _names = _LIMIT_KINDS[kind]
    owner = getattr(a, arg)
    rows = c.call("GET", f"/api/{path}" + (f"/{q(owner)}" if owner else ""))
    o.rows([{field: r[field], "limits": json.dumps(r["value"], sort_keys=True)} for r in rows],
           (field, "limits"))
    return EXIT_OK


cmd_set_vhost_limits = functools.partial(_set_limits, "vhost")
cmd_clear_vhost_limits = functools.partial(_clear_limits, "vhost")
cmd_list_vhost_limits = functools.partial(_list_limits, "vhost")
cmd_set_user_limits = functools.partial(_set_limits, "user")
cmd_clear_user_limits = functools.partial(_clear_limits, "user")
cmd_list_user_limits = functools.partial(_list_limits, "user")


def _critical_path(node: str | None) -> str:
    path = "/api/health/checks/node-is-quorum-critical"
    return path + (f"?node={q(node)}" if node else "")


def _critical_queues(body: Any) -> list[dict[str, Any]]:
    return list(body.get("queues", [])) if isinstance(body, dict) else []


def cmd_check_quorum_critical(c: Client, o: Output, a: argparse.Namespace) -> int:
    status, body = c.status(_critical_path(a.node))
    if status == 200:
        o.message("ok: no quorum queue would lose its quorum if the node stopped", body)
        return EXIT_OK
    queues = _critical_queues(body)
    if o.as_json:
        o.out.write(json.dumps(body) + "\n")
    else:
        o.err.write("qqctl: these quorum queues would lose their quorum if the node stopped:\n")
        table(queues, ("vhost", "name"), o.err)
    return EXIT_UNAVAILABLE


def cmd_await_quorum_plus_one(c: Client, o: Output, a: argparse.Namespace) -> int:
    deadline = time.monotonic() + float(a.wait)
    last: list[dict[str, Any]] = []
    while True:
        status, body = c.status(_critical_path(a.node))
        if status == 200:
            o.message("ok: every quorum queue has an online quorum plus one", body)
            return EXIT_OK
        queues = _critical_queues(body)
        if queues != last:
            o.err.write(f"waiting for {len(queues)} quorum queue(s) to reach an online quorum + 1\n")
            last = queues
        if time.monotonic() > deadline:
            o.err.write(f"qqctl: timed out after {a.wait:g}s; still critical:\n")
            table(queues, ("vhost", "name"), o.err)
            return EXIT_TIMEOUT
        time.sleep(a.interval)


def cmd_cluster_status(c: Client, o: Output, a: argparse.Namespace) -> int:
    nodes = c.call("GET", "/api/nodes")
    if o.as_json:
        overview = c.call("GET", "/api/overview")
        o.out.write(json.dumps({"cluster_name": overview.get("cluster_name"),
                                "nodes": nodes}, indent=2) + "\n")
        return EXIT_OK
    o.rows(nodes, ("name", "running", "metadata_leader", "quorum_queue_members",
                   "quorum_queue_leaders"))
    down = [n["name"] for n in nodes if not n.get("running")]
    if down:
        o.err.write(f"nodes not running: {', '.join(down)}\n")
    return EXIT_OK


# ---------------------------------------------------------------- argument parsing
Command = Callable[[Client, Output, argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(prog="qqctl", description="Manage a quorumq cluster through its "
                                "management HTTP API.")
    p.add_argument("--url", default=env.get("QQCTL_URL", "http://localhost:15672"),
                   help="management API base URL (env QQCTL_URL)")
    p.add_argument("--user", default=env.get("QQCTL_USER", "guest"), help="env QQCTL_USER")
    p.add_argument("--password", default=env.get("QQCTL_PASSWORD", "guest"),
                   help="env QQCTL_PASSWORD")
    p.add_argument("--json", action="store_true", help="machine-readable JSON output")
    p.add_argument("--timeout", type=float, default=float(env.get("QQCTL_TIMEOUT", "300")),
                   help="HTTP timeout in seconds")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Command, doc: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=doc, description=doc)
        sp.set_defaults(fn=fn)
        return sp

    def vhost(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--vhost", "-p", default="/", help="virtual host (default /)")

    def patterns(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--vhost-pattern", default=".*", help="regex over vhost names")
        sp.add_argument("--queue-pattern", default=".*", help="regex over queue names")

    sp = add("list_queues", cmd_list_queues, "list queues with members, leader and counts")
    sp.add_argument("--vhost", "-p", default=None, help="only this vhost (default: all)")
    sp.add_argument("--columns", default=None,
                    help=f"comma-separated columns (default: {','.join(QUEUE_COLUMNS)})")
    sp = add("quorum_status", cmd_quorum_status, "Raft status of each member of a quorum queue")
    sp.add_argument("queue")
    vhost(sp)
    sp = add("add_member", cmd_add_member, "add a member on NODE to a quorum queue")
    sp.add_argument("queue")
    sp.add_argument("node")
    vhost(sp)
    sp = add("delete_member", cmd_delete_member,
             "remove the member on NODE (refused if it would lose quorum, unless --force)")
    sp.add_argument("queue")
    sp.add_argument("node")
    sp.add_argument("--force", action="store_true")
    vhost(sp)
    sp = add("grow", cmd_grow, "add members on NODE to matching quorum queues")
    sp.add_argument("node")
    sp.add_argument("strategy", choices=("all", "even"))
    patterns(sp)
    sp = add("shrink", cmd_shrink, "remove the members on NODE from every quorum queue")
    sp.add_argument("node")
    sp.add_argument("--errors-only", action="store_true", help="only report failures")
    sp = add("rebalance", cmd_rebalance, "spread quorum-queue leaders evenly over the nodes")
    sp.add_argument("type", nargs="?", default="quorum", choices=("quorum", "all"))
    patterns(sp)
    sp = add("drain", cmd_drain, "move every quorum-queue member and leader off NODE; with "
             "--if-leaving, a Kubernetes preStop (see drain_if_leaving)")
    sp.add_argument("node", nargs="?", default=None, help="default: the node at --url")
    sp.add_argument("--if-leaving", action="store_true",
                    help="preStop: leave the cluster if this pod's ordinal >= the StatefulSet's "
                         "desired replicas, else hand leaderships away and wait for quorum")
    sp.add_argument("--desired-replicas", type=int, default=None,
                    help="the StatefulSet's desired replicas (default: env QQ_DESIRED_REPLICAS, "
                         "then the Kubernetes API with the pod's service account)")
    sp.add_argument("--statefulset", default=None, help="default: from the pod name")
    sp.add_argument("--namespace", default=None, help="default: env POD_NAMESPACE")
    sp.add_argument("--pod", default=None, help="this pod (default: env POD_NAME, HOSTNAME)")
    sp.add_argument("--wait", type=float, default=120.0,
                    help="give up after this many seconds (default 120)")
    sp.add_argument("--interval", type=float, default=0.5)
    sp = add("set_policy", cmd_set_policy, "set a policy (applied live to matching queues)")
    sp.add_argument("name")
    sp.add_argument("pattern")
    sp.add_argument("definition", help="JSON object, e.g. '{\"max-length\": 1000}'")
    sp.add_argument("--priority", type=int, default=0)
    sp.add_argument("--apply-to", default=None,
                    choices=("all", "queues", "exchanges", "classic_queues", "quorum_queues"))
    sp.add_argument("--operator", action="store_true", help="an operator policy")
    vhost(sp)
    sp = add("clear_policy", cmd_clear_policy, "clear a policy")
    sp.add_argument("name")
    sp.add_argument("--operator", action="store_true", help="an operator policy")
    vhost(sp)
    sp = add("set_vhost_limits", cmd_set_vhost_limits,
             "set limits of a vhost: max-connections, max-queues (negative: no limit)")
    sp.add_argument("definition", help="JSON object, e.g. '{\"max-connections\": 64}'")
    vhost(sp)
    sp = add("clear_vhost_limits", cmd_clear_vhost_limits, "clear one limit of a vhost, or all")
    sp.add_argument("limit", nargs="?", default="all", choices=(*VHOST_LIMITS, "all"))
    vhost(sp)
    sp = add("list_vhost_limits", cmd_list_vhost_limits, "vhosts with limits and their limits")
    sp.add_argument("--vhost", "-p", default=None, help="only this vhost")
    sp = add("set_user_limits", cmd_set_user_limits,
             "set limits of a user: max-connections, max-channels (negative: no limit)")
    sp.add_argument("username")
    sp.add_argument("definition", help="JSON object, e.g. '{\"max-channels\": 100}'")
    sp = add("clear_user_limits", cmd_clear_user_limits, "clear one limit of a user, or all")
    sp.add_argument("username")
    sp.add_argument("limit", nargs="?", default="all", choices=(*USER_LIMITS, "all"))
    sp = add("list_user_limits", cmd_list_user_limits, "users with limits and their limits")
    sp.add_argument("--username", default=None, help="only this user")
    sp = add("check_if_node_is_quorum_critical", cmd_check_quorum_critical,
             "fail (69) if stopping the node would leave a quorum queue without quorum")
    sp.add_argument("--node", default=None, help="node to check (default: the one at --url)")
    sp = add("await_online_quorum_plus_one", cmd_await_quorum_plus_one,
             "wait until every quorum queue on the node has an online quorum + 1")
    sp.add_argument("--node", default=None)
    sp.add_argument("--timeout", dest="wait", type=float, default=120.0,
                    help="seconds to wait (default 120)")
    sp.add_argument("--interval", type=float, default=0.5)
    add("cluster_status", cmd_cluster_status, "nodes, which are running, metadata leader")
    return p


def main(argv: Iterable[str] | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:
        return int(exc.code or 0) if exc.code not in (None, 0) else 0
    client = Client(args.url, args.user, args.password, timeout=max(args.timeout, 1.0))
    try:
        code: int = args.fn(client, Output(args.json, out, err), args)
        return code
    except CliError as exc:
        err.write(f"qqctl: {args.command}: {exc}\n")
        return exc.code
    except KeyboardInterrupt:
        err.write("qqctl: interrupted\n")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""Reading and writing for the audit: broker data directories (local paths or
Hadoop-style URIs), management API manifests, Parquet/JSON outputs and the
run history. The arithmetic is in `spark.transforms`.

Where it sits: the driver lists files (cheap: directory listings and the tiny
GROUP files); the header/index parsing of every segment, WAL and snapshot
file runs in parallel on the executors (`spark.formats`); manifests are
fetched by the driver over HTTP (one small JSON document per node).

Bad input never aborts a run: an unreadable or corrupt file becomes a
`problems` row (and is left out of the figures), an unreachable node too.
"""
from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from broker.storage.codec import decode_group_dir

from . import formats as fm
from . import transforms as T


# ---------------------------------------------------------------- listing
def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def _basename(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


class Lister:
    """Directory listing for local paths and (through pyarrow.fs) other URIs."""

    def entries(self, uri: str) -> list[tuple[str, bool]]:
        """(name, is_dir) of a directory's children; [] if it is not a directory."""
        if fm.is_local(uri):
            try:
                with os.scandir(fm.local_path(uri)) as it:
                    return sorted((e.name, e.is_dir()) for e in it)
            except (FileNotFoundError, NotADirectoryError):
                return []
        from pyarrow import fs as pafs

        filesystem, path = pafs.FileSystem.from_uri(fm.arrow_uri(uri))
        try:
            infos = filesystem.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        except OSError:
            return []
        return sorted((i.base_name, i.type == pafs.FileType.Directory) for i in infos)

    def read_small(self, uri: str) -> bytes | None:
        try:
            r = fm.open_reader(uri)
        except (FileNotFoundError, OSError):
            return None
        try:
            return r.pread(r.size, 0)
        finally:
            r.close()


@dataclass
class StorageRoot:
    """One node's storage directory (holding `wal/` and `groups/`)."""

    node: str
    uri: str


def discover(spec: str, lister: Lister | None = None, depth: int = 3) -> list[StorageRoot]:
    """Storage roots under `spec` (`PATH` or `NODE=PATH`): PATH itself if it
    holds `groups/` or `wal/`, else its descendants (a node's data directory
    holds `raft/`; `make run`'s ./data holds one directory per node). A root
    named `raft` takes its parent's name as the node name."""
    lister = lister or Lister()
    name, sep, uri = spec.partition("=")
    if not sep or "/" in name:
        name, uri = "", spec
    found: list[StorageRoot] = []

    def walk(u: str, d: int) -> None:
        kids = lister.entries(u)
        names = {n for n, is_dir in kids if is_dir}
        if "groups" in names or "wal" in names:
            base = _basename(u)
            if base == "raft":
                base = _basename(u.rstrip("/")[: -len("raft")]) or base
            found.append(StorageRoot(base, u.rstrip("/")))
            return
        if d > 0:
            for n, is_dir in kids:
                if is_dir and not n.startswith("."):
                    walk(_join(u, n), d - 1)

    walk(uri, depth)
    if name and len(found) == 1:
        found[0].node = name
    return found


GROUP_CHUNK = 2048  # files per parsing task


@dataclass
class Listing:
    tasks: list[tuple[str, str, str, str, Any]] = field(default_factory=list)
    # (kind, node, group_dir, group_id, uri or [uris]); kinds: group, wal, deleting
    groups: list[dict[str, Any]] = field(default_factory=list)
    problems: list[tuple[str, str, str, str]] = field(default_factory=list)


def list_root(root: StorageRoot, lister: Lister | None = None) -> Listing:
    """Every file the audit reads under one storage root, and its groups."""
    lister = lister or Lister()
    out = Listing()
    for name, is_dir in lister.entries(_join(root.uri, "wal")):
        if not is_dir and fm.seq_of(name, fm.WAL_SUFFIX) is not None:
            out.tasks.append(("wal", root.node, "", "", _join(_join(root.uri, "wal"), name)))
    groups_uri = _join(root.uri, "groups")
    for gdir, is_dir in lister.entries(groups_uri):
        if not is_dir:
            continue
        guri = _join(groups_uri, gdir)
        if gdir.startswith("."):
            out.tasks.append(("deleting", root.node, gdir, "", guri))
            continue
        raw = lister.read_small(_join(guri, "GROUP"))
        gid = raw.decode("utf-8", "replace") if raw is not None else (
            decode_group_dir(gdir) or gdir)
        corrupt = lister.read_small(_join(guri, "CORRUPT"))
        out.groups.append({"node": root.node, "source": "data", "group_dir": gdir,
                           "group_id": gid,
                           "corrupt": corrupt.decode("utf-8", "replace") if corrupt else None})
        if corrupt:
            out.problems.append((root.node, "corrupt_group", guri, corrupt.decode("utf-8", "replace")))
        files = [_join(_join(guri, "segments"), name)
                 for name, _ in lister.entries(_join(guri, "segments"))
                 if fm.seq_of(name, fm.SEGMENT_SUFFIX) is not None]
        files += [_join(_join(guri, "snapshots"), name)
                  for name, _ in lister.entries(_join(guri, "snapshots"))
                  if name.endswith(fm.SNAPSHOT_SUFFIX)]
        # One task per group and chunk of files: a group's segments are
        # composed where they were parsed (no shuffle); big groups are split.
        for k in range(0, len(files), GROUP_CHUNK):
            out.tasks.append(("group", root.node, gdir, gid, files[k:k + GROUP_CHUNK]))
    return out


# ---------------------------------------------------------------- parsing (executors)
def parse_task(task: tuple[str, str, str, str, Any]) -> list[dict[str, Any]]:
    """Parse the files of one task; runs on an executor. Never raises: a
    failure is a `problem` row naming the file."""
    kind, node, gdir, gid, target = task
    if kind == "group":
        rows: list[dict[str, Any]] = []
        segs: list[dict[str, Any]] = []
        for uri in target:
            for r in _parse_file("snapshot" if uri.endswith(fm.SNAPSHOT_SUFFIX) else "segment",
                                 node, gdir, gid, uri):
                (segs if r["kind"] == "segment" else rows).append(r)
        return fm.compose(segs) + rows if segs else rows
    return _parse_file(kind, node, gdir, gid, target)


def _parse_file(kind: str, node: str, gdir: str, gid: str, uri: str) -> list[dict[str, Any]]:
    name = _basename(uri)
    try:
        if kind == "deleting":
            return [{"kind": "deleting", "node": node, "dir": gdir, "bytes": _tree_bytes(uri)}]
        r = fm.open_reader(uri)
        try:
            if kind == "segment":
                h = fm.read_segment(r, name)
                return [{"kind": "segment", "node": node, "source": "data", "group_dir": gdir,
                         "group_id": gid, "file": name, "seq": h.seq,
                         "first_index": h.first_index, "last_index": h.last_index,
                         "entries": h.entries, "max_entries": h.max_entries, "reset": h.reset,
                         "bytes": h.bytes, "data_bytes": h.data_bytes, "live_entries": None,
                         "bytes_read": h.bytes_read}]
            if kind == "wal":
                w = fm.read_wal(r, name)
                rows: list[dict[str, Any]] = [
                    {"kind": "wal", "node": node, "source": "data", "file": name, "seq": w.seq,
                     "bytes": w.bytes, "records": w.records, "torn": w.torn,
                     "bytes_read": w.bytes_read}]
                rows += [{"kind": "wal_group", "node": node, "file": name, "group_id": g,
                          "records": a[0], "bytes": a[1], "entries": a[2],
                          "first_index": a[3] or None, "last_index": a[4] or None}
                         for g, a in w.groups.items()]
                return rows
            snap = fm.read_snapshot_header(r)
            return [{"kind": "snapshot", "node": node, "group_dir": gdir, "group_id": gid,
                     "index": snap[0] if snap else None, "term": snap[1] if snap else None,
                     "bytes": r.size}]
        finally:
            r.close()
    except FileNotFoundError:
        return []  # deleted by the running node since it was listed
    except Exception as exc:  # noqa: BLE001 - reported per file, never aborts
        return [{"kind": "problem", "node": node, "problem": f"unreadable_{kind}", "path": uri,
                 "error": f"{type(exc).__name__}: {exc}"}]


def _tree_bytes(uri: str) -> int:
    total = 0
    for root, _d, files in os.walk(fm.local_path(uri)):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except FileNotFoundError:
                pass
    return total


@dataclass
class DiskFrames:
    segments: DataFrame
    groups: DataFrame
    wal_files: DataFrame
    wal_groups: DataFrame
    deleting: DataFrame
    problems: list[tuple[str, str, str, str]]
    nodes: list[dict[str, Any]]


def read_data_dirs(spark: SparkSession, roots: list[StorageRoot],
                   slices: int | None = None) -> DiskFrames:
    """Parse every file under the roots in parallel (one Spark task per chunk
    of files), compose each group's segments, and return the frames."""
    listings = [list_root(r) for r in roots]
    tasks = [t for li in listings for t in li.tasks]
    sc = spark.sparkContext
    files = sum(len(t[4]) if t[0] == "group" else 1 for t in tasks)
    # A few hundred files per task at least: each task costs a Python worker round trip.
    n = slices or max(1, min(len(tasks), sc.defaultParallelism * 4, files // 200 + 1))
    parsed = sc.parallelize(tasks, n).flatMap(parse_task).cache() if tasks else sc.emptyRDD()
    segs = parsed.filter(lambda r: r["kind"] == "segment")
    cols = [c.split()[0] for c in T.SEGMENTS.split(", ")]
    segments = spark.createDataFrame(segs.map(lambda r: tuple(r.get(c) for c in cols)), T.SEGMENTS)
    small = parsed.filter(lambda r: r["kind"] != "segment").collect()
    problems = [p for li in listings for p in li.problems]
    problems += [(r["node"], r["problem"], r["path"], r["error"]) for r in small
                 if r["kind"] == "problem"]
    snaps: dict[tuple[str, str], tuple[int, int, int]] = {}
    snap_bytes: dict[tuple[str, str], int] = {}
    for r in small:
        if r["kind"] == "snapshot":
            key = (r["node"], r["group_dir"])
            snap_bytes[key] = snap_bytes.get(key, 0) + r["bytes"]
            if r["index"] is not None and (key not in snaps or r["index"] > snaps[key][0]):
                snaps[key] = (r["index"], r["term"], r["bytes"])
    group_rows = []
    for li in listings:
        for g in li.groups:
            key = (g["node"], g["group_dir"])
            s = snaps.get(key)
            group_rows.append((g["node"], "data", g["group_dir"], g["group_id"], None, None,
                               g["corrupt"], s[0] if s else None, s[1] if s else None,
                               snap_bytes.get(key, 0), None, None, None, None))
    wal_cols = [c.split()[0] for c in T.WAL_FILES.split(", ")]
    walg_cols = [c.split()[0] for c in T.WAL_GROUPS.split(", ")]
    wal_rows = [tuple(r.get(c) for c in wal_cols) for r in small if r["kind"] == "wal"]
    for r in small:
        if r["kind"] == "wal" and r["torn"]:
            problems.append((r["node"], "wal_tail", r["file"],
                             "WAL ends in a partial or unknown record (normal for the file "
                             "being written; recovery cuts it)"))
    nodes = []
    for root in roots:
        usage = None
        if fm.is_local(root.uri):
            try:
                st = os.statvfs(fm.local_path(root.uri))
                usage = (st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)
            except OSError:
                usage = None
        nodes.append({"node": root.node, "source": "data", "reachable": True, "error": None,
                      "data_dir": root.uri, "total_bytes": usage[0] if usage else None,
                      "free_bytes": usage[1] if usage else None})
    return DiskFrames(
        segments=segments,
        groups=spark.createDataFrame(group_rows, T.GROUPS),
        wal_files=spark.createDataFrame(wal_rows, T.WAL_FILES),
        wal_groups=spark.createDataFrame(
            [tuple(r.get(c) for c in walg_cols) for r in small if r["kind"] == "wal_group"],
            T.WAL_GROUPS),
        deleting=spark.createDataFrame(
            [(r["node"], r["dir"], r["bytes"]) for r in small if r["kind"] == "deleting"],
            T.DELETING),
        problems=problems, nodes=nodes)


# ---------------------------------------------------------------- management API
@dataclass
class Manifests:
    docs: list[dict[str, Any]]
    unreachable: list[tuple[str, str]]  # (url or node, error)


def _get(url: str, user: str, password: str, timeout: float) -> Any:
    req = urllib.request.Request(url)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def fetch_manifests(urls: list[str], user: str, password: str, all_nodes: bool = False,
                    timeout: float = 30.0) -> Manifests:
    """Each URL's own node manifest (`GET /api/overview` names the node, then
    `GET /api/nodes/{node}/storage`). With `all_nodes`, the nodes listed by
    `/api/nodes` are reached at their host name on the first URL's port."""
    targets = list(dict.fromkeys(u.rstrip("/") for u in urls))
    docs: list[dict[str, Any]] = []
    unreachable: list[tuple[str, str]] = []
    if all_nodes and targets:
        try:
            first = urllib.parse.urlsplit(targets[0])
            for n in _get(targets[0] + "/api/nodes", user, password, timeout):
                host = n["name"].split("@", 1)[-1]
                targets.append(f"{first.scheme}://{host}:{first.port or 15672}")
            targets = list(dict.fromkeys(targets))
        except (OSError, ValueError, KeyError) as exc:
            unreachable.append((targets[0], f"listing nodes: {exc}"))
    seen: set[str] = set()
    for url in targets:
        try:
            node = _get(url + "/api/overview", user, password, timeout)["node"]
            if node in seen:
                continue
            seen.add(node)
            doc = _get(f"{url}/api/nodes/{urllib.parse.quote(node, safe='')}/storage",
                       user, password, timeout)
            doc["url"] = url
            docs.append(doc)
        except (OSError, ValueError, KeyError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            unreachable.append((url, f"{type(exc).__name__}: {reason}"))
    return Manifests(docs, unreachable)


@dataclass
class ApiFrames:
    segments: DataFrame
    groups: DataFrame
    wal_files: DataFrame
    cluster_groups: DataFrame
    deleting: DataFrame
    nodes: list[dict[str, Any]]
    problems: list[tuple[str, str, str, str]]
    known_nodes: set[str]
    metadata_known: bool


def manifest_frames(spark: SparkSession, m: Manifests) -> ApiFrames:
    seg_rows, group_rows, wal_rows, del_rows, nodes, problems = [], [], [], [], [], []
    cluster: dict[str, tuple[Any, ...]] = {}
    known: set[str] = set()
    for doc in m.docs:
        node = doc["node"]
        known.add(node)
        nodes.append({"node": node, "source": "api", "reachable": True, "error": None,
                      "data_dir": doc.get("data_dir"), "total_bytes": doc.get("total_bytes"),
                      "free_bytes": doc.get("free_bytes")})
        for w in doc["wal"]:
            wal_rows.append((node, "api", w["file"], w["seq"], w["bytes"], None, None, 0))
        for d in doc.get("deleting", []):
            del_rows.append((node, d["dir"], d["bytes"]))
        for g in doc["groups"]:
            group_rows.append((node, "api", g["dir"], g["group_id"], g.get("vhost"), g.get("queue"),
                               g.get("corrupt"), g.get("snapshot_index"), g.get("snapshot_term"),
                               g.get("snapshot_bytes", 0), g.get("live_messages"),
                               g.get("smallest_live_index"), g.get("oldest_live_timestamp_ms"),
                               g.get("oldest_live_holder")))
            for s in g["segments"]:
                seg_rows.append((node, "api", g["dir"], g["group_id"], s["file"], s["seq"],
                                 s["first_index"], s["last_index"], s["entries"],
                                 s.get("max_entries"), s.get("reset"), s["bytes"],
                                 s.get("data_bytes"), s.get("log_first"), s.get("log_last"),
                                 s.get("live_entries"), 0))
            for u in g.get("unreadable_segments", []):
                problems.append((node, "unreadable_segment", f"{g['dir']}/{u['file']}", u["error"]))
        for cg in doc.get("cluster_groups", []):
            cluster[cg["group_id"]] = (cg["group_id"], cg["vhost"], cg["queue"], cg["members"],
                                       cg.get("leader"))
            known.update(cg["members"])
    for url, err in m.unreachable:
        problems.append((url, "unreachable_node", url, err))
    return ApiFrames(
        segments=spark.createDataFrame(seg_rows, T.SEGMENTS),
        groups=spark.createDataFrame(group_rows, T.GROUPS),
        wal_files=spark.createDataFrame(wal_rows, T.WAL_FILES),
        cluster_groups=spark.createDataFrame(list(cluster.values()), T.CLUSTER_GROUPS),
        deleting=spark.createDataFrame(del_rows, T.DELETING),
        nodes=nodes, problems=problems, known_nodes=known, metadata_known=bool(m.docs))


def resolve_node_names(roots: list[StorageRoot], known: set[str],
                       data_dirs: dict[str, str] | None = None) -> None:
    """Give a data directory its cluster node name: the node whose manifest
    names this very directory (same machine), else the one known name that
    matches its directory name (`rabbit-1` -> `rabbit-1@host`)."""
    by_dir = {os.path.realpath(d): n for n, d in (data_dirs or {}).items() if d}
    for r in roots:
        if r.node in known:
            continue
        if fm.is_local(r.uri) and os.path.realpath(fm.local_path(r.uri)) in by_dir:
            r.node = by_dir[os.path.realpath(fm.local_path(r.uri))]
            continue
        cands = [k for k in known if k.split("@", 1)[0] == r.node
                 or k.split("@", 1)[-1].split(".", 1)[0] == r.node]
        if len(cands) == 1:
            r.node = cands[0]


# ---------------------------------------------------------------- outputs and history
def read_history(spark: SparkSession, path: str, name: str, schema: str) -> DataFrame:
    target = _join(path, name)
    try:
        return spark.read.schema(schema).parquet(target)
    except Exception:  # noqa: BLE001 - no history yet (first run) or unreadable: start afresh
        return spark.createDataFrame([], schema)


def append_history(df: DataFrame, path: str, name: str) -> None:
    df.write.mode("append").partitionBy("run_date").parquet(_join(path, name))


def write_parquet(frames: dict[str, DataFrame], out: str) -> None:
    for name, df in frames.items():
        df.coalesce(1).write.mode("overwrite").parquet(_join(out, name))


def write_text(out: str, name: str, text: str) -> None:
    """A small text output (JSON, HTML) next to the Parquet frames."""
    if fm.is_local(out):
        os.makedirs(fm.local_path(out), exist_ok=True)
        with open(os.path.join(fm.local_path(out), name), "w", encoding="utf-8") as f:
            f.write(text)
        return
    from pyarrow import fs as pafs

    filesystem, path = pafs.FileSystem.from_uri(fm.arrow_uri(_join(out, name)))
    with filesystem.open_output_stream(path) as f:
        f.write(text.encode("utf-8"))


def rows(df: DataFrame, limit: int | None = None) -> list[dict[str, Any]]:
    d = df.limit(limit) if limit else df
    return [r.asDict(recursive=True) for r in d.collect()]

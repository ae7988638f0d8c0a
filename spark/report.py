"""Human-readable outputs: the console table (worst queues first) and the
self-contained HTML report (matplotlib charts embedded as PNG data URIs; no
external scripts, fonts or CDNs).

Where it sits: after `spark.transforms`, on the driver, over the few
already-aggregated rows `spark.audit` collects.
"""
from __future__ import annotations

import base64
import html
import io as _io
from typing import Any

UNITS = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in UNITS:
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def human_age(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.1f}{unit}"
    return f"{s:.0f}s"


def _days(d: float | None) -> str:
    return "-" if d is None else f"{d:.1f}"


QUEUE_COLUMNS = [
    ("queue", lambda r: f"{r['vhost'] or ''}/{r['queue']}" if r.get("vhost") is not None else r["queue"]),
    ("bytes", lambda r: human_bytes(r["bytes"])),
    ("pinned", lambda r: human_bytes(r["pinned_bytes"])),
    ("reclaimable", lambda r: human_bytes(r["reclaimable_bytes"])),
    ("orphan", lambda r: human_bytes(r["orphan_bytes"])),
    ("wal", lambda r: human_bytes(r["wal_bytes"])),
    ("segs", lambda r: str(r["segments"])),
    ("live", lambda r: "-" if r["live_messages"] is None else str(r["live_messages"])),
    ("oldest live", lambda r: "-" if r["oldest_live_index"] is None else
     f"#{r['oldest_live_index']} {human_age(r['oldest_live_age_s'])}"),
    ("held by", lambda r: (r["oldest_live_holder"] or "-")[:48]),
    ("growth/h", lambda r: "-" if r.get("growth_bytes_per_hour") is None
     else human_bytes(r["growth_bytes_per_hour"])),
    ("days to full", lambda r: _days(r.get("days_to_full"))),
]
NODE_COLUMNS = [
    ("node", lambda r: r["node"]),
    ("reachable", lambda r: "yes" if r["reachable"] else "NO"),
    ("bytes", lambda r: human_bytes(r["bytes"])),
    ("segments", lambda r: human_bytes(r["segment_bytes"])),
    ("wal", lambda r: human_bytes(r["wal_bytes"])),
    ("pinned", lambda r: human_bytes(r["pinned_bytes"])),
    ("reclaimable", lambda r: human_bytes(r["reclaimable_bytes"])),
    ("orphans", lambda r: f"{r['orphan_groups']} ({human_bytes(r['orphan_bytes'])})"),
    ("free", lambda r: human_bytes(r["free_bytes"])),
    ("growth/h", lambda r: "-" if r.get("growth_bytes_per_hour") is None
     else human_bytes(r["growth_bytes_per_hour"])),
    ("days to full", lambda r: _days(r.get("days_to_full"))),
]


def table(rows: list[dict[str, Any]], columns: list[Any]) -> str:
    cells = [[name for name, _ in columns]] + [[fn(r) for _, fn in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def console(summary: dict[str, Any], top: int = 20) -> str:
    out = [f"quorumq storage audit, run {summary['run_ts']}"]
    if summary["empty"]:
        out.append("no broker data found in the inputs: nothing to audit")
    t = summary["totals"]
    out.append(f"{t['nodes']} node(s), {t['queues']} queue(s), {t['segments']} segment files, "
               f"{human_bytes(t['bytes'])} on disk: {human_bytes(t['pinned_bytes'])} pinned, "
               f"{human_bytes(t['reclaimable_bytes'])} reclaimable, "
               f"{human_bytes(t['orphan_bytes'])} in orphans, {human_bytes(t['wal_bytes'])} WAL")
    if summary["nodes"]:
        out += ["", "nodes:", table(summary["nodes"], NODE_COLUMNS)]
    if summary["queues"]:
        out += ["", f"queues (worst first, top {top}):",
                table(summary["queues"][:top], QUEUE_COLUMNS)]
    orphans = [m for m in summary["members"] if m["orphan_reason"]]
    if orphans:
        out += ["", "orphans:"] + [f"  {m['node']}: {m['group_id']} ({m['orphan_reason']}, "
                                   f"{human_bytes(m['orphan_bytes'])})" for m in orphans]
    if summary["problems"]:
        out += ["", "problems:"] + [f"  [{p['kind']}] {p['node']}: {p['path']}: {p['error']}"
                                    for p in summary["problems"]]
    if summary.get("breaches"):
        out += ["", "thresholds breached:"] + [f"  {b}" for b in summary["breaches"]]
    return "\n".join(out)


# ---------------------------------------------------------------- HTML
def _png(fig: Any) -> str:
    buf = _io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def charts(summary: dict[str, Any], history: list[dict[str, Any]], top: int = 15) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    out: dict[str, str] = {}
    qs = sorted(summary["queues"], key=lambda r: r["bytes"], reverse=True)[:top]
    if qs:
        labels = [r["queue"] for r in qs][::-1]
        fig, ax = plt.subplots(figsize=(8, 0.35 * len(qs) + 1))
        ax.barh(labels, [r["bytes"] / (1 << 20) for r in qs][::-1])
        ax.set_xlabel("MiB on disk (all members)")
        ax.set_title("bytes per queue")
        out["bytes_per_queue"] = _png(fig)
        plt.close(fig)
        fig, ax = plt.subplots(figsize=(8, 0.35 * len(qs) + 1))
        parts = [("active", "active_bytes"), ("pinned", "pinned_bytes"),
                 ("reclaimable", "reclaimable_bytes"), ("orphan", "orphan_bytes"),
                 ("unknown", "covered_bytes")]
        left = [0.0] * len(qs)
        for name, col in parts:
            vals = [r[col] / (1 << 20) for r in qs][::-1]
            ax.barh(labels, vals, left=left, label=name)
            left = [a + b for a, b in zip(left, vals, strict=True)]
        ax.set_xlabel("MiB")
        ax.set_title("pinned vs reclaimable")
        ax.legend(loc="lower right")
        out["pinned_vs_reclaimable"] = _png(fig)
        plt.close(fig)
    if history:
        series: dict[str, list[tuple[int, int]]] = {}
        for h in history:
            series.setdefault(h["node"], []).append((h["run_ts_ms"], h["bytes"]))
        fig, ax = plt.subplots(figsize=(8, 3.5))
        import datetime as dt

        for node, pts in sorted(series.items()):
            pts.sort()
            ax.plot([dt.datetime.fromtimestamp(t / 1000, dt.UTC) for t, _ in pts],
                    [b / (1 << 20) for _, b in pts], marker="o", label=node)
        ax.set_ylabel("MiB")
        ax.set_title("growth over time (per node)")
        ax.legend(fontsize="small")
        fig.autofmt_xdate()
        out["growth"] = _png(fig)
        plt.close(fig)
    return out


def _html_table(rows: list[dict[str, Any]], columns: list[Any]) -> str:
    head = "".join(f"<th>{html.escape(n)}</th>" for n, _ in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fn(r))}</td>" for _, fn in columns)
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html_report(summary: dict[str, Any], history: list[dict[str, Any]]) -> str:
    imgs = charts(summary, history)
    t = summary["totals"]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>quorumq storage audit</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left}"
        "th{background:#eee}.bad{color:#b00}</style></head><body>",
        f"<h1>quorumq storage audit</h1><p>run {html.escape(summary['run_ts'])}: "
        f"{t['nodes']} node(s), {t['queues']} queue(s), {t['segments']} segment files, "
        f"{human_bytes(t['bytes'])} on disk; <b>{human_bytes(t['pinned_bytes'])} pinned</b>, "
        f"<b>{human_bytes(t['reclaimable_bytes'])} reclaimable</b>, "
        f"{human_bytes(t['orphan_bytes'])} in orphans, {human_bytes(t['wal_bytes'])} WAL.</p>",
    ]
    if summary["empty"]:
        parts.append("<p>No broker data found in the inputs: nothing to audit.</p>")
    if summary.get("breaches"):
        parts.append("<h2 class='bad'>Thresholds breached</h2><ul>" + "".join(
            f"<li>{html.escape(b)}</li>" for b in summary["breaches"]) + "</ul>")
    parts.append("<h2>Nodes</h2>" + _html_table(summary["nodes"], NODE_COLUMNS))
    parts.append("<h2>Queues (worst first)</h2>" + _html_table(summary["queues"], QUEUE_COLUMNS))
    for key, title in (("bytes_per_queue", "Bytes per queue"),
                       ("pinned_vs_reclaimable", "Pinned vs reclaimable"),
                       ("growth", "Growth over time")):
        if key in imgs:
            parts.append(f"<h2>{title}</h2><img alt='{title}' src='{imgs[key]}'>")
    orphans = [m for m in summary["members"] if m["orphan_reason"]]
    if orphans:
        parts.append("<h2>Orphans</h2><ul>" + "".join(
            f"<li>{html.escape(m['node'])}: {html.escape(m['group_id'])} "
            f"({html.escape(m['orphan_reason'])}, {human_bytes(m['orphan_bytes'])})</li>"
            for m in orphans) + "</ul>")
    if summary["problems"]:
        parts.append("<h2>Problems</h2><ul>" + "".join(
            f"<li>[{html.escape(p['kind'])}] {html.escape(p['node'] or '')}: "
            f"{html.escape(p['path'] or '')}: {html.escape(p['error'] or '')}</li>"
            for p in summary["problems"]) + "</ul>")
    parts.append("<p>What to do about each column: docs/AUDIT.md.</p></body></html>")
    return "".join(parts)

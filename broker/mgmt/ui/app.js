// quorumq management UI: a single page over the management HTTP API of the
// node that serves it (same authentication: HTTP basic, the credentials kept
// in sessionStorage for this tab only). No framework, no CDN.

const $ = (sel, root = document) => root.querySelector(sel);
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const enc = encodeURIComponent;
const fmtBytes = (n) => n == null ? "?" : n < 1024 ? `${n} B` : n < 1 << 20 ? `${(n / 1024).toFixed(1)} KiB` : n < 1 << 30 ? `${(n / (1 << 20)).toFixed(1)} MiB` : `${(n / (1 << 30)).toFixed(2)} GiB`;
const rate = (ms, key) => (ms && ms[`${key}_details`] ? ms[`${key}_details`].rate : 0).toFixed(1);

let refreshTimer = null;
const history = {};  // queue key -> [{t, publish, deliver}] for rate charts
const nodeHistory = {};  // node name -> [{t, mem_used, disk_free}], the last 5 minutes
const NODE_WINDOW_MS = 5 * 60 * 1000;
const COLOURS = ["#0b5cad", "#bf3989", "#116329", "#9a6700", "#8250df", "#cf222e"];

class ApiError extends Error {
  constructor(status, body) {
    super((body && (body.reason || body.error)) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

function creds() { return sessionStorage.getItem("qq-auth"); }

async function api(method, path, body) {
  // X-Requested-With: a 401 then carries no WWW-Authenticate challenge, so the
  // browser shows no login dialog of its own (this page has a form)
  const headers = { Authorization: `Basic ${creds()}`, "X-Requested-With": "XMLHttpRequest" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let resp;
  try {
    resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    banner("The management API is unreachable: " + e.message);
    throw e;
  }
  banner(null);
  const text = await resp.text();
  const data = text ? JSON.parse(text) : null;
  if (resp.status === 401) { logout("Your session is no longer valid: log in again."); throw new ApiError(401, data); }
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}

function banner(msg) {
  const b = $("#banner");
  if (msg) { b.textContent = msg; b.hidden = false; } else { b.hidden = true; b.textContent = ""; }
}

// every page polls /api/nodes on each refresh: each poll is one sample of
// every node's memory used and disk free for the overview's history charts
function rememberNodes(nodes) {
  const now = Date.now();
  for (const n of nodes) {
    const h = nodeHistory[n.name] || (nodeHistory[n.name] = []);
    h.push({ t: now, mem_used: n.running ? n.mem_used ?? null : null, disk_free: n.running ? n.disk_free ?? null : null });
    while (h.length && h[0].t < now - NODE_WINDOW_MS) h.shift();
  }
}

function downBanner(nodes) {
  rememberNodes(nodes);
  const down = nodes.filter((n) => !n.running).map((n) => n.name);
  if (down.length) banner(`Node${down.length > 1 ? "s" : ""} down: ${down.join(", ")}`);
}

function notice(msg) {
  const n = $("#notice");
  n.textContent = msg || ""; n.hidden = !msg;
  if (msg) setTimeout(() => { if (n.textContent === msg) n.hidden = true; }, 6000);
}

// ---------------------------------------------------------------- session
function showLogin(message) {
  $("#login").hidden = false; $("#view").innerHTML = ""; $("#nav").hidden = true; $("#session").hidden = true;
  $("#login-error").textContent = message || "";
  $("#login-user").focus();
}

function logout(message) {
  sessionStorage.removeItem("qq-auth");
  stopRefresh();
  showLogin(message);
}

$("#login-form")?.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const user = $("#login-user").value, pass = $("#login-password").value;
  sessionStorage.setItem("qq-auth", btoa(`${user}:${pass}`));
  try {
    const who = await api("GET", "/api/whoami");
    sessionStorage.setItem("qq-user", who.name);
    $("#login-password").value = "";
    start();
  } catch (e) {
    sessionStorage.removeItem("qq-auth");
    $("#login-error").textContent = e.status === 401 ? "Login failed: wrong username or password." : `Login failed: ${e.message}`;
  }
});

$("#logout").addEventListener("click", () => logout("Logged out."));
$("#refresh").addEventListener("change", () => { if ($("#refresh").checked) scheduleRefresh(); else stopRefresh(); });

function stopRefresh() { if (refreshTimer) clearTimeout(refreshTimer); refreshTimer = null; }
function scheduleRefresh() {
  stopRefresh();
  if ($("#refresh").checked && creds()) refreshTimer = setTimeout(() => route(true), 5000);
}

async function start() {
  $("#login").hidden = true; $("#nav").hidden = false; $("#session").hidden = false;
  $("#whoami").textContent = sessionStorage.getItem("qq-user") || "?";
  if (!location.hash || location.hash === "#/" || location.hash === "#") location.hash = "#/overview";
  else route();
}

// ---------------------------------------------------------------- routing
window.addEventListener("hashchange", () => route());

async function route(refresh = false) {
  if (!creds()) { showLogin(); return; }
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  for (const a of document.querySelectorAll("nav a")) {
    if (a.getAttribute("href") === `#/${parts[0]}`) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  const view = $("#view");
  const pages = { overview, queues, queue, connections, exchanges, policies, admin };
  const page = parts[0] === "queues" && parts.length >= 3 ? "queue" : parts[0] || "overview";
  const fn = pages[page] || overview;
  try {
    refreshing = refresh;
    try { await fn(view, parts.slice(1)); } finally { refreshing = false; }
    if (fn !== overview) downBanner(await api("GET", "/api/nodes"));  // on every page
  } catch (e) {
    if (e.status !== 401) view.innerHTML = `<h2>Error</h2><p class="error">${esc(e.message)}</p>`;
  }
  scheduleRefresh();
}

// keep what the user is typing across refreshes: an auto refresh (route(true))
// takes the fields' values at the moment it redraws the page, after its API
// calls, so nothing typed while they were under way is lost
let refreshing = false;
// a form was just submitted (its id): the page redrawn after the call keeps
// what is typed in every other form, and starts the submitted one afresh
let submitted = null;
function render(view, html) {
  const state = refreshing ? captureForm(view, null) : submitted !== null ? captureForm(view, submitted) : null;
  view.innerHTML = html;
  if (state) restoreForm(view, state);
}

function captureForm(root, skipForm) {
  const out = {};
  for (const el of root.querySelectorAll("input, select, textarea")) {
    if (el.id && !(skipForm && el.form && el.form.id === skipForm)) out[el.id] = el.type === "checkbox" ? el.checked : el.value;
  }
  out.__focus = document.activeElement && document.activeElement.id;
  // and the API's last message under each form, until the next submit
  out.__errors = {};
  for (const f of root.querySelectorAll("form[id]")) { const e = f.querySelector(".error"); if (e && e.textContent && f.id !== skipForm) out.__errors[f.id] = e.textContent; }
  return out;
}
function restoreForm(root, state) {
  for (const [id, text] of Object.entries(state.__errors || {})) {
    const e = root.querySelector(`form#${CSS.escape(id)} .error`);
    if (e) e.textContent = text;
  }
  for (const [id, v] of Object.entries(state)) {
    if (id.startsWith("__")) continue;
    const el = root.querySelector(`#${CSS.escape(id)}`);
    if (el) { if (el.type === "checkbox") el.checked = v; else el.value = v; }
  }
  if (state.__focus) document.getElementById(state.__focus)?.focus();
}

function table(caption, columns, rows, opts = {}) {
  const head = columns.map((c) => `<th scope="col"${c.num ? ' class="num"' : ""}>${c.sort ? `<button type="button" data-sort="${esc(c.key)}">${esc(c.label)}</button>` : esc(c.label)}</th>`).join("");
  const body = rows.length ? rows.map((r) => `<tr>${columns.map((c) => `<td${c.num ? ' class="num"' : ""}>${c.html ? c.html(r) : esc(r[c.key])}</td>`).join("")}</tr>`).join("")
    : `<tr><td colspan="${columns.length}">${esc(opts.empty || "None.")}</td></tr>`;
  return `<div class="table-wrap"><table${opts.id ? ` id="${opts.id}"` : ""}><caption class="visually-hidden">${esc(caption)}</caption><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table></div>`;
}

function onSubmit(root, sel, fn) {
  root.querySelector(sel)?.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const form = ev.target;
    const out = form.querySelector(".error");
    if (out) out.textContent = "";
    submitted = form.id || "";
    try { await fn(new FormData(form), form); } catch (e) {
      // a refresh may have redrawn the form while the call was under way
      const now = (form.id && root.querySelector(`form#${CSS.escape(form.id)} .error`)) || out;
      if (now) now.textContent = e.message; else notice(e.message);
    } finally { submitted = null; }
  });
}

// ---------------------------------------------------------------- overview
function sparkline(points, keys) {
  if (points.length < 2) return `<p>Collecting rates…</p>`;
  const max = Math.max(1, ...points.flatMap((p) => keys.map((k) => p[k])));
  const w = 600, h = 110, step = w / (points.length - 1);
  const lines = keys.map((k, i) => {
    const d = points.map((p, j) => `${(j * step).toFixed(1)},${(h - (p[k] / max) * (h - 10)).toFixed(1)}`).join(" ");
    return `<polyline fill="none" stroke="${["#0b5cad", "#bf3989", "#116329"][i]}" stroke-width="2" points="${d}"/>`;
  }).join("");
  return `<svg class="chart" viewBox="0 0 ${w} ${h}" role="img" aria-label="rates: ${keys.join(", ")} (max ${max.toFixed(1)}/s)">${lines}</svg>
    <p>${keys.map((k, i) => `<span style="color:${["#0b5cad", "#bf3989", "#116329"][i]}">■</span> ${esc(k)} ${points[points.length - 1][k].toFixed(1)}/s`).join(" &nbsp; ")}</p>`;
}

// one line per node of nodeHistory[*][key] over time (x: the samples' times,
// at most the last 5 minutes; y: from the smallest to the largest value shown,
// which the legend states); a node's missing samples (down) leave a gap
function historyChart(id, title, key) {
  const names = Object.keys(nodeHistory).sort();
  const most = Math.max(0, ...names.map((n) => nodeHistory[n].filter((s) => s[key] != null).length));
  if (most < 2) return `<figure class="history"><figcaption>${esc(title)}</figcaption><p id="${id}" data-samples="${most}">Collecting samples…</p></figure>`;
  const all = names.flatMap((n) => nodeHistory[n]);
  const values = all.map((s) => s[key]).filter((v) => v != null);
  const t0 = Math.min(...all.map((s) => s.t)), t1 = Math.max(...all.map((s) => s.t));
  let lo = Math.min(...values), hi = Math.max(...values);
  const pad = Math.max((hi - lo) * 0.1, hi * 0.005, 1);
  lo = Math.max(0, lo - pad); hi += pad;
  const w = 600, h = 110;
  const x = (t) => ((t - t0) / Math.max(1, t1 - t0) * w).toFixed(1);
  const y = (v) => (h - 4 - ((v - lo) / (hi - lo)) * (h - 8)).toFixed(1);
  const shapes = names.map((n, i) => {
    const runs = [[]];
    for (const s of nodeHistory[n]) { if (s[key] == null) runs.push([]); else runs[runs.length - 1].push(s); }
    return runs.filter((r) => r.length).map((r) => r.length === 1
      ? `<circle cx="${x(r[0].t)}" cy="${y(r[0][key])}" r="3" fill="${COLOURS[i % COLOURS.length]}" data-node="${esc(n)}"/>`
      : `<polyline fill="none" stroke="${COLOURS[i % COLOURS.length]}" stroke-width="2" vector-effect="non-scaling-stroke" data-node="${esc(n)}" points="${r.map((s) => `${x(s.t)},${y(s[key])}`).join(" ")}"/>`).join("");
  }).join("");
  const last = (n) => { const s = nodeHistory[n].filter((p) => p[key] != null).pop(); return s ? fmtBytes(s[key]) : "?"; };
  const minutes = Math.max(1, Math.round((t1 - t0) / 60000));
  return `<figure class="history"><figcaption>${esc(title)}</figcaption>
    <svg class="chart" id="${id}" data-samples="${most}" viewBox="0 0 ${w} ${h}" preserveAspectRatio="none" role="img"
      aria-label="${esc(title)} per node over ${(t1 - t0) < 60000 ? "less than a minute" : `about ${minutes} minute(s)`}: ${esc(names.map((n) => `${n} ${last(n)}`).join(", "))}">${shapes}</svg>
    <p class="legend">${names.map((n, i) => `<span><span style="color:${COLOURS[i % COLOURS.length]}" aria-hidden="true">■</span> ${esc(n)} ${last(n)}</span>`).join(" ")}
      <span class="muted">(scale ${fmtBytes(Math.round(lo))} – ${fmtBytes(Math.round(hi))})</span></p></figure>`;
}

function remember(key, ms) {
  const h = history[key] || (history[key] = []);
  h.push({ t: Date.now(), publish: +rate(ms, "publish"), deliver_get: +rate(ms, "deliver_get"), ack: +rate(ms, "ack") });
  while (h.length > 60) h.shift();  // the last 5 minutes at one sample per 5 s
  return h;
}

async function overview(view) {
  const [ov, nodes, alarms] = await Promise.all([api("GET", "/api/overview"), api("GET", "/api/nodes"),
    // in alarm the check answers 503 with the alarms in its body
    api("GET", "/api/health/checks/alarms").catch((e) => e.body && Array.isArray(e.body.alarms) ? e.body : { status: "failed", reason: e.message })]);
  $("#served-by").textContent = ov.node;
  downBanner(nodes);
  const qt = ov.queue_totals, ot = ov.object_totals;
  const points = remember("__overview", ov.message_stats);
  render(view, `<h2>Overview</h2>
    <div class="cards">
      <div class="card"><div>Cluster</div><div class="big">${esc(ov.cluster_name)}</div></div>
      <div class="card"><div>Messages ready</div><div class="big" id="total-ready">${qt.messages_ready}</div></div>
      <div class="card"><div>Unacked</div><div class="big">${qt.messages_unacknowledged}</div></div>
      <div class="card"><div>Queues</div><div class="big">${ot.queues}</div></div>
      <div class="card"><div>Connections</div><div class="big">${ot.connections}</div></div>
      <div class="card"><div>Consumers</div><div class="big">${ot.consumers}</div></div>
    </div>
    <h3>Message rates</h3>${sparkline(points, ["publish", "deliver_get", "ack"])}
    <h3>Alarms</h3><p id="alarms" class="${alarms.status === "ok" ? "ok" : "bad"}">${alarms.status === "ok" ? "No resource alarm in effect." : esc((alarms.alarms || []).map((a) => `${a.resource} alarm on ${a.node}`).join("; ") || alarms.reason)}</p>
    <h3>Nodes</h3>
    ${table("Cluster nodes", [
      { label: "Name", key: "name" },
      { label: "Status", html: (n) => n.running ? '<span class="ok">running</span>' : '<span class="bad">down</span>' },
      { label: "Memory used", html: (n) => `${fmtBytes(n.mem_used)} / ${fmtBytes(n.mem_limit)}${n.mem_alarm ? ' <span class="bad">alarm</span>' : ""}` },
      { label: "Disk free", html: (n) => `${fmtBytes(n.disk_free)} (limit ${fmtBytes(n.disk_free_limit)})${n.disk_free_alarm ? ' <span class="bad">alarm</span>' : ""}` },
      { label: "WAL", html: (n) => fmtBytes(n.wal_bytes), num: true },
      { label: "Segments", html: (n) => n.segment_files == null ? "" : `${fmtBytes(n.segment_bytes)} in ${n.segment_files} files`, num: true },
      { label: "QQ members", key: "quorum_queue_members", num: true },
      { label: "QQ leaders", key: "quorum_queue_leaders", num: true },
      { label: "Metadata leader", html: (n) => n.metadata_leader ? "yes" : "" },
      { label: "", html: (n) => n.running ? `<button type="button" data-grow="${esc(n.name)}" aria-label="Grow every quorum queue onto ${esc(n.name)}">Grow queues onto</button>` : "" },
    ], nodes, { id: "nodes" })}
    <h3>Node memory and disk (last 5 minutes)</h3>
    <div class="histories">${historyChart("mem-history", "Memory used", "mem_used")}${historyChart("disk-history", "Disk free", "disk_free")}</div>`);
  for (const b of view.querySelectorAll("button[data-grow]")) {
    b.addEventListener("click", async () => {
      const node = b.dataset.grow;
      if (!confirm(`Add a member on ${node} to every quorum queue that has none there?`)) return;
      b.disabled = true;
      try {
        const results = await api("POST", "/api/quorum-queues/grow", { node, strategy: "all" });
        const failed = results.filter((r) => r.result !== "ok");
        notice(`Grew ${results.length - failed.length} queue(s) onto ${node}` +
          (failed.length ? `; ${failed.length} failed: ${failed.map((r) => `${r.name}: ${r.reason}`).join("; ")}` : "."));
      } catch (e) { notice(e.message); }
      finally { b.disabled = false; }
    });
  }
}

// ---------------------------------------------------------------- queues
let queueSort = { key: "name", dir: 1 }, queuePage = 0;
const PAGE = 20;

async function queues(view) {
  const list = await api("GET", "/api/queues");
  const filter = ($("#queue-filter")?.value || "").toLowerCase();
  const rows = list.filter((q) => !filter || q.name.toLowerCase().includes(filter) || q.vhost.toLowerCase().includes(filter));
  rows.sort((a, b) => {
    const x = a[queueSort.key], y = b[queueSort.key];
    return (typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y))) * queueSort.dir;
  });
  const pages = Math.max(1, Math.ceil(rows.length / PAGE));
  queuePage = Math.min(queuePage, pages - 1);
  const shown = rows.slice(queuePage * PAGE, (queuePage + 1) * PAGE);
  render(view, `<h2>Queues</h2>
    <form class="inline" id="queue-filter-form" role="search"><label>Filter by name or vhost <input id="queue-filter" value="${esc(filter)}" type="search"></label></form>
    ${table("Queues", [
      { label: "Virtual host", key: "vhost", sort: true },
      { label: "Name", key: "name", sort: true, html: (q) => `<a href="#/queues/${enc(q.vhost)}/${enc(q.name)}">${esc(q.name)}</a>` },
      { label: "Type", key: "type", sort: true },
      { label: "Leader", key: "leader", sort: true },
      { label: "Members online", html: (q) => `${(q.online || []).length}/${(q.members || []).length}` },
      { label: "Ready", key: "messages_ready", num: true, sort: true },
      { label: "Unacked", key: "messages_unacknowledged", num: true, sort: true },
      { label: "Consumers", key: "consumers", num: true, sort: true },
      { label: "Publish /s", html: (q) => rate(q.message_stats, "publish"), num: true },
      { label: "Deliver /s", html: (q) => rate(q.message_stats, "deliver_get"), num: true },
      { label: "Policy", html: (q) => esc([q.policy, q.operator_policy].filter(Boolean).join(", ")) },
    ], shown, { id: "queues", empty: "No queues." })}
    <nav aria-label="Pages" class="inline"><button type="button" id="prev" ${queuePage === 0 ? "disabled" : ""}>Previous</button>
      <span>Page ${queuePage + 1} of ${pages} (${rows.length} queues)</span>
      <button type="button" id="next" ${queuePage >= pages - 1 ? "disabled" : ""}>Next</button></nav>
    <h3>Add a queue</h3>
    <form class="inline" id="add-queue"><label>Virtual host <input id="new-queue-vhost" name="vhost" value="/" required></label>
      <label>Name <input id="new-queue-name" name="name" required></label>
      <label>Type <select id="new-queue-type" name="type"><option>quorum</option><option>classic</option></select></label>
      <button type="submit">Add queue</button><span class="error" role="alert"></span></form>`);
  $("#queue-filter").addEventListener("input", () => { queuePage = 0; queues(view).then(() => { const f = $("#queue-filter"); f.focus(); f.setSelectionRange(f.value.length, f.value.length); }); });
  $("#queue-filter-form").addEventListener("submit", (e) => e.preventDefault());
  for (const b of view.querySelectorAll("th button[data-sort]")) {
    b.addEventListener("click", () => { const k = b.dataset.sort; queueSort = { key: k, dir: queueSort.key === k ? -queueSort.dir : 1 }; queues(view); });
  }
  $("#prev").addEventListener("click", () => { queuePage--; queues(view); });
  $("#next").addEventListener("click", () => { queuePage++; queues(view); });
  onSubmit(view, "#add-queue", async (fd) => {
    await api("PUT", `/api/queues/${enc(fd.get("vhost"))}/${enc(fd.get("name"))}`, { durable: true, arguments: { "x-queue-type": fd.get("type") } });
    notice(`Queue '${fd.get("name")}' declared.`);
    await queues(view);
  });
}

async function queue(view, [vhost, name]) {
  const path = `/api/queues/${enc(vhost)}/${enc(name)}`;
  const q = await api("GET", path);
  const [status, consumers, nodes, storage] = await Promise.all([
    q.type === "quorum" ? api("GET", `${path}/quorum-status`).catch(() => []) : Promise.resolve([]),
    api("GET", `/api/consumers/${enc(vhost)}`), api("GET", "/api/nodes"),
    q.type === "quorum" ? api("GET", `${path}/storage`).catch(() => []) : Promise.resolve([])]);
  const mine = consumers.filter((c) => c.queue.name === name);
  const points = remember(`${vhost}/${name}`, q.message_stats);
  const nonMembers = nodes.map((n) => n.name).filter((n) => !(q.members || []).includes(n));
  const leaderCommit = Math.max(0, ...status.map((m) => m.commit_index || 0));
  render(view, `<h2>Queue <span id="queue-name">${esc(name)}</span> <small>in ${esc(vhost)}</small></h2>
    <div class="cards">
      <div class="card"><div>Type</div><div class="big">${esc(q.type)}</div></div>
      <div class="card"><div>Leader</div><div class="big" id="queue-leader">${esc(q.leader)}</div></div>
      <div class="card"><div>Ready</div><div class="big" id="queue-ready">${q.messages_ready}</div></div>
      <div class="card"><div>Unacked</div><div class="big">${q.messages_unacknowledged}</div></div>
      <div class="card"><div>Consumers</div><div class="big">${q.consumers}</div></div>
      <div class="card"><div>Effective policy</div><div class="big" id="queue-policy">${esc(q.policy || "none")}</div></div>
    </div>
    <h3>Message rates</h3>${sparkline(points, ["publish", "deliver_get", "ack"])}
    ${q.type === "quorum" ? `<h3>Members</h3>${table("Members", [
      { label: "Node", key: "node" },
      { label: "Role", key: "raft_state" },
      { label: "Term", key: "term", num: true },
      { label: "Commit index", key: "commit_index", num: true },
      { label: "Applied", html: (m) => esc(m.last_applied ?? ""), num: true },
      { label: "Match", html: (m) => esc(m.match_index ?? ""), num: true },
      { label: "Lag", html: (m) => m.match_index == null ? "" : String(Math.max(0, leaderCommit - m.match_index)), num: true },
      { label: "Online", html: (m) => m.online ? '<span class="ok">yes</span>' : '<span class="bad">no</span>' },
      { label: "", html: (m) => m.raft_state === "leader" ? "" : `<button type="button" data-leader="${esc(m.node)}">Make leader</button>
        <button type="button" class="danger" data-remove="${esc(m.node)}">Remove member</button>` },
    ], status, { id: "members" })}
    <form class="inline" id="add-member"><label>Node <select id="add-member-node" name="node">${nonMembers.map((n) => `<option>${esc(n)}</option>`).join("")}</select></label>
      <button type="submit" ${nonMembers.length ? "" : "disabled"}>Add member</button><span class="error" role="alert"></span></form>
    <h3>Storage</h3>${table("Storage", [
      { label: "Node", key: "node" },
      { label: "Segment files", key: "segment_files", num: true },
      { label: "Segment bytes", html: (m) => fmtBytes(m.segment_bytes), num: true },
      { label: "Snapshot bytes", html: (m) => fmtBytes(m.snapshot_bytes), num: true },
    ], storage, { id: "storage", empty: "No member answered." })}` : ""}
    <h3>Consumers</h3>${table("Consumers", [
      { label: "Tag", key: "consumer_tag" }, { label: "Channel", html: (c) => esc(c.channel_details.name) },
      { label: "Ack required", html: (c) => c.ack_required ? "yes" : "no" }, { label: "Prefetch", key: "prefetch_count", num: true },
    ], mine, { empty: "No consumers." })}
    <h3>Arguments</h3><pre>${esc(JSON.stringify(q.arguments, null, 1))}</pre>
    <h3>Publish a message</h3>
    <form class="inline" id="publish"><label>Payload <textarea id="publish-payload" name="payload" rows="2" cols="40"></textarea></label>
      <label>Delivery mode <select id="publish-mode" name="mode"><option value="2">persistent</option><option value="1">transient</option></select></label>
      <button type="submit">Publish message</button><span class="error" role="alert"></span></form>
    <h3>Get messages</h3>
    <form class="inline" id="get"><label>Count <input id="get-count" name="count" type="number" min="1" value="1"></label>
      <label>Ack mode <select id="get-ackmode" name="ackmode"><option value="ack_requeue_true">Nack, requeue</option><option value="ack_requeue_false">Ack (remove)</option><option value="reject_requeue_false">Reject, no requeue</option></select></label>
      <button type="submit">Get messages</button><span class="error" role="alert"></span></form>
    <div id="got" aria-live="polite"></div>
    <h3>Actions</h3>
    <p><button type="button" id="purge" class="danger">Purge messages</button>
       <button type="button" id="delete" class="danger">Delete queue</button></p>`);
  onSubmit(view, "#publish", async (fd) => {
    const r = await api("POST", `/api/exchanges/${enc(vhost)}/amq.default/publish`, {
      properties: { delivery_mode: +fd.get("mode") }, routing_key: name, payload: fd.get("payload"), payload_encoding: "string" });
    notice(r.routed ? "Message published." : "Message published but not routed.");
    $("#publish-payload").value = "";
  });
  onSubmit(view, "#get", async (fd) => {
    const got = await api("POST", `${path}/get`, { count: +fd.get("count"), ackmode: fd.get("ackmode"), encoding: "auto" });
    $("#got").innerHTML = got.length ? table("Messages", [
      { label: "Payload", key: "payload" }, { label: "Redelivered", html: (m) => m.redelivered ? "yes" : "no" },
      { label: "Bytes", key: "payload_bytes", num: true }, { label: "Remaining", key: "message_count", num: true },
    ], got, { id: "got-table" }) : "<p>Queue is empty.</p>";
  });
  onSubmit(view, "#add-member", async (fd) => {
    await api("POST", `${path}/members`, { node: fd.get("node") });
    notice(`Member ${fd.get("node")} added.`);
    await queue(view, [vhost, name]);
  });
  for (const b of view.querySelectorAll("button[data-leader]")) {
    b.addEventListener("click", async () => {
      try { await api("POST", `${path}/leader`, { node: b.dataset.leader }); notice(`Leadership moved to ${b.dataset.leader}.`); await queue(view, [vhost, name]); }
      catch (e) { notice(e.message); }
    });
  }
  for (const b of view.querySelectorAll("button[data-remove]")) {
    b.addEventListener("click", async () => {
      if (!confirm(`Remove member ${b.dataset.remove} from queue '${name}'?`)) return;
      try { await api("DELETE", `${path}/members/${enc(b.dataset.remove)}`); notice("Member removed."); await queue(view, [vhost, name]); }
      catch (e) { notice(e.message); }
    });
  }
  $("#purge").addEventListener("click", async () => {
    if (!confirm(`Purge all ready messages of queue '${name}'?`)) return;
    try { await api("DELETE", `${path}/contents`); notice("Queue purged."); await queue(view, [vhost, name]); } catch (e) { notice(e.message); }
  });
  $("#delete").addEventListener("click", async () => {
    if (!confirm(`Delete queue '${name}' and every message in it?`)) return;
    try { await api("DELETE", path); notice(`Queue '${name}' deleted.`); location.hash = "#/queues"; } catch (e) { notice(e.message); }
  });
}

// ---------------------------------------------------------------- connections, exchanges
async function connections(view) {
  const [conns, chans] = await Promise.all([api("GET", "/api/connections"), api("GET", "/api/channels")]);
  render(view, `<h2>Connections</h2>${table("Connections", [
    { label: "Name", key: "name" }, { label: "Client", html: (c) => esc((c.client_properties || {}).connection_name || (c.client_properties || {}).product || "") },
    { label: "Node", key: "node" }, { label: "User", key: "user" }, { label: "Virtual host", key: "vhost" },
    { label: "State", key: "state" }, { label: "TLS", html: (c) => c.ssl ? "yes" : "no" }, { label: "Channels", key: "channels", num: true },
    { label: "", html: (c) => `<button type="button" class="danger" data-close="${esc(c.name)}">Close connection</button>` },
  ], conns, { id: "connections", empty: "No connections." })}
  <h2>Channels</h2>${table("Channels", [
    { label: "Name", key: "name" }, { label: "Node", key: "node" }, { label: "Consumers", key: "consumer_count", num: true },
    { label: "Unacked", key: "messages_unacknowledged", num: true }, { label: "Prefetch", key: "prefetch_count", num: true },
    { label: "Confirm", html: (c) => c.confirm ? "yes" : "no" },
  ], chans, { empty: "No channels." })}`);
  for (const b of view.querySelectorAll("button[data-close]")) {
    b.addEventListener("click", async () => {
      if (!confirm(`Close connection ${b.dataset.close}?`)) return;
      try { await api("DELETE", `/api/connections/${enc(b.dataset.close)}`); notice("Connection closed."); await connections(view); } catch (e) { notice(e.message); }
    });
  }
}

async function exchanges(view) {
  const [xs, bindings] = await Promise.all([api("GET", "/api/exchanges"), api("GET", "/api/bindings")]);
  render(view, `<h2>Exchanges</h2>${table("Exchanges", [
    { label: "Virtual host", key: "vhost" }, { label: "Name", html: (x) => esc(x.name || "(AMQP default)") }, { label: "Type", key: "type" },
    { label: "Durable", html: (x) => x.durable ? "yes" : "no" }, { label: "Internal", html: (x) => x.internal ? "yes" : "no" },
  ], xs)}<h2>Bindings</h2>${table("Bindings", [
    { label: "Virtual host", key: "vhost" }, { label: "Source", html: (b) => esc(b.source || "(AMQP default)") },
    { label: "Destination", key: "destination" }, { label: "Type", key: "destination_type" }, { label: "Routing key", key: "routing_key" },
  ], bindings)}`);
}

// ---------------------------------------------------------------- policies
async function policies(view) {
  const [pols, opols] = await Promise.all([api("GET", "/api/policies"), api("GET", "/api/operator-policies")]);
  const cols = (kind) => [
    { label: "Virtual host", key: "vhost" }, { label: "Name", key: "name" }, { label: "Pattern", key: "pattern" },
    { label: "Apply to", key: "apply-to" }, { label: "Priority", key: "priority", num: true },
    { label: "Definition", html: (p) => `<code>${esc(JSON.stringify(p.definition))}</code>` },
    { label: "", html: (p) => `<button type="button" data-edit="${kind}" data-vhost="${esc(p.vhost)}" data-name="${esc(p.name)}">Edit</button>
      <button type="button" class="danger" data-delete="${kind}" data-vhost="${esc(p.vhost)}" data-name="${esc(p.name)}">Delete policy</button>` },
  ];
  render(view, `<h2>Policies</h2>${table("Policies", cols("policies"), pols, { id: "policies", empty: "No policies." })}
    <h2>Operator policies</h2>${table("Operator policies", cols("operator-policies"), opols, { id: "operator-policies", empty: "No operator policies." })}
    <h3>Add or update a policy</h3>
    <form class="inline" id="policy-form">
      <label>Kind <select id="policy-kind" name="kind"><option value="policies">policy</option><option value="operator-policies">operator policy</option></select></label>
      <label>Virtual host <input id="policy-vhost" name="vhost" value="/" required></label>
      <label>Name <input id="policy-name" name="name" required></label>
      <label>Pattern <input id="policy-pattern" name="pattern" required></label>
      <label>Apply to <select id="policy-apply-to" name="apply-to"><option>queues</option><option>quorum_queues</option><option>classic_queues</option><option>exchanges</option><option>all</option></select></label>
      <label>Priority <input id="policy-priority" name="priority" type="number" value="0"></label>
      <label>Definition (JSON) <textarea id="policy-definition" name="definition" rows="2" cols="40" required>{"max-length": 1000}</textarea></label>
      <button type="submit">Save policy</button><span class="error" role="alert"></span></form>`);
  onSubmit(view, "#policy-form", async (fd) => {
    let definition;
    try { definition = JSON.parse(fd.get("definition")); } catch { throw new Error("The definition is not valid JSON."); }
    await api("PUT", `/api/${fd.get("kind")}/${enc(fd.get("vhost"))}/${enc(fd.get("name"))}`, {
      pattern: fd.get("pattern"), "apply-to": fd.get("apply-to"), priority: +fd.get("priority"), definition });
    notice(`Policy '${fd.get("name")}' saved.`);
    await policies(view);
  });
  for (const b of view.querySelectorAll("button[data-delete]")) {
    b.addEventListener("click", async () => {
      if (!confirm(`Delete policy '${b.dataset.name}'?`)) return;
      try { await api("DELETE", `/api/${b.dataset.delete}/${enc(b.dataset.vhost)}/${enc(b.dataset.name)}`); notice("Policy deleted."); await policies(view); }
      catch (e) { notice(e.message); }
    });
  }
  for (const b of view.querySelectorAll("button[data-edit]")) {
    b.addEventListener("click", () => {
      const p = (b.dataset.edit === "policies" ? pols : opols).find((x) => x.vhost === b.dataset.vhost && x.name === b.dataset.name);
      $("#policy-kind").value = b.dataset.edit; $("#policy-vhost").value = p.vhost; $("#policy-name").value = p.name;
      $("#policy-pattern").value = p.pattern; $("#policy-apply-to").value = p["apply-to"]; $("#policy-priority").value = p.priority;
      $("#policy-definition").value = JSON.stringify(p.definition); $("#policy-pattern").focus();
    });
  }
}

// ---------------------------------------------------------------- admin
// users, virtual hosts and permissions (administrator only): each form sends
// what the RabbitMQ-compatible API takes and shows its error message as is
async function admin(view) {
  const [users, vhosts, perms] = await Promise.all([api("GET", "/api/users"), api("GET", "/api/vhosts"), api("GET", "/api/permissions")]);
  const tagsOf = (u) => [].concat(u.tags || []).join(", ");
  render(view, `<h2>Users</h2>${table("Users", [
    { label: "Name", key: "name" }, { label: "Tags", html: (u) => esc(tagsOf(u)) },
    { label: "Password login", html: (u) => u.password_hash ? "yes" : "disabled" },
    { label: "", html: (u) => `<button type="button" data-edit-user="${esc(u.name)}" aria-label="Edit user ${esc(u.name)}">Edit</button>
      <button type="button" class="danger" data-delete-user="${esc(u.name)}">Delete user</button>` },
  ], users, { id: "users" })}
    <h3>Add or update a user</h3>
    <form class="inline" id="user-form">
      <label>User name <input id="user-name" name="name" autocomplete="off" required></label>
      <label>New password <input id="user-password" name="password" type="password" autocomplete="new-password" aria-describedby="user-password-hint"></label>
      <label>Tags (comma-separated) <input id="user-tags" name="tags" list="known-tags" autocomplete="off"></label>
      <datalist id="known-tags"><option value="administrator"><option value="monitoring"><option value="policymaker"><option value="management"></datalist>
      <button type="submit">Save user</button><span class="error" role="alert"></span>
      <small id="user-password-hint" class="hint">Leave the password empty to keep an existing user's (a new user without one cannot log in with a password).</small></form>
    <h2>Virtual hosts</h2>${table("Virtual hosts", [
    { label: "Name", key: "name" }, { label: "Description", key: "description" },
    { label: "Default queue type", html: (v) => esc(v.default_queue_type || "") },
    { label: "", html: (v) => `<button type="button" class="danger" data-delete-vhost="${esc(v.name)}">Delete virtual host</button>` },
  ], vhosts, { id: "vhosts" })}
    <h3>Add a virtual host</h3>
    <form class="inline" id="vhost-form">
      <label>Virtual host name <input id="vhost-name" name="name" autocomplete="off" required></label>
      <label>Description <input id="vhost-description" name="description" autocomplete="off"></label>
      <label>Default queue type <select id="vhost-dqt" name="default_queue_type"><option value="">(server default)</option><option>quorum</option><option>classic</option></select></label>
      <button type="submit">Add virtual host</button><span class="error" role="alert"></span></form>
    <h2>Permissions</h2>${table("Permissions", [
    { label: "User", key: "user" }, { label: "Virtual host", key: "vhost" }, { label: "Configure", key: "configure" },
    { label: "Write", key: "write" }, { label: "Read", key: "read" },
    { label: "", html: (p) => `<button type="button" data-edit-perm data-user="${esc(p.user)}" data-vhost="${esc(p.vhost)}" aria-label="Edit permissions of ${esc(p.user)} on ${esc(p.vhost)}">Edit</button>
      <button type="button" class="danger" data-clear-perm data-user="${esc(p.user)}" data-vhost="${esc(p.vhost)}">Clear permissions</button>` },
  ], perms, { id: "permissions", empty: "No permissions." })}
    <h3>Set permissions</h3>
    <form class="inline" id="permission-form">
      <label>User <input id="perm-user" name="user" list="user-names" autocomplete="off" required></label>
      <datalist id="user-names">${users.map((u) => `<option value="${esc(u.name)}">`).join("")}</datalist>
      <label>Virtual host <input id="perm-vhost" name="vhost" list="vhost-names" autocomplete="off" required></label>
      <datalist id="vhost-names">${vhosts.map((v) => `<option value="${esc(v.name)}">`).join("")}</datalist>
      <label>Configure regex <input id="perm-configure" name="configure" value=".*" autocomplete="off"></label>
      <label>Write regex <input id="perm-write" name="write" value=".*" autocomplete="off"></label>
      <label>Read regex <input id="perm-read" name="read" value=".*" autocomplete="off"></label>
      <button type="submit">Set permissions</button><span class="error" role="alert"></span></form>`);
  onSubmit(view, "#user-form", async (fd) => {
    const name = fd.get("name"), body = { tags: fd.get("tags") };
    if (fd.get("password")) body.password = fd.get("password");
    await api("PUT", `/api/users/${enc(name)}`, body);
    await admin(view);  // redrawn first: when the notice shows, the page is the new one
    notice(`User '${name}' saved.`);
  });
  onSubmit(view, "#vhost-form", async (fd) => {
    const name = fd.get("name"), body = { description: fd.get("description") };
    if (fd.get("default_queue_type")) body.default_queue_type = fd.get("default_queue_type");
    await api("PUT", `/api/vhosts/${enc(name)}`, body);
    await admin(view);
    notice(`Virtual host '${name}' saved.`);
  });
  onSubmit(view, "#permission-form", async (fd) => {
    await api("PUT", `/api/permissions/${enc(fd.get("vhost"))}/${enc(fd.get("user"))}`, {
      configure: fd.get("configure"), write: fd.get("write"), read: fd.get("read") });
    await admin(view);
    notice(`Permissions of '${fd.get("user")}' on '${fd.get("vhost")}' set.`);
  });
  const act = (sel, fn) => { for (const b of view.querySelectorAll(sel)) b.addEventListener("click", () => fn(b)); };
  const danger = async (question, call, done) => {
    if (!confirm(question)) return;
    try { await call(); await admin(view); notice(done); } catch (e) { notice(e.message); }
  };
  act("button[data-edit-user]", (b) => {
    const u = users.find((x) => x.name === b.dataset.editUser);
    $("#user-name").value = u.name; $("#user-tags").value = tagsOf(u); $("#user-password").value = "";
    $("#user-tags").focus();
  });
  act("button[data-delete-user]", (b) => danger(`Delete user '${b.dataset.deleteUser}' and its permissions?`,
    () => api("DELETE", `/api/users/${enc(b.dataset.deleteUser)}`), `User '${b.dataset.deleteUser}' deleted.`));
  act("button[data-delete-vhost]", (b) => danger(`Delete virtual host '${b.dataset.deleteVhost}' and everything in it (queues, exchanges, messages)?`,
    () => api("DELETE", `/api/vhosts/${enc(b.dataset.deleteVhost)}`), `Virtual host '${b.dataset.deleteVhost}' deleted.`));
  act("button[data-edit-perm]", (b) => {
    const p = perms.find((x) => x.user === b.dataset.user && x.vhost === b.dataset.vhost);
    $("#perm-user").value = p.user; $("#perm-vhost").value = p.vhost;
    $("#perm-configure").value = p.configure; $("#perm-write").value = p.write; $("#perm-read").value = p.read;
    $("#perm-configure").focus();
  });
  act("button[data-clear-perm]", (b) => danger(`Clear the permissions of '${b.dataset.user}' on '${b.dataset.vhost}'?`,
    () => api("DELETE", `/api/permissions/${enc(b.dataset.vhost)}/${enc(b.dataset.user)}`),
    `Permissions of '${b.dataset.user}' on '${b.dataset.vhost}' cleared.`));
}

// ---------------------------------------------------------------- start
if (creds()) start(); else showLogin();

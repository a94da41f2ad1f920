// The status page's script: fetches /status.json every couple of seconds and redraws.
// Everything a client chose (lock keys above all) is put on the page as text, never as
// markup: elements are made with createElement and filled with textContent only.
"use strict";

const REFRESH_MS = 2000;
const FETCH_TIMEOUT_MS = 5000;
// When the last view arrived (performance.now()), and its quarantine countdowns.
let receivedAt = 0;
let countdowns = [];

function el(tag, text, className) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (className) e.className = className;
  return e;
}

function cell(row, text, className) {
  const td = el("td", text, className);
  row.appendChild(td);
  return td;
}

function badge(state) {
  return el("span", state, "badge state state-" + state);
}

function duration(ms) {
  if (ms === null || ms === undefined) return "";
  const s = Math.max(0, Math.ceil(ms / 1000));
  if (s < 60) return s + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + " min " + String(s % 60).padStart(2, "0") + " s";
  const h = Math.floor(m / 60);
  if (h < 48) return h + " h " + String(m % 60).padStart(2, "0") + " min";
  return Math.floor(h / 24) + " d " + (h % 24) + " h";
}

function latency(us) {
  if (us === null || us === undefined) return "";
  return us >= 1000 ? (us / 1000).toFixed(1) + " ms" : us + " µs";
}

function replaceRows(table, rows, emptyText, columns) {
  const body = table.tBodies[0];
  body.replaceChildren(...rows);
  if (rows.length === 0) {
    const tr = el("tr");
    const td = cell(tr, emptyText, "empty");
    td.colSpan = columns;
    body.appendChild(tr);
  }
}

// A quarantine countdown: the cell counts down between views.
function countdown(td, remainingMs) {
  td.classList.add("countdown");
  countdowns.push({ td, remainingMs });
}

function tick() {
  const since = performance.now() - receivedAt;
  for (const c of countdowns) c.td.textContent = duration(Math.max(0, c.remainingMs - since));
}

function drawProxy(p) {
  const up = p.up >= p.quorum;
  const summary = document.getElementById("summary");
  summary.textContent = p.up + " of " + p.members + " masters up, quorum " + p.quorum +
    (up ? "" : ": NO QUORUM, locks answer NOQUORUM");
  summary.className = "badge " + (up ? "state-up" : "state-down");
  const facts = [
    ["version", p.version], ["listen", p.listen], ["up for", duration(p.uptime_ms)],
    ["clients", p.clients + " / " + p.max_clients], ["session locks", p.session_locks + " / " + p.max_session_locks],
    ["acquired", p.acquired], ["contended", p.contended], ["NOQUORUM", p.noquorum], ["run_id", p.run_id],
  ];
  const dl = document.getElementById("proxy");
  dl.replaceChildren(...facts.map(([name, value]) => {
    const d = el("div");
    d.appendChild(el("dt", name));
    d.appendChild(el("dd", value, name === "run_id" ? "mono" : ""));
    return d;
  }));
}

function drawMasters(masters) {
  const rows = [];
  for (const m of masters) {
    const tr = el("tr", null, "master");
    tr.dataset.index = m.index;
    tr.dataset.state = m.state;
    cell(tr, m.index, "num");
    const name = cell(tr, m.name, "mono name");
    if (m.master !== null) name.appendChild(el("div", "master now: " + m.master, "muted"));
    if (m.duplicate_of !== null) name.appendChild(el("div", "same server as #" + m.duplicate_of, "muted"));
    cell(tr, m.kind);
    cell(tr, "", "state-cell").appendChild(badge(m.state));
    cell(tr, m.why || "", "why");
    const left = cell(tr, duration(m.quarantine_remaining_ms), "num quarantine");
    if (m.quarantine_remaining_ms !== null) countdown(left, m.quarantine_remaining_ms);
    cell(tr, latency(m.last_latency_us), "num");
    cell(tr, m.timeouts ?? "", "num");
    cell(tr, m.errors ?? "", "num");
    cell(tr, m.run_id || "", "mono muted runid");
    rows.push(tr);
    for (const s of m.shards || []) {
      const sr = el("tr", null, "shard");
      sr.dataset.state = s.state;
      cell(sr, "");
      const n = cell(sr, "shard " + s.master, "mono");
      n.appendChild(el("div", s.slot_count + " slots: " + s.slots, "muted"));
      cell(sr, "");
      cell(sr, "", "state-cell").appendChild(badge(s.state));
      cell(sr, s.why || "", "why");
      const sl = cell(sr, duration(s.quarantine_remaining_ms), "num quarantine");
      if (s.quarantine_remaining_ms !== null) countdown(sl, s.quarantine_remaining_ms);
      cell(sr, ""); cell(sr, ""); cell(sr, ""); cell(sr, "");
      rows.push(sr);
    }
  }
  replaceRows(document.getElementById("masters"), rows, "no masters", 10);
}

function drawLocks(locks) {
  const plural = (n, word) => n + " " + word + (n === 1 ? "" : "s");
  const note = plural(locks.keys_total, "key") + ", " + plural(locks.waiting_total, "request") + " waiting" +
    (locks.keys_total > locks.keys.length ? "; the busiest " + locks.keys.length + " shown" : "");
  document.getElementById("locks-note").textContent = note;
  const rows = locks.keys.map((l) => {
    const tr = el("tr", null, "lock");
    tr.dataset.key = l.key;
    cell(tr, l.key, "mono key");
    cell(tr, l.db, "num");
    cell(tr, l.held ? "held by client " + l.client_id : "not held here", l.held ? "" : "muted");
    cell(tr, l.waiting, "num");
    cell(tr, l.waiting_elsewhere, "num");
    return tr;
  });
  replaceRows(document.getElementById("locks"), rows, "no session locks or waiting requests in this proxy", 5);
}

function drawLost(lost) {
  const rows = lost.map((l) => {
    const tr = el("tr", null, "lost");
    cell(tr, new Date(l.at_unix_ms).toLocaleTimeString() + " (" + duration(l.ago_ms) + " ago)");
    cell(tr, l.key, "mono key");
    cell(tr, l.db, "num");
    cell(tr, l.reason);
    cell(tr, "client " + l.client_id);
    return tr;
  });
  replaceRows(document.getElementById("lost"), rows, "none lost since the proxy started", 5);
}

function drawLegacy(legacy) {
  const section = document.getElementById("legacy-section");
  section.hidden = !legacy;
  if (!legacy) return;
  const seen = legacy.old_code_seen_ago_ms === null ? "never" : duration(legacy.old_code_seen_ago_ms) + " ago";
  document.getElementById("legacy-note").textContent = legacy.name + " (" + legacy.state + "), bridging " +
    legacy.keys.join(", ") + ": " + legacy.old_code_locks + " held by the old code; an old-code lock last seen " + seen;
  const rows = legacy.old_code_keys.map((k) => {
    const tr = el("tr", null, "legacy-lock");
    cell(tr, k.key, "mono key");
    cell(tr, k.db, "num");
    cell(tr, k.pttl_ms < 0 ? "none" : duration(k.pttl_ms), "num");
    return tr;
  });
  replaceRows(document.getElementById("legacy"), rows, "no lock of the old code's on the legacy server", 3);
}

function draw(status) {
  countdowns = [];
  receivedAt = performance.now();
  drawProxy(status.proxy);
  drawMasters(status.masters);
  drawLocks(status.locks);
  drawLost(status.lost);
  drawLegacy(status.legacy);
  const config = document.getElementById("config");
  if (config.textContent !== status.config) config.textContent = status.config;
  document.getElementById("updated").textContent = new Date(status.proxy.now_unix_ms).toLocaleTimeString();
  document.body.classList.remove("stale");
  const banner = document.getElementById("banner");
  banner.classList.remove("shown");
  banner.textContent = "";
  document.body.dataset.loaded = "1";
}

function unreachable(why) {
  document.body.classList.add("stale");
  const banner = document.getElementById("banner");
  banner.textContent = "The proxy's status cannot be read (" + why + "): what is shown is from the last view.";
  banner.classList.add("shown");
}

async function refresh() {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
  try {
    const response = await fetch("/status.json", { cache: "no-store", signal: abort.signal });
    if (!response.ok) throw new Error("HTTP " + response.status);
    draw(await response.json());
  } catch (e) {
    unreachable(e && e.name === "AbortError" ? "no answer within " + FETCH_TIMEOUT_MS / 1000 + " s" : String(e.message || e));
  } finally {
    clearTimeout(timer);
    setTimeout(refresh, REFRESH_MS);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  refresh();
  setInterval(tick, 250);
});

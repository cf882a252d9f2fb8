// The status console: fetch /status.json, draw it, again every interval_s.
// Every value goes into the page as text (textContent, setAttribute), never as markup: keys and
// endpoint names come from users. Elements holding a figure carry data-figure="..." (the tests read them).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const MAX_GROUPS = 50;
const opened = new Set();  // the keys whose drill-down is open ("pool\0key"): kept across refreshes

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  seconds = Math.max(0, seconds);
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["min", 60]]) {
    if (seconds >= size) return `${Math.round(seconds / size)} ${unit}`;
  }
  return `${Math.round(seconds)} s`;
}

function ms(value) {
  return value === null || value === undefined ? "-" : `${value.toFixed(1)} ms`;
}

function figure(name, value, label, alert) {
  return el("div", {class: alert ? "figure alert" : "figure"},
            el("span", {class: "value", "data-figure": name}, value), el("span", {class: "label"}, label));
}

// A part is {state: "ok", ...its figures} or {state: "unreachable", reason}; names are values, never keys.
function down(data) {
  return data.state !== "ok";
}

function unreachable(part, data) {
  return el("p", {class: "down", "data-figure": "unreachable", "data-part": part}, `unreachable: ${data.reason}`);
}

function table(headers, rows) {
  const head = el("tr", {}, ...headers.map(([text, cls]) => el("th", cls ? {class: cls} : {}, text)));
  return el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows));
}

function cell(name, value, cls) {
  return el("td", cls ? {"data-figure": name, class: cls} : {"data-figure": name}, value);
}

function minutes(span) {
  return span >= 3600 ? `${Math.round(span / 3600)} h` : `${Math.round(span / 60)} min`;
}

// A small line chart: one polyline per series over the last `span` seconds, the largest value on the axis.
function chart(name, caption, points, series, now, span, unit) {
  const width = 520, height = 90, pad = 4;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("data-figure", name);
  svg.setAttribute("data-points", points.length);
  const top = Math.max(unit === "ms" ? 1 : 0.1, ...points.flatMap(p => series.map(s => p[s.field])));
  for (const s of series) {
    const line = document.createElementNS(SVG, "polyline");
    const xy = points.map(p => {
      const x = pad + (width - 2 * pad) * (1 - Math.min(span, Math.max(0, now - p.at)) / span);
      const y = height - pad - (height - 2 * pad) * (p[s.field] / top);
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    });
    line.setAttribute("points", xy.join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", s.color);
    line.setAttribute("stroke-width", "2");
    svg.append(line);
    if (points.length === 1) {  // one point draws no line: a dot
      const [x, y] = xy[0].split(",");
      const dot = document.createElementNS(SVG, "circle");
      dot.setAttribute("cx", x); dot.setAttribute("cy", y); dot.setAttribute("r", "3");
      dot.setAttribute("fill", s.color);
      svg.append(dot);
    }
  }
  const labels = [[pad + 2, 14, "start", points.length ? `max ${top.toFixed(1)} ${unit}` : `no data in the last ${minutes(span)}`],
                  [pad + 2, height - pad - 2, "start", `${minutes(span)} ago`], [width - pad - 2, height - pad - 2, "end", "now"]];
  for (const [x, y, anchor, text] of labels) {
    const label = document.createElementNS(SVG, "text");
    label.setAttribute("x", x); label.setAttribute("y", y); label.setAttribute("text-anchor", anchor);
    label.setAttribute("font-size", "11"); label.setAttribute("fill", "#6b7385");
    label.textContent = text;
    svg.append(label);
  }
  const legend = series.map(s => el("span", {class: `legend-${s.field.split("_")[0]}`}, ` ■ ${s.label}`));
  return el("div", {class: "chart"}, el("span", {class: "caption"}, caption, ...legend), svg);
}

function rate(value) {
  return value >= 10 ? `${value.toFixed(0)}/s` : `${(value || 0).toFixed(1)}/s`;
}

// The command a person runs next, as text to copy (the page runs nothing).
function command(name, text, note) {
  return el("div", {class: "command"}, note ? `${note}: ` : "", el("code", {"data-figure": name}, text));
}

function sum(groups, field) {
  return groups.reduce((n, g) => n + g[field], 0);
}

// A pool worth a look: traffic, waiting requests, workers, or something set aside.
function busy(pool) {
  return pool.calls_per_s > 0 || sum(pool.groups, "backlog") > 0 || sum(pool.groups, "workers") > 0
    || pool.orphans > 0 || pool.dead_letters > 0 || pool.poison > 0 || pool.latency_p99_ms !== null;
}

function slowest(traces) {
  return Object.values(traces || {}).reduce((a, b) => (a && a.duration_ms >= b.duration_ms ? a : b), null);
}

function trace(name, hop) {
  if (!hop) return el("div", {class: "command muted"}, "no handled request in the trace log (SWITCHYARD_TRACE_LOG)");
  return command(name, `switchyard trace ${hop.trace_id}`, `slowest ${ms(hop.duration_ms)}, worker ${hop.worker_id}`);
}

// The key filter: part of a key; a key that matches whole opens its drill-down. From the box or #key=.
function filterText() {
  return document.getElementById("filter").value;
}

function groupRows(pool, traces, now) {
  const wanted = filterText();
  const groups = pool.groups.filter(g => !wanted || g.key.includes(wanted)).sort((a, b) => b.calls_per_s - a.calls_per_s || b.backlog - a.backlog
                                                 || (a.key < b.key ? -1 : 1));
  const rows = [];
  for (const g of groups.slice(0, MAX_GROUPS)) {
    const row = el("tr", {"data-figure": "group", "data-key": g.key, class: "group", tabindex: "0"},
      cell("key", g.key, "key"), cell("state", g.state, `state-${g.state.replace(" ", "-")}`),
      cell("calls", rate(g.calls_per_s), "num"), cell("latency-p99", ms(g.latency_p99_ms), "num"),
      cell("workers", g.workers, "num"), cell("backlog", g.backlog, "num"),
      cell("last-activity", g.last_activity_ms === null ? "never" : `${age(now - g.last_activity_ms / 1000)} ago`));
    const detail = el("td", {colspan: "7"},
      el("div", {}, "worker ids: ", el("span", {"data-figure": "worker-ids"}, g.worker_ids.length ? g.worker_ids.join(", ") : "none")),
      trace("trace-command", traces[g.key]),
      command("group-command", `switchyard pool status --pool ${pool.pool} --json`, "all figures"));
    const id = `${pool.pool}\0${g.key}`;
    const more = el("tr", {"data-figure": "group-detail", "data-key": g.key, class: "detail"}, detail);
    more.hidden = !opened.has(id) && g.key !== wanted;
    const toggle = () => { more.hidden = !more.hidden; if (more.hidden) opened.delete(id); else opened.add(id); };
    row.addEventListener("click", toggle);
    row.addEventListener("keydown", event => { if (event.key === "Enter") toggle(); });
    rows.push(row, more);
  }
  return rows;
}

function poolBox(pool, traces, now, span) {
  const box = el("div", {class: "pool", "data-figure": "pool", "data-pool": pool.pool}, el("h3", {}, pool.pool));
  const p99 = el("a", {href: `#trace-${pool.pool}`, class: "link"}, figure("latency-p99", ms(pool.latency_p99_ms), "latency p99 (5 min) → trace"));
  box.append(el("div", {class: "figures"},
    figure("calls", rate(pool.calls_per_s), "calls/s (1 min)"),
    figure("groups", pool.groups.length, "groups"),
    figure("workers", sum(pool.groups, "workers"), "workers"),
    figure("backlog", sum(pool.groups, "backlog"), "backlog", sum(pool.groups, "backlog") > 0),
    figure("orphans", pool.orphans, "orphans"),
    figure("dead-letters", pool.dead_letters, "dead letters", pool.dead_letters > 0),
    figure("poison", pool.poison, "poison", pool.poison > 0),
    figure("spares", pool.spares, "spares waiting"), p99));
  if (pool.poison > 0) {
    box.append(el("div", {class: "command", "data-figure": "poison-note"},
      `${pool.poison} poison: set aside for a person, queue ${pool.pool}-poison; read them, then replay them once `
      + `the cause is fixed: `, el("code", {}, `switchyard pool poison --pool ${pool.pool} [--replay]`)));
  }
  if (!pool.control_plane && (pool.orphans > 0 || pool.dead_letters > 0 || pool.activity_waiting > 0)) {
    box.append(command("control-plane-command", `switchyard local --pool ${pool.pool}`,
                       "no control plane reads its orphans, dead letters and reports; start one"));
  }
  const slow = el("div", {id: `trace-${pool.pool}`}, trace("pool-trace-command", slowest(traces)));
  box.append(slow);
  box.append(el("div", {class: "charts"},
    chart("chart-rpc-latency", "latency, delivery to reply:", pool.latency,
          [{field: "p99_ms", label: "p99", color: "#2b6cb0"}, {field: "p50_ms", label: "p50", color: "#9f7aea"}], now, span, "ms"),
    chart("chart-rpc-calls", "calls answered:", pool.latency,
          [{field: "calls_per_s", label: "calls/s", color: "#1f8a4c"}], now, span, "/s")));
  const rows = groupRows(pool, traces, now);
  if (filterText()) {
    box.append(el("p", {class: "hint", "data-figure": "filter-count"},
                  `${rows.length / 2} of ${pool.groups.length} keys contain “${filterText()}”`));
  }
  if (rows.length) {
    box.append(el("p", {class: "hint"}, "a key's row opens its worker ids and its slowest trace"));
    box.append(table([["key"], ["state"], ["calls/s", "num"], ["p99 (5 min)", "num"], ["workers", "num"],
                      ["backlog", "num"], ["last activity"]], rows));
  }
  if (pool.groups.length > MAX_GROUPS && !filterText()) {
    box.append(el("p", {class: "more"}, `and ${pool.groups.length - MAX_GROUPS} more groups (switchyard status --json)`));
  }
  return box;
}

function rpc(data, status) {
  const now = status.at, span = status.history_s || 900, traces = status.traces || {};
  const section = el("section", {class: "wide", "data-part": "rpc"}, el("h2", {}, "RPC pools"));
  if (down(data)) return section.append(unreachable("rpc", data)) || section;
  const active = data.pools.filter(busy).sort((a, b) => b.calls_per_s - a.calls_per_s
    || sum(b.groups, "backlog") - sum(a.groups, "backlog") || (a.pool < b.pool ? -1 : 1));
  const idle = data.pools.filter(pool => !busy(pool));
  section.append(el("div", {class: "figures"}, figure("pool-count", data.pools.length, "pools"),
    figure("busy-count", active.length, "busy"),
    figure("calls-total", rate(data.pools.reduce((n, p) => n + p.calls_per_s, 0)), "calls/s, every pool")));
  if (!data.pools.length) section.append(el("p", {class: "empty"}, "no pools"));
  for (const pool of active) section.append(poolBox(pool, traces[pool.pool] || {}, now, span));
  if (idle.length) {
    const names = idle.map(pool => el("span", {class: "idle", "data-figure": "idle-pool", "data-pool": pool.pool},
                                      `${pool.pool} (${pool.groups.length} groups)`));
    const list = [];
    names.forEach((name, i) => { if (i) list.push(", "); list.push(name); });
    section.append(el("p", {class: "idle-pools", "data-figure": "idle-pools"},
                      `${idle.length} idle pool${idle.length === 1 ? "" : "s"} (no calls, workers, backlog or set-aside messages): `, ...list));
  }
  return section;
}

function delay(data, now, span) {
  const section = el("section", {"data-part": "delay"}, el("h2", {}, "Delay scheduler"));
  if (down(data)) return section.append(unreachable("delay", data)) || section;
  section.append(el("div", {class: "figures"},
    figure("delay-waiting", data.waiting, "waiting"),
    figure("delay-ready", data.ready, "ready"),
    figure("delay-overdue", data.overdue, "overdue", data.overdue > 0),
    figure("delay-parked", data.parked, "parked", data.parked > 0),
    figure("delay-oldest-due", data.oldest_due_s ? `${age(data.oldest_due_s)} ago` : "-", "earliest due"),
    figure("delay-lateness-p99", ms(data.lateness_p99_ms), "lateness p99 (5 min)")));
  if (data.parked > 0) {
    section.append(command("delay-replay-command", "switchyard delay parked", `${data.parked} parked: read why`),
                   command("delay-replay-command", "switchyard delay replay --all", "then, the cause fixed, replay them"));
  }
  section.append(chart("chart-delay-lateness", `fire lateness, schema ${data.schema}:`, data.lateness,
                       [{field: "p99_ms", label: "p99", color: "#2b6cb0"}], now, span, "ms"));
  return section;
}

function bus(data) {
  const section = el("section", {"data-part": "bus"}, el("h2", {}, "Event bus subscribers"));
  if (down(data)) return section.append(unreachable("bus", data)) || section;
  if (!data.subscribers.length) return section.append(el("p", {class: "empty"}, "no subscribers")) || section;
  section.append(table([["subscriber"], ["queued", "num"], ["batches", "num"], ["oldest", "num"], ["health", "num"]],
    data.subscribers.map(s => el("tr", {"data-figure": "subscriber", "data-name": s.name},
      cell("name", s.name, "key"), cell("queued", s.events, "num"), cell("batches", s.batches, "num"),
      cell("oldest", age(s.oldest_age_ms / 1000), "num"), cell("health", s.health_points, "num")))));
  return section;
}

function pending(data) {
  const section = el("section", {"data-part": "pending"}, el("h2", {}, "Pending endpoints"));
  if (down(data)) return section.append(unreachable("pending", data)) || section;
  if (!data.endpoints.length) return section.append(el("p", {class: "empty"}, "no pending requests")) || section;
  section.append(table([["endpoint"], ["waiting", "num"], ["taken", "num"], ["answered", "num"], ["oldest", "num"]],
    data.endpoints.map(e => el("tr", {"data-figure": "endpoint", "data-name": e.endpoint},
      cell("name", e.endpoint, "key"), cell("waiting", e.waiting, "num"), cell("taken", e.taken, "num"),
      cell("answered", e.answered, "num"), cell("oldest", age(e.oldest_age_s), "num")))));
  return section;
}

let latest = null;  // the last figures drawn: the filter redraws them

function draw(status) {
  latest = status;
  const now = status.at;
  document.getElementById("updated").textContent = new Date(now * 1000).toISOString().replace(/\.\d+Z$/, "Z");
  document.getElementById("source").textContent = status.source ? `stack configuration ${status.source}` : "local settings";
  document.getElementById("app").replaceChildren(rpc(status.rpc, status), delay(status.delay, now, status.delay_history_s || 900), bus(status.bus),
                                                 pending(status.pending));
  for (const box of document.querySelectorAll("[data-figure=pool]")) {  // where each pool is drawn (the tests read it)
    box.setAttribute("data-top", Math.round(box.getBoundingClientRect().top));
  }
}

async function refresh() {
  let interval = 2;
  try {
    const response = await fetch("/status.json", {cache: "no-store"});
    const status = await response.json();
    interval = status.interval_s || interval;
    if (status.at) draw(status);
    document.getElementById("stale").textContent = "";
  } catch (error) {
    document.getElementById("stale").textContent = `the console does not answer (${error.message}); retrying`;
  }
  setTimeout(refresh, interval * 1000);
}

function fromHash() {
  let hash = location.hash.slice(1);
  try { hash = decodeURIComponent(hash); } catch (error) { /* a malformed escape: taken as it is */ }
  if (hash.startsWith("key=")) document.getElementById("filter").value = hash.slice(4);
}

document.getElementById("filter").addEventListener("input", event => {
  history.replaceState(null, "", event.target.value ? `#key=${encodeURIComponent(event.target.value)}` : location.pathname);
  if (latest) draw(latest);
});
window.addEventListener("hashchange", () => { fromHash(); if (latest) draw(latest); });
fromHash();
refresh();

// The status console: fetch /status.json, draw it, again every interval_s.
// Every value goes into the page as text (textContent, setAttribute), never as markup: keys and
// endpoint names come from users. Elements holding a figure carry data-figure="..." (the tests read them).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const MAX_GROUPS = 50;

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

// A small line chart: one polyline per series, the last 15 minutes, the largest value on the axis.
function chart(name, caption, points, series, now) {
  const width = 520, height = 90, pad = 4, span = 900;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("data-figure", name);
  svg.setAttribute("data-points", points.length);
  const top = Math.max(1, ...points.flatMap(p => series.map(s => p[s.field])));
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
  const labels = [[pad + 2, 14, "start", points.length ? `max ${top.toFixed(1)} ms` : "no data in the last 15 min"],
                  [pad + 2, height - pad - 2, "start", "15 min ago"], [width - pad - 2, height - pad - 2, "end", "now"]];
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

function rpc(data, now) {
  const section = el("section", {class: "wide", "data-part": "rpc"}, el("h2", {}, "RPC pools"));
  if (down(data)) return section.append(unreachable("rpc", data)) || section;
  section.append(figure("pool-count", data.pools.length, "pools"));
  if (!data.pools.length) section.append(el("p", {class: "empty"}, "no pools"));
  for (const pool of data.pools) {
    const box = el("div", {class: "pool", "data-figure": "pool", "data-pool": pool.pool}, el("h3", {}, pool.pool));
    box.append(el("div", {class: "figures"},
      figure("groups", pool.groups.length, "groups"),
      figure("workers", pool.groups.reduce((n, g) => n + g.workers, 0), "workers"),
      figure("backlog", pool.groups.reduce((n, g) => n + g.backlog, 0), "backlog"),
      figure("orphans", pool.orphans, "orphans"),
      figure("dead-letters", pool.dead_letters, "dead letters", pool.dead_letters > 0),
      figure("poison", pool.poison, "poison", pool.poison > 0),
      figure("spares", pool.spares, "spares waiting"),
      figure("latency-p99", ms(pool.latency_p99_ms), "latency p99 (5 min)")));
    box.append(chart("chart-rpc-latency", "latency, delivery to reply:", pool.latency,
                     [{field: "p99_ms", label: "p99", color: "#2b6cb0"}, {field: "p50_ms", label: "p50", color: "#9f7aea"}],
                     now));
    const rows = pool.groups.slice(0, MAX_GROUPS).map(g => el("tr", {"data-figure": "group", "data-key": g.key},
      cell("key", g.key, "key"), cell("state", g.state, `state-${g.state.replace(" ", "-")}`), cell("workers", g.workers, "num"),
      cell("backlog", g.backlog, "num"),
      cell("last-activity", g.last_activity_ms === null ? "never" : `${age(now - g.last_activity_ms / 1000)} ago`)));
    if (rows.length) {
      box.append(table([["key"], ["state"], ["workers", "num"], ["backlog", "num"], ["last activity"]], rows));
    }
    if (pool.groups.length > MAX_GROUPS) {
      box.append(el("p", {class: "more"}, `and ${pool.groups.length - MAX_GROUPS} more groups (switchyard status --json)`));
    }
    section.append(box);
  }
  return section;
}

function delay(data, now) {
  const section = el("section", {"data-part": "delay"}, el("h2", {}, "Delay scheduler"));
  if (down(data)) return section.append(unreachable("delay", data)) || section;
  section.append(el("div", {class: "figures"},
    figure("delay-waiting", data.waiting, "waiting"),
    figure("delay-ready", data.ready, "ready"),
    figure("delay-overdue", data.overdue, "overdue", data.overdue > 0),
    figure("delay-parked", data.parked, "parked", data.parked > 0),
    figure("delay-oldest-due", data.oldest_due_s ? `${age(data.oldest_due_s)} ago` : "-", "earliest due"),
    figure("delay-lateness-p99", ms(data.lateness_p99_ms), "lateness p99 (5 min)")));
  section.append(chart("chart-delay-lateness", `fire lateness, schema ${data.schema}:`, data.lateness,
                       [{field: "p99_ms", label: "p99", color: "#2b6cb0"}], now));
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

function draw(status) {
  const now = status.at;
  document.getElementById("updated").textContent = new Date(now * 1000).toISOString().replace(/\.\d+Z$/, "Z");
  document.getElementById("source").textContent = status.source ? `stack configuration ${status.source}` : "local settings";
  document.getElementById("app").replaceChildren(rpc(status.rpc, now), delay(status.delay, now), bus(status.bus),
                                                 pending(status.pending));
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

refresh();

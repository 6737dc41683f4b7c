// The mqttmesh console: polls the admin API of the node that serves it and draws the mesh.
// Plain script, no build step. Everything shown is text in the DOM (SVG for the graph).
"use strict";

const POLL_MS = 1000;
const CLIENTS_MS = 2000;
const svgNS = "http://www.w3.org/2000/svg";
let token = sessionStorage.getItem("mqttmesh-token") || "";
let root = null;          // the node whose shortest-path tree is drawn
let previous = {};        // node -> {t, stats}: for rates
let rates = {};           // node -> {in, out}
let clientsAfter = null;  // cursor of the next page of clients

function el(id) { return document.getElementById(id); }

async function api(method, path) {
  const headers = token ? { "Authorization": "Bearer " + token } : {};
  const r = await fetch(path, { method, headers, cache: "no-store" });
  if (r.status === 401 || r.status === 403) {
    el("token-box").classList.add("needed");
    throw new Error(r.status === 401 ? "a token is needed" : "the token was refused");
  }
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || ("HTTP " + r.status));
  return body;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function layout(ids) {
  const pos = {};
  const n = ids.length, cx = 300, cy = 210, r = n > 1 ? 160 : 0;
  ids.forEach((id, i) => {
    const a = -Math.PI / 2 + (2 * Math.PI * i) / n;
    pos[id] = { x: cx + r * Math.cos(a), y: cy + r * Math.sin(a) };
  });
  return pos;
}

function drawGraph(nodes, tree) {
  const g = el("graph");
  g.replaceChildren();
  const ids = nodes.map((n) => n.id);
  const pos = layout(ids);
  const seen = new Set();
  for (const n of nodes) {
    for (const l of n.links) {
      if (!(l.peer in pos)) continue;
      const key = [n.id, l.peer].sort().join("\u0000");
      if (seen.has(key)) continue;
      seen.add(key);
      const a = pos[n.id], b = pos[l.peer];
      const inTree = tree[n.id] === l.peer || tree[l.peer] === n.id;
      const cls = "link" + (l.up ? "" : " down") + (inTree && l.up ? " tree" : "");
      g.appendChild(svg("line", { x1: a.x, y1: a.y, x2: b.x, y2: b.y, class: cls,
        "data-link": [n.id, l.peer].sort().join("--") }));
      g.appendChild(svg("text", { x: (a.x + b.x) / 2, y: (a.y + b.y) / 2 - 4, class: "cost" }, String(l.cost)));
    }
  }
  for (const n of nodes) {
    const p = pos[n.id];
    const grp = svg("g", { class: "node " + n.status + (n.id === root ? " root" : ""),
      "data-node": n.id, "data-status": n.status });
    grp.appendChild(svg("circle", { cx: p.x, cy: p.y, r: 24 }));
    grp.appendChild(svg("text", { x: p.x, y: p.y + 42 }, n.id));
    grp.appendChild(svg("text", { x: p.x, y: p.y + 4 }, n.status));
    grp.addEventListener("click", () => { root = n.id; refresh(); });
    g.appendChild(grp);
  }
}

function drawNodes(nodes, missing) {
  const body = el("nodes").tBodies[0];
  body.replaceChildren();
  const now = performance.now() / 1000;
  for (const n of nodes) {
    if (n.stats) {
      const p = previous[n.id];
      if (p && now > p.t) {
        rates[n.id] = { in: (n.stats.messages_received - p.stats.messages_received) / (now - p.t),
                        out: (n.stats.messages_sent - p.stats.messages_sent) / (now - p.t) };
      }
      previous[n.id] = { t: now, stats: n.stats };
    } else {
      delete rates[n.id];
    }
    const r = rates[n.id];
    const tr = document.createElement("tr");
    tr.dataset.node = n.id;
    for (const [text, cls] of [
      [n.id + (n.self ? " (this node)" : ""), ""],
      [n.status, "status-" + n.status],
      [n.distance === null ? "-" : String(n.distance), "num"],
      [n.stats ? String(n.stats.clients_connected) : "-", "num"],
      [r ? r.in.toFixed(1) : "-", "num"],
      [r ? r.out.toFixed(1) : "-", "num"],
    ]) {
      const td = document.createElement("td");
      td.textContent = text;
      if (cls) td.className = cls;
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
  el("missing").textContent = missing.length ? "no answer from: " + missing.join(", ") : "";
}

function clientRow(c) {
  const tr = document.createElement("tr");
  tr.dataset.client = c.client_id;
  const since = new Date(c.connected_since * 1000).toISOString().replace("T", " ").slice(0, 19);
  for (const [text, cls] of [[c.client_id, ""], [c.node, ""], [c.address, ""], [c.transport, ""],
                             [since, ""], [String(c.subscriptions), "num"]]) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
  }
  const td = document.createElement("td");
  const b = document.createElement("button");
  b.textContent = "kick";
  b.className = "kick";
  b.addEventListener("click", async () => {
    b.disabled = true;
    try {
      await api("DELETE", "/api/v1/clients/" + encodeURIComponent(c.client_id));
      tr.remove();
    } catch (e) {
      b.disabled = false;
      el("state").textContent = "kick failed: " + e.message;
    }
  });
  td.appendChild(b);
  tr.appendChild(td);
  return tr;
}

async function loadClients(append) {
  const q = "/api/v1/clients?limit=100" + (append && clientsAfter ? "&after=" + encodeURIComponent(clientsAfter) : "");
  const page = await api("GET", q);
  const body = el("clients").tBodies[0];
  if (!append) body.replaceChildren();
  for (const c of page.items) body.appendChild(clientRow(c));
  clientsAfter = page.next;
  el("more").hidden = !page.next;
  el("client-count").textContent = "(" + body.rows.length + (page.next ? "+" : "") + ")";
}

async function refresh() {
  try {
    const mesh = await api("GET", "/api/v1/nodes");
    el("here").textContent = mesh.node;
    if (root === null) root = mesh.node;
    let tree = {};
    try { tree = (await api("GET", "/api/v1/routes?from=" + encodeURIComponent(root))).parent; }
    catch (e) { root = mesh.node; }
    el("root").textContent = root;
    drawGraph(mesh.nodes, tree);
    drawNodes(mesh.nodes, mesh.missing);
    el("state").textContent = "updated " + new Date().toLocaleTimeString();
    el("state").className = "state";
  } catch (e) {
    el("state").textContent = "error: " + e.message;
    el("state").className = "state error";
  }
}

el("token-save").addEventListener("click", () => {
  token = el("token").value.trim();
  sessionStorage.setItem("mqttmesh-token", token);
  el("token-box").classList.remove("needed");
  refresh();
  loadClients(false).catch(() => {});
});
el("more").addEventListener("click", () => loadClients(true).catch(() => {}));

refresh();
loadClients(false).catch(() => {});
setInterval(refresh, POLL_MS);
setInterval(() => { if (!clientsAfter) loadClients(false).catch(() => {}); }, CLIENTS_MS);

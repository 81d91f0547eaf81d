// The provenance graph of one event: its sources and what was derived from it, a number of hops
// each way over SOURCE_FROM, plus the SUPERSEDES links of every event drawn, read through the
// read-only Cypher route and drawn as SVG.

import { cypher } from "./api.js";
import { el, fill, isEventId, kindClass, shortId, svg } from "./dom.js";
import { clip, when } from "./format.js";
import { NODE_H, NODE_W, edgePath, layout } from "./layout.js";

export const MAX_NODES = 60;

const SOURCES = `MATCH (a:Event)-[:SOURCE_FROM]->(b:Event) WHERE a.event_id IN $ids
RETURN a.event_id, b.event_id, b.kind, b.ts, b.text LIMIT $limit`;
const DERIVED = `MATCH (d:Event)-[:SOURCE_FROM]->(a:Event) WHERE a.event_id IN $ids
RETURN a.event_id, d.event_id, d.kind, d.ts, d.text LIMIT $limit`;
const AMONG = `MATCH (a:Event)-[:SOURCE_FROM]->(b:Event) WHERE a.event_id IN $ids AND b.event_id IN $ids
RETURN a.event_id, b.event_id`;
// Two queries, not one with OR: each side's IN is answered from the event id index.
const NEWER = `MATCH (a:Event)-[:SUPERSEDES]->(b:Event) WHERE b.event_id IN $ids
RETURN a.event_id, b.event_id, a.kind, a.ts, a.text, b.kind, b.ts, b.text LIMIT $limit`;
const OLDER = `MATCH (a:Event)-[:SUPERSEDES]->(b:Event) WHERE a.event_id IN $ids
RETURN a.event_id, b.event_id, a.kind, a.ts, a.text, b.kind, b.ts, b.text LIMIT $limit`;

/**
 * The neighbourhood of an event: {nodes: Map id -> {id, kind, ts, text, layer}, edges: [{from,
 * to, type}], superseded: Set of ids, truncated: bool}. Layer is the hop: negative for sources,
 * positive for derived events, 0 for the event itself.
 */
export async function neighbourhood(event, hops) {
  const nodes = new Map([[event.event_id, { id: event.event_id, kind: event.kind, ts: event.ts, text: event.text, layer: 0 }]]);
  const edges = new Map();
  let truncated = false;
  const addEdge = (from, to, type) => edges.set(`${type} ${from} ${to}`, { from, to, type });
  const addNode = (id, kind, ts, text, layer) => {
    if (nodes.has(id)) return false;
    if (nodes.size >= MAX_NODES) {
      truncated = true;
      return false;
    }
    nodes.set(id, { id, kind, ts, text, layer });
    return true;
  };
  for (const [query, step] of [[SOURCES, -1], [DERIVED, 1]]) {
    let frontier = [event.event_id];
    for (let hop = 1; hop <= hops && frontier.length; hop++) {
      const { rows } = await cypher(query, { ids: frontier, limit: MAX_NODES + 1 });
      if (rows.length > MAX_NODES) truncated = true;
      const next = [];
      for (const [known, found, kind, ts, text] of rows) {
        if (addNode(found, kind, ts, text, step * hop)) next.push(found);
        if (nodes.has(found)) addEdge(step < 0 ? known : found, step < 0 ? found : known, "SOURCE_FROM");
      }
      frontier = next;
    }
  }
  const ids = [...nodes.keys()];
  for (const [from, to] of (await cypher(AMONG, { ids })).rows) addEdge(from, to, "SOURCE_FROM");
  const superseded = new Set();
  const newer = await cypher(NEWER, { ids, limit: MAX_NODES + 1 });
  const older = await cypher(OLDER, { ids, limit: MAX_NODES + 1 });
  for (const [a, b, ak, ats, atext, bk, bts, btext] of [...newer.rows, ...older.rows]) {
    // A newer or older version sits in the column of the version it is linked to.
    if (nodes.has(a)) addNode(b, bk, bts, btext, nodes.get(a).layer);
    else if (nodes.has(b)) addNode(a, ak, ats, atext, nodes.get(b).layer);
    if (nodes.has(a) && nodes.has(b)) addEdge(a, b, "SUPERSEDES");
    superseded.add(b); // every event in the graph is live, so b is superseded by a live event
  }
  return { nodes, edges: [...edges.values()], superseded, truncated };
}

/**
 * The graph as SVG, with every node a link (click, Enter or Space) to its event's page.
 * `marks` maps ids to extra classes ("doomed" for an erasure preview).
 */
export function drawGraph(graph, focusId, { onOpen, marks } = {}) {
  const nodes = [...graph.nodes.values()];
  const { at, width, height, floor } = layout(nodes, graph.edges);
  const pairs = new Set(graph.edges.filter((e) => e.type === "SOURCE_FROM").map((e) => `${e.from} ${e.to}`));
  const w = width + 50; // room for the arcs of links within one column
  const root = svg("svg", {
    class: "graph",
    width: w,
    height,
    viewBox: `0 0 ${w} ${height}`,
    role: "group",
    "aria-label": `Provenance graph: ${nodes.length} events, ${graph.edges.length} links`,
  });
  const arrow = (id, cls) =>
    svg("marker", { id, class: cls, viewBox: "0 0 10 10", refX: "9", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" },
      svg("path", { d: "M 0 0 L 10 5 L 0 10 z" }));
  root.append(svg("defs", null, arrow("arrow-source", "arrow-source"), arrow("arrow-version", "arrow-version")));
  const links = svg("g", { class: "edges", "aria-hidden": "true" });
  for (const e of graph.edges) {
    const a = at.get(e.from);
    const b = at.get(e.to);
    if (!a || !b) continue;
    const version = e.type === "SUPERSEDES";
    links.append(svg("path", {
      class: version ? "edge edge-version" : "edge",
      d: edgePath(a, b, floor, version && pairs.has(`${e.from} ${e.to}`) ? 12 : 0),
      "marker-end": version ? "url(#arrow-version)" : "url(#arrow-source)",
      "data-from": e.from,
      "data-to": e.to,
      "data-type": e.type,
    }));
  }
  root.append(links);
  const group = svg("g", { class: "nodes" });
  for (const n of nodes) group.append(drawNode(n, at.get(n.id), graph, focusId, onOpen, marks));
  root.append(group);
  return root;
}

function drawNode(n, p, graph, focusId, onOpen, marks) {
  const superseded = graph.superseded.has(n.id);
  const mark = (marks && marks.get(n.id)) || "";
  const classes = ["node", kindClass(n.kind), n.id === focusId ? "focus" : "", superseded ? "superseded" : "", mark];
  const states = [superseded ? "superseded" : "", mark === "doomed" ? "would be deleted" : "", mark === "deleted" ? "deleted" : ""].filter(Boolean);
  const where = n.layer < 0 ? `source, ${-n.layer} hop${n.layer < -1 ? "s" : ""} back` : n.layer > 0 ? `derived, ${n.layer} hop${n.layer > 1 ? "s" : ""} on` : "this event";
  const label = `${n.kind} ${shortId(n.id)}, ${where}${states.length ? ", " + states.join(", ") : ""}: ${clip(n.text, 80)}`;
  const g = svg("g", {
    class: classes.filter(Boolean).join(" "),
    transform: `translate(${p.x} ${p.y})`,
    tabindex: isEventId(n.id) ? "0" : "-1",
    role: "link",
    "aria-label": label,
    "data-event-id": n.id,
    "data-layer": n.layer,
  });
  g.append(
    svg("title", null, `${n.kind} ${n.id}\n${when(n.ts)}\n${n.text || ""}`),
    svg("rect", { class: "box", width: NODE_W, height: NODE_H, rx: "6", ry: "6" }),
    svg("rect", { class: "stripe", width: "6", height: NODE_H, rx: "3", ry: "3" }),
    svg("text", { x: "14", y: "19", class: "node-head" }, `${clip(n.kind, 16)} · ${shortId(n.id)}`),
    svg("text", { x: "14", y: "37", class: "node-text" }, clip(n.text || "(no text)", 27)),
  );
  if (states.length) g.append(svg("text", { x: "14", y: "55", class: "node-state" }, states.join(" · ")));
  const open = () => onOpen && isEventId(n.id) && onOpen(n.id);
  g.addEventListener("click", open);
  g.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" || ev.key === " ") {
      ev.preventDefault();
      open();
    }
  });
  return g;
}

/** The legend under a graph, in words as well as colours. */
export function legend() {
  const item = (cls, text) => el("li", null, el("span", { class: `swatch ${cls}`, "aria-hidden": "true" }), text);
  return el("ul", { class: "legend" },
    item("kind-turn", "turn"), item("kind-tool", "tool_call"), item("kind-fact", "fact"), item("kind-other", "other kinds"),
    item("sw-focus", "this event"), item("sw-superseded", "superseded (dashed)"), item("sw-doomed", "would be deleted"),
    el("li", null, "→ points to a source (SOURCE_FROM); dashed ⇢ points to the version it supersedes"));
}

/** Replace a container's graph. */
export function showGraph(container, graph, focusId, options) {
  fill(container, drawGraph(graph, focusId, options));
}

// One event: its text, properties and links, the drawn provenance graph, and for a write key
// the erasure preview (a dry run drawn on the graph) before the delete with purge.

import { getEvent } from "./api.js";
import { el, eventLink, fill, heading, isEventId, kindBadge, problem } from "./dom.js";
import { renderErasure } from "./erasure.js";
import { auditHash } from "./page-audit.js";
import { json, plural, stateOf, when } from "./format.js";
import { MAX_NODES, legend, neighbourhood, showGraph } from "./graph.js";

let hopsChosen = "2";

export async function renderEvent(view, ctx, id) {
  fill(view, heading("Event"), el("p", { class: "loading" }, "Loading the event…"));
  if (!isEventId(id.toLowerCase())) {
    fill(view, heading("Event"), el("p", { class: "error", role: "alert" }, "That is not an event id."));
    return;
  }
  let event;
  try {
    event = await getEvent(id.toLowerCase());
  } catch (err) {
    fill(view, heading("Event"), problem(err, "The event could not be read"), el("p", null, el("a", { href: "#/timeline" }, "Back to the time line")));
    return;
  }
  const graphBox = el("div", { class: "graph-box scroll", id: "graph", tabindex: "-1" });
  const caption = el("p", { class: "graph-caption", id: "graph-caption", "aria-live": "polite" });
  const derivedList = el("div", { id: "derived-list" }, el("p", { class: "loading" }, "Reading the graph…"));
  const sourceIds = (event.properties || {}).source_event_ids;
  const sourceList = el("div", { id: "source-list" }, linkList("Sources (SOURCE_FROM)", sourceIds));
  const hops = el("select", { id: "hops", name: "hops" },
    ["1", "2", "3", "4"].map((n) => el("option", { value: n, selected: n === hopsChosen }, n)));
  const state = { graph: null, marks: new Map() };
  const open = (target) => ctx.go(`#/event/${target}`);
  const redraw = () => state.graph && showGraph(graphBox, state.graph, event.event_id, { onOpen: open, marks: state.marks });
  const draw = async () => {
    hopsChosen = hops.value;
    fill(caption, "Reading the graph…");
    try {
      state.graph = await neighbourhood(event, Number(hops.value));
    } catch (err) {
      fill(caption, problem(err, "The graph could not be read"));
      return;
    }
    redraw();
    const g = state.graph;
    const nodes = [...g.nodes.values()];
    const sources = nodes.filter((n) => n.layer < 0).length;
    const derived = nodes.filter((n) => n.layer > 0);
    fill(caption,
      `${plural(nodes.length, "event")} and ${plural(g.edges.length, "link")}: ${plural(sources, "source")} and ` +
      `${plural(derived.length, "derived event")} within ${plural(Number(hops.value), "hop")} each way.` +
      (g.truncated ? ` The graph stops at ${MAX_NODES} events; more are linked than drawn.` : ""));
    const described = (n) => el("li", null, kindBadge(n.kind), " ", eventLink(n.id), " ", n.text || "");
    fill(derivedList, derived.length
      ? el("ul", { class: "links" }, derived.filter((n) => n.layer === 1).map(described))
      : el("p", null, "Nothing drawn was derived from this event."));
    if (Array.isArray(sourceIds) && sourceIds.length) {
      // In the order the event names them; an id that names no live event stays as sent.
      fill(sourceList, el("h3", null, "Sources (SOURCE_FROM)"), el("ul", { class: "links" }, sourceIds.map((id) => {
        const n = g.nodes.get(id);
        return n && n.layer === -1 ? described(n) : el("li", null, eventLink(id, id), el("span", { class: "note" }, g.truncated ? " (not drawn)" : " (names no event now)"));
      })));
    }
  };
  hops.addEventListener("change", draw);
  const superseded = event.superseded_by || [];
  const st = stateOf(event, superseded);
  fill(view,
    heading(`Event ${event.event_id.slice(0, 8)}`),
    el("div", { class: "event-head" },
      kindBadge(event.kind),
      el("span", { class: `state state-${st.replace(/ /g, "-")}`, "data-testid": "event-state" }, st),
      el("span", { class: "mono", "data-testid": "event-id" }, event.event_id),
      el("span", null, when(event.ts)),
      ctx.session.canAudit() ? el("a", { href: auditHash("event", event.event_id), id: "who-read" }, "Who read this") : null),
    el("section", { "aria-labelledby": "text-title" },
      el("h2", { id: "text-title" }, "Text"),
      el("p", { class: "event-text", "data-testid": "event-text" }, event.text === null ? "(no text)" : event.text)),
    el("div", { class: "two" },
      el("section", { "aria-labelledby": "props-title" },
        el("h2", { id: "props-title" }, "Properties"),
        propertiesTable(event.properties)),
      el("section", { "aria-labelledby": "links-title" },
        el("h2", { id: "links-title" }, "Links"),
        sourceList,
        linkList("Supersedes", event.supersedes),
        linkList("Superseded by", superseded),
        validity(event),
        el("h3", null, "Derived from it (one hop)"),
        derivedList)),
    el("section", { "aria-labelledby": "graph-title" },
      el("h2", { id: "graph-title" }, "Provenance"),
      el("div", { class: "row" },
        el("div", { class: "field inline" }, el("label", { for: "hops" }, "Hops each way"), hops),
        el("p", { class: "hint" }, "Sources on the left, what was derived from it on the right. Click a node, or focus it and press Enter, to open that event.")),
      caption, graphBox, legend()),
    ctx.session.canWrite()
      ? renderErasure(event, { mark: (marks) => { state.marks = marks; redraw(); }, graph: () => state.graph })
      : null);
  await draw();
}

function propertiesTable(properties) {
  const entries = Object.entries(properties || {});
  if (!entries.length) return el("p", null, "No properties.");
  return el("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": "Properties" },
    el("table", { class: "props-table", id: "props-table" },
      el("thead", null, el("tr", null, el("th", { scope: "col" }, "name"), el("th", { scope: "col" }, "value (JSON as sent)"))),
      el("tbody", null, entries.map(([name, value]) =>
        el("tr", null, el("th", { scope: "row", class: "mono" }, name), el("td", null, el("code", null, json(value))))))));
}

function linkList(title, ids) {
  if (!Array.isArray(ids) || !ids.length) return null;
  return el("div", null,
    el("h3", null, title),
    el("ul", { class: "links" }, ids.map((id) => el("li", null, eventLink(id, id)))));
}

function validity(event) {
  if (typeof event.valid_from !== "number" && typeof event.valid_until !== "number") return null;
  return el("p", null, `Valid from ${typeof event.valid_from === "number" ? when(event.valid_from) : "the start"} until ${typeof event.valid_until === "number" ? when(event.valid_until) : "further notice"}.`);
}

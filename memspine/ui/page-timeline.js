// The time line: GET /v1/memory/events newest first, filtered by kind, time range and filterable
// properties (prop.NAME), paged with the API's cursor; each event's kind and state at a glance.

import { cypher, listEvents } from "./api.js";
import { el, eventLink, field, fill, heading, kindBadge, kindClass, problem, svg, table } from "./dom.js";
import { clip, fromInput, plural, stateOf, when } from "./format.js";

const SUPERSEDED_BY = `MATCH (old:Event)<-[:SUPERSEDES]-(new:Event) WHERE old.event_id IN $ids
RETURN old.event_id, new.event_id`;
const PROPERTY_NAME = /^[A-Za-z][A-Za-z0-9_]*$/;

// Kept while the tab lives, so coming back from an event finds the same filters and page.
const state = { filters: null, cursors: [null], page: 0 };

export function renderTimeline(view, ctx) {
  const f = state.filters || { kind: "", since: "", until: "", props: [], all: true, limit: "50" };
  const kind = el("input", { id: "tl-kind", name: "kind", type: "text", value: f.kind, list: "tl-kinds", spellcheck: "false" });
  const since = el("input", { id: "tl-since", name: "since", type: "datetime-local", step: "1", value: f.since });
  const until = el("input", { id: "tl-until", name: "until", type: "datetime-local", step: "1", value: f.until });
  const all = el("input", { id: "tl-all", name: "all", type: "checkbox", checked: f.all });
  const limit = el("select", { id: "tl-limit", name: "limit" },
    ["5", "20", "50", "100", "500"].map((n) => el("option", { value: n, selected: n === f.limit }, n)));
  const props = el("div", { class: "props", id: "tl-props" });
  let propCount = 0;
  const addProp = (name = "", value = "") => {
    propCount += 1;
    const n = el("input", { id: `tl-prop-name-${propCount}`, type: "text", value: name, spellcheck: "false", class: "prop-name" });
    const v = el("input", { id: `tl-prop-value-${propCount}`, type: "text", value, spellcheck: "false", class: "prop-value" });
    const row = el("div", { class: "prop-row" },
      field("Property", n), field("equals", v),
      el("button", { type: "button", class: "quiet", "aria-label": "Remove this property filter", on: { click: () => row.remove() } }, "Remove"));
    props.append(row);
    return n;
  };
  f.props.forEach(([n, v]) => addProp(n, v));
  const results = el("div", { id: "tl-results", "aria-live": "polite" });
  const form = el("form", { id: "tl-form", class: "filters", "aria-label": "Filter the time line" },
    el("div", { class: "row" },
      field("Kind", kind, "turn, tool_call, fact, …"),
      field("From (UTC)", since),
      field("Until (UTC, excluded)", until),
      field("Page size", limit)),
    props,
    el("div", { class: "row" },
      el("button", { type: "button", class: "quiet", id: "tl-add-prop", on: { click: () => addProp().focus() } }, "Add a property filter"),
      el("div", { class: "check" }, all, el("label", { for: "tl-all" }, "Include superseded and expired events")),
      el("button", { type: "submit", class: "primary", id: "tl-apply" }, "Apply")),
    el("datalist", { id: "tl-kinds" }, ["turn", "tool_call", "fact"].map((k) => el("option", { value: k }))));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.filters = {
      kind: kind.value.trim(), since: since.value, until: until.value, all: all.checked, limit: limit.value,
      props: [...props.querySelectorAll(".prop-row")].map((r) => [r.querySelector(".prop-name").value.trim(), r.querySelector(".prop-value").value]),
    };
    state.cursors = [null];
    state.page = 0;
    load(results);
  });
  state.filters = state.filters || f;
  fill(view, heading("Time line"), el("p", { class: "lede" }, "The tenant's events, newest first. Open one to see its provenance."), form, results);
  return load(results);
}

function params() {
  const f = state.filters;
  const out = { limit: f.limit, kind: f.kind, current: f.all ? "false" : undefined, cursor: state.cursors[state.page] };
  const since = fromInput(f.since);
  const until = fromInput(f.until);
  if (since !== null) out.since = since;
  if (until !== null) out.until = until;
  for (const [name, value] of f.props) {
    if (!name) continue;
    if (!PROPERTY_NAME.test(name)) throw new Error(`"${name}" cannot be a filterable property: letters, digits and underscores, starting with a letter`);
    out[`prop.${name}`] = value;
  }
  return out;
}

async function load(results) {
  fill(results, el("p", { class: "loading" }, "Loading events…"));
  let page;
  const supersededBy = new Map();
  let unknown = null;
  try {
    page = await listEvents(params());
  } catch (err) {
    fill(results, problem(err, "The time line could not be read"));
    return;
  }
  const ids = page.events.map((e) => e.event_id);
  try {
    if (ids.length) {
      for (const [old, by] of (await cypher(SUPERSEDED_BY, { ids })).rows) {
        supersededBy.set(old, [...(supersededBy.get(old) || []), by]);
      }
    }
  } catch (err) {
    unknown = problem(err, "Which events are superseded could not be read, so the states shown ignore supersession");
  }
  const rows = page.events.map((e) => {
    const st = stateOf(e, supersededBy.get(e.event_id));
    return {
      attrs: { "data-event-id": e.event_id, class: `row-${st.replace(/ /g, "-")}` },
      cells: [
        eventLink(e.event_id, when(e.ts)),
        kindBadge(e.kind),
        el("span", { class: `state state-${st.replace(/ /g, "-")}` }, st),
        el("span", { class: "text-cell" }, clip(e.text, 160)),
        propertySummary(e.properties),
      ],
    };
  });
  const pager = el("div", { class: "pager" },
    el("button", { type: "button", id: "tl-newer", disabled: state.page === 0, on: { click: () => { state.page -= 1; load(results); } } }, "← Newer"),
    el("span", { "aria-live": "polite" }, `Page ${state.page + 1}`),
    el("button", { type: "button", id: "tl-older", disabled: !page.next_cursor, on: { click: () => {
      state.cursors[state.page + 1] = page.next_cursor;
      state.page += 1;
      load(results);
    } } }, "Older →"));
  fill(results,
    unknown,
    page.events.length ? strip(page.events) : null,
    table(`${plural(page.events.length, "event")} on this page`, ["When", "Kind", "State", "Text", "Properties"], rows, { class: "events", id: "tl-table" }),
    page.events.length ? null : el("p", null, "No events match these filters."),
    pager);
}

function propertySummary(properties) {
  const entries = Object.entries(properties || {}).filter(([name]) => name !== "source_event_ids");
  const links = Array.isArray(properties && properties.source_event_ids) ? properties.source_event_ids.length : 0;
  return el("span", { class: "chips" },
    entries.slice(0, 4).map(([name, value]) => el("span", { class: "chip" }, `${name}=${clip(typeof value === "string" ? value : JSON.stringify(value), 40)}`)),
    entries.length > 4 ? el("span", { class: "chip" }, `+${entries.length - 4}`) : null,
    links ? el("span", { class: "chip chip-links" }, `${plural(links, "source")}`) : null);
}

// A strip of dots, one per event of the page, placed by time: the rhythm of the page at a
// glance. The table beside it says the same in words, so the strip is hidden from readers.
function strip(events) {
  const lo = Math.min(...events.map((e) => e.ts));
  const hi = Math.max(...events.map((e) => e.ts));
  const span = Math.max(1, hi - lo);
  const root = svg("svg", { class: "strip", viewBox: "0 0 1000 44", width: "100%", height: "44", "aria-hidden": "true", focusable: "false" });
  root.append(svg("line", { x1: "10", y1: "30", x2: "990", y2: "30", class: "axis" }));
  for (const e of events) {
    const x = 10 + ((e.ts - lo) / span) * 980;
    root.append(svg("circle", { cx: x.toFixed(1), cy: "30", r: "6", class: `dot ${kindClass(e.kind)}` }, svg("title", null, `${e.kind} ${when(e.ts)}`)));
  }
  root.append(svg("text", { x: "10", y: "14", class: "strip-label" }, when(lo)));
  root.append(svg("text", { x: "990", y: "14", class: "strip-label", "text-anchor": "end" }, when(hi)));
  return root;
}

// Building the page: every string becomes a text node or an attribute value set one by one, so
// customer data (event texts, properties, kinds) can never be parsed as markup: no string is ever
// handed to the HTML parser.

const SVG_NS = "http://www.w3.org/2000/svg";
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

// Attributes a caller may set; anything else (on*, style, src, href from data) is refused.
const ALLOWED = new Set([
  "id", "class", "type", "name", "value", "for", "role", "tabindex", "title", "placeholder",
  "min", "max", "step", "rows", "cols", "autocomplete", "spellcheck", "required", "disabled",
  "checked", "selected", "hidden", "colspan", "scope", "list", "lang", "download",
  "x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r", "rx", "ry", "width", "height", "d",
  "viewBox", "points", "transform", "marker-end", "refX", "refY", "orient", "markerWidth",
  "markerHeight", "markerUnits", "focusable", "text-anchor", "dominant-baseline",
]);

function setAttributes(node, attrs) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "on") {
      for (const [event, handler] of Object.entries(value)) node.addEventListener(event, handler);
    } else if (name === "href") {
      node.setAttribute("href", checkedHref(value));
    } else if (name.startsWith("aria-") || name.startsWith("data-") || ALLOWED.has(name)) {
      node.setAttribute(name, value === true ? "" : String(value));
    } else {
      throw new Error(`attribute ${name} is not allowed`);
    }
  }
}

// Links go to the console's own pages (#/...) or to a blob made here (a CSV download).
function checkedHref(value) {
  const href = String(value);
  if (href.startsWith("#/") || href.startsWith("blob:")) return href;
  throw new Error("only console links are allowed");
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** An HTML element: el("p", {class: "x"}, "text", otherNode). */
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  setAttributes(node, attrs);
  return append(node, children);
}

/** An SVG element, same rules. */
export function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttributes(node, attrs);
  return append(node, children);
}

/** Replace a node's children. */
export function fill(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

/** Whether a value is an event id (a canonical UUID), the only data ever put into a link. */
export function isEventId(value) {
  return typeof value === "string" && UUID.test(value);
}

/** A link to an event's page, or the id as text when it is not an id. */
export function eventLink(id, label) {
  if (!isEventId(id)) return el("span", { class: "mono" }, String(id));
  return el("a", { href: `#/event/${id}`, class: "mono" }, label || shortId(id));
}

export function shortId(id) {
  return String(id).slice(0, 8);
}

/** A CSS class for a kind: the seed's three kinds have colours, any other kind is "other". */
export function kindClass(kind) {
  return { turn: "kind-turn", tool_call: "kind-tool", fact: "kind-fact" }[kind] || "kind-other";
}

export function kindBadge(kind) {
  return el("span", { class: `badge ${kindClass(kind)}` }, kind);
}

/** A labelled form field. */
export function field(label, input, hint) {
  const hintNode = hint ? el("span", { class: "hint", id: `${input.id}-hint` }, hint) : null;
  if (hintNode) input.setAttribute("aria-describedby", hintNode.id);
  return el("div", { class: "field" }, el("label", { for: input.id }, label), input, hintNode);
}

/** A table in a scrolling region (keyboard-scrollable, named for screen readers). */
export function table(caption, headers, rows, attrs) {
  const head = el("tr", null, headers.map((h) => el("th", { scope: "col" }, h)));
  const body = rows.map((row) => {
    const { attrs: rowAttrs, cells } = Array.isArray(row) ? { attrs: null, cells: row } : row;
    return el("tr", rowAttrs, cells.map((c) => el("td", null, c)));
  });
  const t = el("table", attrs, el("caption", null, caption), el("thead", null, head), el("tbody", null, body));
  return el("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": caption }, t);
}

/** An error answer as a sentence the reader can act on (role=alert: read out at once). */
export function problem(err, doing) {
  const detail = err && err.detail ? err.detail : String(err && err.message ? err.message : err);
  const code = err && err.code ? ` (${err.status} ${err.code})` : "";
  return el("p", { class: "error", role: "alert" }, `${doing ? doing + ": " : ""}${detail}${code}`);
}

/** A page's heading, focusable so the router can move focus to it. */
export function heading(text) {
  return el("h1", { tabindex: "-1" }, text);
}

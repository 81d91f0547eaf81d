// Cypher: an editor with example audit queries, the rows as a table, a syntax error pointed at
// by line and column in the query, and the rows as a CSV download.

import { cypher } from "./api.js";
import { el, eventLink, fill, heading, isEventId, problem, table } from "./dom.js";
import { EXAMPLES } from "./queries.js";

const POSITION = /\(line (\d+), column (\d+)\)/;
let draft = { query: EXAMPLES[0].query, params: JSON.stringify(EXAMPLES[0].params), example: "0" };

export function renderCypher(view, ctx) {
  const examples = el("select", { id: "cy-example", name: "example" },
    EXAMPLES.map((ex, i) => el("option", { value: String(i), selected: String(i) === draft.example }, ex.title)));
  const editor = el("textarea", { id: "cy-query", name: "query", rows: "8", spellcheck: "false", class: "code", "aria-describedby": "cy-where" }, draft.query);
  const params = el("textarea", { id: "cy-params", name: "params", rows: "4", spellcheck: "false", class: "code" }, draft.params);
  const where = el("span", { id: "cy-where", class: "hint" }, "line 1, column 1");
  const results = el("div", { id: "cy-results", "aria-live": "polite" });
  const caret = () => {
    const before = editor.value.slice(0, editor.selectionStart).split("\n");
    fill(where, `line ${before.length}, column ${before[before.length - 1].length + 1} · Ctrl+Enter runs the query`);
  };
  ["keyup", "click", "focus", "select"].forEach((name) => editor.addEventListener(name, caret));
  examples.addEventListener("change", () => {
    const ex = EXAMPLES[Number(examples.value)];
    editor.value = ex.query;
    params.value = JSON.stringify(ex.params);
    draft = { query: editor.value, params: params.value, example: examples.value };
    fill(results);
  });
  const run = async () => {
    draft = { query: editor.value, params: params.value, example: examples.value };
    let values;
    try {
      values = params.value.trim() ? JSON.parse(params.value) : {};
      if (values === null || typeof values !== "object" || Array.isArray(values)) throw new Error("not an object");
    } catch (err) {
      fill(results, el("p", { class: "error", role: "alert" }, "Parameters must be a JSON object, such as {\"supplier\": \"SUP-2207\"}."));
      return;
    }
    fill(results, el("p", { class: "loading" }, "Running…"));
    try {
      fill(results, rowsView(await cypher(editor.value, values)));
    } catch (err) {
      fill(results, errorView(err, editor));
    }
  };
  editor.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) {
      ev.preventDefault();
      run();
    }
  });
  const form = el("form", { id: "cy-form", "aria-label": "Cypher query" },
    el("div", { class: "field" }, el("label", { for: "cy-example" }, "Example queries"), examples),
    el("div", { class: "field" }, el("label", { for: "cy-query" }, "Query (read-only: MATCH, WITH, RETURN)"), editor, where),
    el("div", { class: "field" }, el("label", { for: "cy-params" }, "Parameters (JSON object, used as $name)"), params),
    el("button", { type: "submit", class: "primary", id: "cy-run" }, "Run"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    run();
  });
  fill(view, heading("Cypher"),
    el("p", { class: "lede" }, "Events are (:Event) nodes; [:SOURCE_FROM] goes from an event to each of its sources, [:SUPERSEDES] to the version it replaces."),
    form, results);
}

function cell(value) {
  if (value === null || value === undefined) return el("span", { class: "none" }, "null");
  if (isEventId(value)) return eventLink(value, value);
  if (typeof value === "object") return el("code", null, JSON.stringify(value));
  return String(value);
}

function rowsView(result) {
  const download = el("a", { class: "button", id: "cy-csv", download: "memspine-query.csv", href: csvUrl(result) }, "Download CSV");
  return [
    el("p", { id: "cy-count" }, `${result.rows.length} row${result.rows.length === 1 ? "" : "s"}. `, download),
    table("Query results", result.columns, result.rows.map((row) => row.map(cell)), { id: "cy-table" }),
  ];
}

function errorView(err, editor) {
  const m = POSITION.exec(err.detail || "");
  const message = (err.detail || String(err)).split("\n")[0];
  if (!m) return problem({ ...err, detail: message }, "The query failed");
  const line = Number(m[1]);
  const col = Number(m[2]);
  const lines = editor.value.split("\n");
  const offset = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0) + col - 1;
  editor.focus();
  editor.setSelectionRange(offset, Math.min(offset + 1, editor.value.length));
  const listing = el("pre", { class: "listing", id: "cy-error-listing", "aria-label": `The query, with line ${line} column ${col} marked` },
    lines.map((text, i) => {
      const here = i + 1 === line;
      return [
        el("span", { class: here ? "ln ln-error" : "ln" }, `${String(i + 1).padStart(3)}  `),
        el("span", { class: here ? "src src-error" : "src" }, text), "\n",
        here ? [el("span", { class: "ln" }, "     "), el("span", { class: "caret", "data-line": line, "data-col": col }, " ".repeat(col - 1) + "^"), "\n"] : null,
      ];
    }));
  return [el("p", { class: "error", role: "alert", id: "cy-error" }, `${message}`), listing];
}

/** RFC 4180 CSV; a text cell that a spreadsheet would run as a formula gets a leading '. */
export function toCsv(result) {
  const quote = (value) => {
    let text = value === null || value === undefined ? "" : typeof value === "object" ? JSON.stringify(value) : String(value);
    if (typeof value === "string" && /^[=+\-@\t\r]/.test(text)) text = "'" + text;
    return /[",\r\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
  };
  return [result.columns, ...result.rows].map((row) => row.map(quote).join(",")).join("\r\n") + "\r\n";
}

function csvUrl(result) {
  return URL.createObjectURL(new Blob([toCsv(result)], { type: "text/csv;charset=utf-8" }));
}

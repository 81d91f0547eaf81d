// The tenant's retention and legal holds (GET /v1/memory/retention): the windows in force, the
// oldest event, what comes due now and within 7 days, the last retention run, and the holds
// that stop every deletion of what they keep. The operator sets them (docs/erasure.md); this
// page only shows them.

import { tenantRetention } from "./api.js";
import { el, fill, heading, problem, table } from "./dom.js";
import { plural, when } from "./format.js";

export async function renderRetention(view) {
  const out = el("div", { id: "rt-answer", "aria-live": "polite" }, el("p", { class: "loading" }, "Reading the tenant's retention…"));
  fill(view, heading("Retention and holds"),
    el("p", { class: "lede" }, "How long this tenant's events are kept, what comes due, and the legal holds that keep them past their window."),
    out);
  let shown;
  try {
    shown = await tenantRetention();
  } catch (err) {
    fill(out, problem(err, "The retention could not be read"));
    return;
  }
  const state = shown.retention_state;
  fill(out, windows(shown.retention, state), outlook(state), lastRun(state.last_run), holds(shown.holds));
}

function windows(own, state) {
  const kinds = Object.keys(state.in_force).sort((a, b) => (a === "*") - (b === "*") || a.localeCompare(b));
  const rows = kinds.map((kind) => ({
    attrs: { "data-kind": kind },
    cells: [
      kind === "*" ? el("span", null, "every other kind (", el("span", { class: "mono" }, "*"), ")") : el("span", { class: "mono" }, kind),
      plural(state.in_force[kind], "day"),
      own && kind in own ? "this tenant's" : "the server's default",
    ],
  }));
  return el("section", { id: "rt-windows", "aria-labelledby": "rt-windows-h" },
    el("h2", { id: "rt-windows-h" }, "Windows in force"),
    rows.length
      ? table("Retention windows", ["Kind", "Kept for", "Set by"], rows, { id: "rt-window-table" })
      : el("p", { class: "note", id: "rt-no-window" }, "No window: events are kept until they are deleted."));
}

function outlook(state) {
  const dl = el("dl", { class: "pairs", id: "rt-outlook" },
    el("dt", null, "Oldest event"), el("dd", { "data-testid": "rt-oldest" }, state.oldest_event === null ? "none" : when(state.oldest_event)),
    el("dt", null, "Due now"), el("dd", { "data-testid": "rt-due-now" }, plural(state.due_now, "event")),
    el("dt", null, "Due within 7 days"), el("dd", { "data-testid": "rt-due-soon" }, plural(state.due_next_7_days, "event")));
  return el("section", { "aria-labelledby": "rt-outlook-h" }, el("h2", { id: "rt-outlook-h" }, "What comes due"), dl,
    el("p", { class: "note" }, "Counts include events a hold keeps: a retention run skips them."));
}

function lastRun(run) {
  const body = run === null
    ? el("p", { class: "note", id: "rt-no-run" }, "No retention run has deleted anything yet.")
    : el("dl", { class: "pairs", id: "rt-last-run" },
      el("dt", null, "Finished"), el("dd", null, when(run.finished_at)),
      el("dt", null, "Deleted"), el("dd", { "data-testid": "rt-deleted" }, plural(run.deleted, "event")),
      el("dt", null, "Kept by a hold"), el("dd", { "data-testid": "rt-held" }, plural(run.held, "event")),
      el("dt", null, "Purged"), el("dd", null, run.purge_pending ? `${plural(run.purged, "event")} (purge pending)` : plural(run.purged, "event")),
      el("dt", null, "Receipt"), el("dd", { class: "mono" }, run.receipt_id));
  return el("section", { "aria-labelledby": "rt-run-h" }, el("h2", { id: "rt-run-h" }, "Last retention run"), body);
}

function holds(list) {
  const rows = list.map((h) => ({
    attrs: { "data-hold-id": h.hold_id },
    cells: [
      el("span", { class: "mono" }, h.hold_id),
      h.subject === null ? "the whole tenant" : el("span", null, "subject ", el("span", { class: "mono" }, h.subject)),
      h.reason, when(h.placed_at), h.placed_by,
    ],
  }));
  return el("section", { id: "rt-holds", "aria-labelledby": "rt-holds-h" },
    el("h2", { id: "rt-holds-h" }, "Legal holds"),
    rows.length
      ? [el("p", null, `${plural(rows.length, "hold")} standing: no retention run, erasure or delete removes what they keep.`),
        table("Legal holds, oldest first", ["Hold", "On", "Reason", "Placed", "By"], rows, { id: "rt-hold-table" })]
      : el("p", { class: "note", id: "rt-no-hold" }, "No legal hold stands."));
}

// Erasure by subject, for a write key: the dry run as a list a person reviews (events found by
// an identifier only are erased only when ticked), then the real run and its signed receipt;
// below, the receipts kept for this tenant.

import { eraseSubject, receipts } from "./api.js";
import { el, eventLink, field, fill, heading, kindBadge, problem, table } from "./dom.js";
import { plural, when } from "./format.js";

export function renderSubject(view, ctx) {
  const subject = el("input", { id: "sj-subject", name: "subject", type: "text", spellcheck: "false", required: true });
  const idents = el("textarea", { id: "sj-identifiers", name: "identifiers", rows: "3", spellcheck: "false" });
  const cascade = el("input", { id: "sj-cascade", type: "checkbox", checked: true });
  const out = el("div", { id: "sj-answer", "aria-live": "polite" });
  const kept = el("div", { id: "sj-receipts" });
  const form = el("form", { id: "sj-form", class: "filters", "aria-label": "Erasure by subject" },
    field("Subject", subject, "The id the application tags events with (subjects)"),
    field("Identifiers (one a line, optional)", idents, "A name, an email, an order number: events naming them are listed for you to confirm"),
    el("div", { class: "row" },
      el("div", { class: "check" }, cascade, el("label", { for: "sj-cascade" }, "With every event derived from them (cascade=derived)")),
      el("button", { type: "submit", class: "warn", id: "sj-preview" }, "Preview the erasure (dry run)")));
  const request = () => ({
    identifiers: idents.value.split("\n").map((s) => s.trim()).filter(Boolean),
    cascade: cascade.checked ? "derived" : "none",
  });
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    fill(out, el("p", { class: "loading" }, "Asking the server what would be erased…"));
    let plan;
    try {
      plan = (await eraseSubject(subject.value, request())).body;
    } catch (err) {
      fill(out, problem(err, "The dry run failed"));
      return;
    }
    drawPlan(out, subject.value, request(), plan, () => listReceipts(kept));
  });
  fill(view, heading("Erase a data subject"),
    el("p", null, "Everything about one person, in one request: nothing is erased until you confirm, and the answer is a receipt signed by the server."),
    ctx.session.canWrite() ? form : el("p", { class: "note" }, "This key cannot write: it may read the receipts below."),
    out, kept);
  listReceipts(kept);
}

function drawPlan(out, subject, req, plan, after) {
  const boxes = new Map();
  const rows = plan.events.map((e) => {
    const onlyIdentifier = e.reasons.length === 1 && e.reasons[0] === "identifier";
    const box = el("input", {
      type: "checkbox", id: `sj-confirm-${e.event_id}`, checked: !onlyIdentifier, disabled: !onlyIdentifier,
      "aria-label": onlyIdentifier ? `Erase ${e.event_id} (found by an identifier)` : `${e.event_id} goes (${e.reasons.join(", ")})`,
    });
    if (onlyIdentifier) boxes.set(e.event_id, box);
    return [box, kindBadge(e.kind), eventLink(e.event_id, e.event_id), e.reasons.join(", "), when(e.ts)];
  });
  const go = el("button", { type: "button", class: "danger", id: "sj-erase" }, "Erase and purge");
  go.addEventListener("click", async () => {
    const confirm = [...boxes].filter(([, box]) => box.checked).map(([id]) => id);
    fill(out, el("p", { class: "loading" }, "Erasing, purging and scanning…"));
    let done;
    try {
      done = (await eraseSubject(subject, { ...req, dry_run: false, confirm_ids: confirm })).body;
    } catch (err) {
      fill(out, problem(err, "The erasure failed"));
      return;
    }
    drawReceipt(out, done);
    after();
  });
  fill(out,
    el("p", { id: "sj-plan" }, `Nothing was erased. ${plural(plan.count, "event")} would go. ` +
      "Events found only by an identifier go only if ticked."),
    plan.count ? table("What the erasure would reach", ["Erase", "Kind", "Event", "Why", "When"], rows, { id: "sj-events" }) : null,
    plan.count ? go : null);
}

function drawReceipt(out, done) {
  const r = done.receipt.receipt;
  fill(out,
    el("p", { id: "sj-result", role: "status" },
      `Erased ${plural(done.deleted_ids.length, "event")}; receipt ${done.receipt_id}. ` +
      (r.clean ? "The scan after the purge found none of them, and no identifier, in the tenant's files." :
        "The scan after the purge still found some of them: see the receipt.")),
    el("pre", { id: "sj-receipt", class: "mono" }, JSON.stringify(done.receipt, null, 2)),
    el("p", null, `Check it: save it as a file, then memspine-admin receipt verify FILE. Copies made before it: ${r.copies_before.length}.`));
}

async function listReceipts(node) {
  let list;
  try {
    list = (await receipts()).body.receipts;
  } catch (err) {
    fill(node, problem(err, "The receipts could not be read"));
    return;
  }
  fill(node, el("h2", null, "Receipts"),
    list.length ? table("Erasure receipts, newest first", ["Receipt", "When", "Events", "Scan"],
      list.map((r) => [el("span", { class: "mono" }, r.receipt_id), when(r.completed_at), String(r.event_ids.length), r.clean ? "clean" : "found"]),
      { id: "sj-receipt-list" }) : el("p", { class: "note" }, "No erasure by subject yet."));
}

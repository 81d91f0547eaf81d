// Erasure, for a write key: first the dry run (DELETE ?dry_run=true, with cascade=derived if
// chosen) drawn on the graph, then the delete with purge and the server's answer in words.

import { deleteEvent } from "./api.js";
import { el, eventLink, fill, kindBadge, problem } from "./dom.js";
import { clip, plural } from "./format.js";

export function renderErasure(event, { mark, graph }) {
  const cascade = el("input", { id: "erase-cascade", type: "checkbox", checked: true });
  const out = el("div", { id: "erase-answer", "aria-live": "polite" });
  const preview = el("button", { type: "button", id: "erase-preview", class: "warn" }, "Preview the erasure (dry run)");
  let planned = null;
  preview.addEventListener("click", async () => {
    fill(out, el("p", { class: "loading" }, "Asking the server what would be deleted…"));
    try {
      const { body } = await deleteEvent(event.event_id, { cascade: cascade.checked, dryRun: true });
      planned = { ids: body.would_delete, cascade: cascade.checked };
    } catch (err) {
      fill(out, problem(err, "The dry run failed"));
      return;
    }
    mark(new Map(planned.ids.map((id) => [id, "doomed"])));
    const drawn = graph() ? planned.ids.filter((id) => graph().nodes.has(id)).length : 0;
    const beyond = planned.ids.length - drawn;
    const confirm = el("button", { type: "button", id: "erase-confirm", class: "danger" },
      `Delete ${plural(planned.ids.length, "event")} and purge`);
    confirm.addEventListener("click", () => erase(event, planned, out, mark));
    fill(out,
      el("p", { id: "erase-plan" },
        `Nothing was deleted. A delete${planned.cascade ? " with cascade=derived" : ""} would take ${plural(planned.ids.length, "event")}: ` +
        (planned.cascade ? "this one and every event derived from it, transitively" : "this one alone; events derived from it stay, with their link to it gone") +
        `. ${drawn} of them are marked on the graph` + (beyond ? `; ${beyond} lie beyond the hops drawn.` : ".")),
      el("ul", { class: "links", id: "erase-ids" }, planned.ids.map((id) => {
        const n = graph() && graph().nodes.get(id);
        return el("li", null, n ? [kindBadge(n.kind), " "] : null, eventLink(id, id), n ? ` ${clip(n.text, 100)}` : el("span", { class: "note" }, " (beyond the hops drawn)"));
      })),
      el("p", null, "Purge makes the request wait until their bytes have left the tenant's files on disk."),
      confirm);
  });
  cascade.addEventListener("change", () => {
    planned = null;
    mark(new Map());
    fill(out);
  });
  return el("section", { "aria-labelledby": "erase-title", class: "erase", id: "erase" },
    el("h2", { id: "erase-title" }, "Erase"),
    el("p", null, "Deleting is for good: the event becomes unreadable at once and, with purge, its bytes leave the disk before the answer."),
    el("div", { class: "row" },
      el("div", { class: "check" }, cascade, el("label", { for: "erase-cascade" }, "With every event derived from it (cascade=derived)")),
      preview),
    out);
}

async function erase(event, planned, out, mark) {
  fill(out, el("p", { class: "loading" }, "Deleting and purging…"));
  let answer;
  try {
    answer = await deleteEvent(event.event_id, { cascade: planned.cascade, purge: true });
  } catch (err) {
    fill(out, problem(err, "The delete failed"));
    return;
  }
  const body = answer.body;
  const ids = body.deleted_ids || [];
  mark(new Map(ids.map((id) => [id, "deleted"])));
  const changed = ids.length !== planned.ids.length || ids.some((id, i) => id !== planned.ids[i]);
  fill(out,
    el("p", { id: "erase-result", role: "status" },
      `Deleted ${plural(ids.length, "event")}. ` +
      (body.purged ? "Purged: their bytes have left the tenant's files." :
        body.purge_pending ? `The purge is pending (HTTP ${answer.status}): ${body.detail || ""} The background purger finishes it.` :
          "Not purged yet: the background purge removes the bytes within its interval.") +
      (changed ? " The set differs from the dry run: events were linked or deleted in between." : "")),
    el("ul", { class: "links" }, ids.map((id) => el("li", { class: "mono" }, id))),
    el("p", null, el("a", { href: "#/timeline" }, "Back to the time line")));
}

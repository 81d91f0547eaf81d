// The auditor's page, for a key with the audit scope: for an event, who read it; for a key, what
// it read (GET /v1/memory/audit/reads, oldest first, paged with next_cursor). Event ids link to
// their pages only when the signed-in key may read events: an audit-only key sees ids.

import { auditReads } from "./api.js";
import { el, eventLink, field, fill, heading, isEventId, problem, table } from "./dom.js";
import { plural, when } from "./format.js";

const KEY_ID = /^[A-Za-z0-9_-]{1,64}$/;
const PAGE_SIZE = 50;

/** The console path of the auditor's page for an event or a key. */
export function auditHash(by, value) {
  return `#/audit/${by}/${encodeURIComponent(value)}`;
}

export function renderAudit(view, ctx, arg) {
  const [by, raw] = (arg || "").split("/");
  const value = raw ? decodeURIComponent(raw) : "";
  const eventId = el("input", { id: "au-event", name: "event_id", type: "text", spellcheck: "false", value: by === "event" ? value : "" });
  const keyId = el("input", { id: "au-key", name: "key_id", type: "text", spellcheck: "false", value: by === "key" ? value : "" });
  const out = el("div", { id: "au-answer", "aria-live": "polite" });
  const form = el("form", { id: "au-form", class: "filters", "aria-label": "Read records" },
    el("div", { class: "row" },
      field("Event id", eventId, "Who read this event"),
      field("Key id", keyId, "What this key read (its id, never its secret)"),
      el("button", { type: "submit", class: "primary", id: "au-run" }, "Show the reads")));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const e = eventId.value.trim().toLowerCase();
    const k = keyId.value.trim();
    if (e && !isEventId(e)) return fill(out, el("p", { class: "error", role: "alert" }, "That is not an event id."));
    if (k && !KEY_ID.test(k)) return fill(out, el("p", { class: "error", role: "alert" }, "That is not a key id."));
    const hash = e && !k ? auditHash("event", e) : k && !e ? auditHash("key", k) : null;
    if (hash && location.hash !== hash) return ctx.go(hash); // a link to this page then holds the question
    load(out, ctx, { event_id: e, key_id: k });
  });
  fill(view, heading("Who read what"),
    el("p", { class: "lede" }, "Every read of this tenant's events is recorded: when, by which key, through which door and route, and for what purpose. Ask by event or by key."),
    form, out);
  if (by === "event" && isEventId(value)) load(out, ctx, { event_id: value });
  else if (by === "key" && KEY_ID.test(value)) load(out, ctx, { key_id: value });
}

async function load(out, ctx, filter) {
  const canRead = ctx.session.canRead();
  const rows = [];
  const body = el("div", { id: "au-results" });
  const more = el("button", { type: "button", id: "au-more" }, "Later reads (next page)");
  const moreBox = el("div", { class: "row" });
  const count = el("p", { id: "au-count", role: "status" });
  let cursor = null;
  const next = async () => {
    more.disabled = true;
    let page;
    try {
      page = await auditReads({ ...filter, cursor, limit: PAGE_SIZE });
    } catch (err) {
      fill(body, problem(err, "The read records could not be read"));
      return;
    }
    rows.push(...page.reads.map((r) => row(r, filter, canRead)));
    cursor = page.next_cursor;
    fill(moreBox, cursor === null ? null : more); // the button's own style would show it hidden
    more.disabled = false;
    const what = filter.event_id ? `event ${filter.event_id}` : filter.key_id ? `key ${filter.key_id}` : "this tenant";
    fill(count, `${plural(rows.length, "read")} of ${what}${cursor === null ? "" : " so far"}, oldest first.`);
    fill(body, rows.length
      ? table("Read records, oldest first", ["When", "Key", "Door", "Route", "Purpose", "Request", "Events"], rows, { id: "au-reads" })
      : el("p", { class: "note" }, "No read recorded."));
  };
  more.addEventListener("click", next);
  fill(out, el("p", { class: "loading" }, "Reading the records…"));
  await next();
  fill(out, count, body, moreBox,
    canRead ? null : el("p", { class: "note" }, "This key may read the records, not the events: their ids are shown without links."));
}

function row(r, filter, canRead) {
  const key = el("a", { href: auditHash("key", r.key_id), class: "mono", "data-testid": "au-key" }, r.key_id);
  const ids = filter.event_id ? [filter.event_id] : r.event_ids;
  const events = el("ul", { class: "links" }, ids.map((id) =>
    el("li", { "data-event-id": id }, canRead ? eventLink(id, id) : el("span", { class: "mono" }, id))));
  const others = filter.event_id && r.event_ids.length > 1 ? el("span", { class: "note" }, ` and ${plural(r.event_ids.length - 1, "other")}`) : null;
  return {
    attrs: { "data-request-id": r.request_id },
    cells: [
      when(r.ts), KEY_ID.test(r.key_id) ? key : el("span", { class: "mono" }, r.key_id), r.door,
      el("span", { class: "mono" }, r.route), r.purpose === null ? el("span", { class: "none" }, "none given") : r.purpose,
      el("span", { class: "mono" }, r.request_id), [events, others],
    ],
  };
}

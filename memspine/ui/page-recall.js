// Recall: POST /v1/memory/recall with explain, so each ranked hit shows its keyword rank, its
// vector rank, the other arms that ranked it (focus, time, replies: arm_ranks, named from the
// answer's focus) and the fused score side by side; walked events with the hit they came from;
// the walk report (reached, returned, omitted) in words.

import { recall } from "./api.js";
import { el, eventLink, field, fill, heading, kindBadge, problem, table } from "./dom.js";
import { clip, plural, when } from "./format.js";

const RRF_K = 60;
let last = { text: "", kind: "", k: "10", hops: "1", embedding: "", current: true };

export function renderRecall(view, ctx) {
  const text = el("textarea", { id: "rc-text", name: "text", rows: "2", spellcheck: "false" }, last.text);
  const kind = el("input", { id: "rc-kind", name: "kind", type: "text", value: last.kind, list: "rc-kinds", spellcheck: "false" });
  const k = el("input", { id: "rc-k", name: "k", type: "number", min: "1", max: "100", value: last.k });
  const hops = el("input", { id: "rc-hops", name: "hops", type: "number", min: "0", max: "3", value: last.hops });
  const embedding = el("input", { id: "rc-embedding", name: "embedding", type: "text", value: last.embedding, spellcheck: "false", placeholder: "[0.7, 0.4, 0.0, 0.6]" });
  const current = el("input", { id: "rc-current", type: "checkbox", checked: last.current });
  const results = el("div", { id: "rc-results", "aria-live": "polite" });
  const form = el("form", { id: "rc-form", class: "filters", "aria-label": "Recall" },
    field("Query text", text, "Words to find; with server-side embeddings the meaning arm ranks them too."),
    el("div", { class: "row" },
      field("Kind", kind, "Restricts the ranked hits"),
      field("k", k, "1–100 ranked hits"),
      field("Hops", hops, "0–3 over SOURCE_FROM"),
      field("Embedding (optional)", embedding, "A JSON array of the tenant's length")),
    el("div", { class: "row" },
      el("div", { class: "check" }, current, el("label", { for: "rc-current" }, "Current state only (superseded hits give way to their heads)")),
      el("button", { type: "submit", class: "primary", id: "rc-run" }, "Recall")),
    el("datalist", { id: "rc-kinds" }, ["turn", "tool_call", "fact"].map((v) => el("option", { value: v }))));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    last = { text: text.value, kind: kind.value.trim(), k: k.value, hops: hops.value, embedding: embedding.value.trim(), current: current.checked };
    const body = { k: Number(last.k), hops: Number(last.hops), explain: true };
    if (last.text.trim()) body.text = last.text;
    if (last.kind) body.kind = last.kind;
    if (!last.current) body.current = false;
    if (last.embedding) {
      try {
        body.embedding = JSON.parse(last.embedding);
      } catch (err) {
        fill(results, el("p", { class: "error", role: "alert" }, "The embedding is not a JSON array of numbers."));
        return;
      }
    }
    fill(results, el("p", { class: "loading" }, "Recalling…"));
    try {
      fill(results, answer(await recall(body), body));
    } catch (err) {
      fill(results, problem(err, "Recall failed"));
    }
  });
  fill(view, heading("Recall"),
    el("p", { class: "lede" }, "Rank the tenant's events by keyword and by vector, fused by reciprocal rank, then walk their links."),
    form, results);
  text.focus();
}

function scoreFrom(hit) {
  const others = Object.values(hit.arm_ranks || {});
  const parts = [hit.keyword_rank, hit.vector_rank, ...others].filter((r) => typeof r === "number").map((r) => `1/(${RRF_K}+${r})`);
  return parts.length ? parts.join(" + ") : "—";
}

// What an arm beyond the main two ranked, in words, from the arm's name and the answer's focus
// (what the server read the text to name): "keyword inside speaker Caroline".
function armWords(name, focus) {
  const [restriction, arm] = name.split(".");
  const person = focus && focus.people.length === 1 ? `${focus.people[0].property} ${focus.people[0].value}` : "the person named";
  const dates = focus && focus.dates.length ? focus.dates.map((d) => `${when(d.from)} – ${when(d.until)}`).join(", ") : "the dates named";
  switch (restriction) {
    case "person": return `${arm} inside ${person}`;
    case "dates": return `${arm} within ${dates}`;
    case "person_dates": return `${arm} inside ${person} within ${dates}`;
    case "time": return `${arm}, hits that say a time (the text asks when)`;
    case "replies": return "the reply to a question turn among the first hits";
    default: return name;
  }
}

function otherRanks(hit, focus) {
  const entries = Object.entries(hit.arm_ranks || {});
  if (!entries.length) return el("span", { class: "none", title: "no other arm returned it" }, "—");
  return el("ul", { class: "arms" }, entries.map(([name, r]) => el("li", { "data-arm": name }, `${r}: ${armWords(name, focus)}`)));
}

function rank(value) {
  return typeof value === "number" ? String(value) : el("span", { class: "none", title: "this arm did not return it" }, "—");
}

function answer(result, body) {
  const ranked = result.hits.filter((h) => h.via === undefined);
  const walked = result.hits.filter((h) => h.via !== undefined);
  const number = new Map(ranked.map((h, i) => [h.event_id, i + 1]));
  // The arms named are those that ranked a hit, as the answer says per hit (keyword_rank,
  // vector_rank), not those the request asked for: a text may rank by meaning alone.
  const ranks = (arm) => ranked.some((h) => typeof h[arm] === "number");
  const arms = [ranks("keyword_rank") ? "keyword (BM25)" : null, ranks("vector_rank") ? "vector (cosine)" : null].filter(Boolean);
  // Likewise the other arms named are those the answer says ranked a hit, in the server's words.
  const others = [...new Set(ranked.flatMap((h) => Object.keys(h.arm_ranks || {})))];
  const parts = [
    el("h2", null, "Ranked hits"),
    el("p", { id: "rc-summary" },
      `${plural(ranked.length, "ranked hit")} of at most ${body.k}` +
      (arms.length ? `, from the ${arms.join(" and the ")} arm${arms.length > 1 ? "s" : ""}` : "") +
      (others.length ? `; also ranked by ${others.map((n) => armWords(n, result.focus)).join("; ")}` : "") +
      `. Score = Σ 1/(${RRF_K} + rank) over the arms that returned the event.`),
    result.focus ? el("p", { id: "rc-focus" }, focusWords(result.focus)) : null,
    table("Ranked hits", ["#", "Kind", "Keyword rank", "Vector rank", "Other arms", "Fused score", "Score from", "Event", "Text"],
      ranked.map((h, i) => ({
        attrs: { "data-event-id": h.event_id },
        cells: [String(i + 1), kindBadge(h.kind), rank(h.keyword_rank), rank(h.vector_rank), otherRanks(h, result.focus), h.score.toFixed(4), scoreFrom(h),
          el("span", null, eventLink(h.event_id), h.replaces ? el("span", { class: "note" }, ` replaces ${h.replaces.map((r) => r.slice(0, 8)).join(", ")}`) : null),
          clip(h.text, 200)],
      })), { id: "rc-ranked" }),
  ];
  if (result.walk) {
    parts.push(
      el("h2", null, "Walked events"),
      el("p", { id: "rc-walk" }, walkReport(result.walk, body.hops, body.k)),
      walked.length
        ? table("Walked events", ["Reached from hit", "Hop", "Kind", "Event", "When", "Text"],
          walked.map((h) => ({
            attrs: { "data-event-id": h.event_id, "data-via": h.via },
            cells: [el("span", null, `#${number.get(h.via) || "?"} `, eventLink(h.via)), String(h.hop || ""), kindBadge(h.kind), eventLink(h.event_id), when(h.ts), clip(h.text, 200)],
          })), { id: "rc-walked" })
        : null);
    if (result.walk.omitted.length) {
      parts.push(el("p", null, "Left out by the allowance: "),
        el("ul", { class: "links", id: "rc-omitted" }, result.walk.omitted.map((id) => el("li", null, eventLink(id, id)))));
    }
  }
  if (result.withheld) {
    const w = result.withheld;
    parts.push(el("p", { id: "rc-withheld" },
      `Current state kept out events that would have ranked: ${w.superseded} superseded, ${w.expired} expired, ${w.not_yet_valid} not yet valid.`));
  }
  if (!result.hits.length) parts.push(el("p", null, "Nothing matched."));
  return parts;
}

// What the server read the text to name, as the answer's focus says.
function focusWords(focus) {
  const said = [];
  if (focus.people.length === 1) said.push(`names ${focus.people[0].property} ${focus.people[0].value} (the person arms rank inside them)`);
  else if (focus.people.length > 1) said.push(`names ${focus.people.map((p) => p.value).join(" and ")} (more than one person: no person arms)`);
  if (focus.dates.length) said.push(`names ${plural(focus.dates.length, "time window")}: ${focus.dates.map((d) => `${when(d.from)} – ${when(d.until)}`).join(", ")}`);
  if (focus.asks_when) said.push("asks when (the time arms keep the hits that say a time)");
  return `The text ${said.join("; ")}.`;
}

function walkReport(walk, hops, k) {
  const reach = `The walk over SOURCE_FROM links, ${plural(hops, "hop")} both ways from the hits, reached ${plural(walk.reached, "event")} beyond them`;
  const kept = `and returned ${walk.returned}`;
  const left = walk.omitted.length
    ? `; it left out ${walk.omitted.length}, because k = ${k} also bounds what the walk adds, one allowance shared by all hits.`
    : walk.reached ? ": nothing was left out." : ".";
  return `${reach} ${kept}${left}`;
}

// Sign in with a key: /v1/whoami says whose it is; only then is the key kept (this tab only).

import { ApiError, keepKey, whoami } from "./api.js";
import { el, fill, heading, problem } from "./dom.js";
import { when } from "./format.js";

export function renderSignIn(view, ctx) {
  const input = el("input", {
    id: "api-key", name: "api-key", type: "password", autocomplete: "off", spellcheck: "false", required: true,
    "aria-describedby": "api-key-hint",
  });
  const answer = el("div", { id: "signin-answer", "aria-live": "polite" });
  const form = el("form", { id: "signin-form", "aria-labelledby": "signin-title" },
    el("div", { class: "field" },
      el("label", { for: "api-key" }, "API key"),
      input,
      el("span", { class: "hint", id: "api-key-hint" },
        "An issued key (smk_live_…) or, on a server in local mode, the tenant id. It is kept in this " +
        "browser tab's session storage until you sign out or close the tab, and sent only to this server.")),
    el("button", { type: "submit", class: "primary" }, "Sign in"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const key = input.value.trim();
    if (!key) return;
    fill(answer, el("p", null, "Checking the key…"));
    try {
      const who = await whoami(key);
      keepKey(key);
      input.value = "";
      ctx.signedIn(who);
    } catch (err) {
      const text = err instanceof ApiError && err.status === 401
        ? "This key is not accepted: unknown, revoked or expired."
        : null;
      fill(answer, text ? el("p", { class: "error", role: "alert" }, text) : problem(err, "Sign-in failed"));
    }
  });
  const signedIn = ctx.session.who;
  const notice = ctx.session.notice;
  ctx.session.notice = null;
  fill(view,
    el("section", { class: "signin" },
      heading("Sign in"),
      notice ? el("p", { class: "error", role: "alert", id: "signin-notice" }, notice) : null,
      el("p", { id: "signin-title" }, "Read a tenant's memory with its API key: its events on a time line, the provenance of one event, recall and Cypher."),
      signedIn ? whoBlock(signedIn) : null,
      form,
      answer));
  if (!signedIn) input.focus();
}

function whoBlock(who) {
  const row = (term, value) => [el("dt", null, term), el("dd", null, value)];
  return el("div", { class: "card" },
    el("p", null, "You are signed in with this key:"),
    el("dl", { class: "pairs" },
      row("tenant", el("span", { class: "mono" }, who.tenant_id)),
      row("key id", el("span", { class: "mono" }, who.key_id)),
      row("scopes", who.scopes.join(", ")),
      row("expires", who.expires_at === null ? "never" : when(who.expires_at))),
    el("p", null, who.scopes.includes("write")
      ? "This key can write: event pages show erasure (a dry run first)."
      : "This key is read-only: the console shows no control that writes."));
}

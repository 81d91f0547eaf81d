// The console: a hash router over its pages. The key typed at sign-in is kept in this tab's
// sessionStorage; what it may do (whoami's scopes) decides which controls the pages draw.

import { ApiError, forgetKey, storedKey, whoami } from "./api.js";
import { el, fill } from "./dom.js";
import { when } from "./format.js";
import { renderAudit } from "./page-audit.js";
import { renderCypher } from "./page-cypher.js";
import { renderEvent } from "./page-event.js";
import { renderRecall } from "./page-recall.js";
import { renderRetention } from "./page-retention.js";
import { renderSignIn } from "./page-signin.js";
import { renderSubject } from "./page-subject.js";
import { renderTimeline } from "./page-timeline.js";

// [name, title, render, the scope a key needs to see it]
const PAGES = [
  ["timeline", "Time line", renderTimeline, "read"],
  ["recall", "Recall", renderRecall, "read"],
  ["cypher", "Cypher", renderCypher, "read"],
  ["subject", "Subjects", renderSubject, "read"],
  ["retention", "Retention", renderRetention, "read"],
  ["audit", "Who read what", renderAudit, "audit"],
];

const session = {
  who: null,
  has(scope) {
    return Boolean(this.who && this.who.scopes.includes(scope));
  },
  canWrite() {
    return this.has("write");
  },
  canRead() {
    return this.has("read");
  },
  canAudit() {
    return this.has("audit");
  },
  pages() {
    const mine = PAGES.filter((p) => this.has(p[3]));
    return mine.length ? mine : PAGES.slice(0, 1); // a key of neither scope sees the API's 403
  },
};

function route() {
  const hash = location.hash.startsWith("#/") ? location.hash.slice(2) : "";
  const [page, ...rest] = hash.split("/");
  return { page: page || "timeline", arg: rest.join("/") };
}

function drawHeader() {
  const nav = document.getElementById("nav");
  const who = document.getElementById("who");
  const { page } = route();
  if (!session.who) {
    nav.hidden = true;
    fill(who);
    return;
  }
  nav.hidden = false;
  fill(nav, el("ul", null, session.pages().map(([name, title]) =>
    el("li", null, el("a", { href: `#/${name}`, "aria-current": page === name ? "page" : undefined }, title)))));
  const expires = session.who.expires_at === null ? "never expires" : `expires ${when(session.who.expires_at)}`;
  fill(who,
    el("span", { class: "who-text", "data-testid": "who" },
      el("span", null, "tenant ", el("span", { class: "mono" }, session.who.tenant_id)),
      el("span", null, " · key ", el("span", { class: "mono" }, session.who.key_id)),
      el("span", { "data-testid": "scopes" }, ` · ${session.who.scopes.join(" + ")}`),
      el("span", null, ` · ${expires}`)),
    el("button", { type: "button", class: "quiet", id: "sign-out", on: { click: signOut } }, "Sign out"));
}

function go(hash) {
  if (location.hash === hash) render();
  else location.hash = hash; // hashchange renders
}

function signOut() {
  forgetKey();
  session.who = null;
  go("#/signin");
}

window.addEventListener("memspine:unauthorized", () => {
  if (!session.who) return;
  session.notice = "The server no longer accepts this key (revoked or expired): sign in again.";
  signOut();
});

async function render() {
  const main = document.getElementById("main");
  if (!session.who && storedKey()) {
    try {
      session.who = await whoami();
    } catch (err) {
      if (!(err instanceof ApiError) || err.status === 401) forgetKey();
    }
  }
  drawHeader();
  const { page, arg } = route();
  const ctx = { session, signedIn: onSignedIn, go };
  // Each page draws into a view of its own: a page still loading when another is opened
  // writes into a view that is no longer on screen.
  const view = el("div", { class: "view" });
  fill(main, view);
  if (!session.who || page === "signin") {
    document.title = "Sign in · memspine console";
    return renderSignIn(view, ctx);
  }
  if (page === "event" && arg) {
    document.title = "Event · memspine console";
    return renderEvent(view, ctx, arg);
  }
  const pages = session.pages();
  const found = pages.find(([name]) => name === page) || pages[0];
  document.title = `${found[1]} · memspine console`;
  return found[2](view, ctx, arg);
}

function onSignedIn(who) {
  session.who = who;
  go(`#/${session.pages()[0][0]}`);
}

window.addEventListener("hashchange", () => {
  render().then(() => {
    const heading = document.querySelector("main h1");
    if (heading) heading.focus({ preventScroll: false }); // a new page: say so to a screen reader
  });
});

document.getElementById("skip").addEventListener("click", (ev) => {
  ev.preventDefault(); // "#main" is not a route
  document.getElementById("main").focus();
});

render();

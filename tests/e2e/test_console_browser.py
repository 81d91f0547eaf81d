"""The web console in a real headless browser: Debian's chromium, driven by Playwright (no
browser of Playwright's own, nothing downloaded), against one real server holding the seed's
support case, supplier audit and project and a tenant of hostile events (tests/support/console_seed.py).

One server start and one browser for the module; each test opens a fresh browser context (its
own sessionStorage) and, on the way out, checks that nothing opened a dialog, threw, broke the
Content-Security-Policy or asked any host but the server. The screenshots in docs/console/ are
taken here: set CONSOLE_SCREENSHOTS=1 to write them there (else they go to a temporary folder).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.console_seed import ADMIN_KEY, HOSTILE_KIND, Seeded, start_seeded
from tests.support.erasure import scan

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
INSTALL = REPO / "scripts" / "install-browser"
# Without the networking flags Chromium keeps trying to reach Google's hosts, which this
# machine's closed network refuses; with them it asks nothing of anyone but the page.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-features=Translate,OptimizationHints,MediaRouter",
]
WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 844}
# Recorded in every page before its own scripts run: CSP violations and anything a hostile
# event might have managed to call.
WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => window.__csp.push(e.violatedDirective));
"""
CONTRAST = """() => {
  const rgb = (s) => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const background = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const bad = [];
  for (const el of document.querySelectorAll("body *")) {
    if (el.closest("svg") || el.disabled || !el.getClientRects().length) continue;
    const text = [...el.childNodes].filter((n) => n.nodeType === 3).map((n) => n.data).join("").trim();
    if (!text) continue;
    const style = getComputedStyle(el);
    const a = lum(rgb(style.color)), b = lum(background(el));
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const large = parseFloat(style.fontSize) >= 24 || (parseFloat(style.fontSize) >= 18.6 && +style.fontWeight >= 700);
    if (ratio < (large ? 3 : 4.5)) bad.push([el.tagName, text.slice(0, 40), ratio.toFixed(2)]);
  }
  return bad;
}"""
UNLABELLED = """() => [...document.querySelectorAll("input, select, textarea")]
  .filter((e) => !e.labels.length && !e.getAttribute("aria-label")).map((e) => e.id || e.name)"""


def expect(locator: Any) -> Any:
    """Playwright's retrying assertions (its wait_for_function evaluates a string, which the
    console's policy forbids)."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def _browser_reason() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists() and INSTALL.exists():
        subprocess.run([str(INSTALL)], check=False, timeout=900)  # says itself what it could not do
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing: run scripts/install-browser as root (Debian's chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing: make install (it is a dev dependency)"
    return None


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """One server for the module with the seeded tenants and their keys."""
    seeded = start_seeded(tmp_path_factory.mktemp("console") / "data")
    yield seeded
    seeded.server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Debian chromium for the module."""
    reason = _browser_reason()
    if reason:
        pytest.skip(reason)
    # Imported here, not at the top: without playwright the module must still load, to skip.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go: docs/console/ with CONSOLE_SCREENSHOTS=1, else a temporary folder."""
    if os.environ.get("CONSOLE_SCREENSHOTS") == "1":
        (REPO / "docs" / "console").mkdir(parents=True, exist_ok=True)
        return REPO / "docs" / "console"
    return tmp_path_factory.mktemp("shots")


@dataclass
class Console:
    """One browser context on the console, with what it saw."""

    page: Any
    seeded: Seeded
    shots: Path
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.seeded.server.url

    def sign_in(self, role: str) -> None:
        """Type the role's key into the sign-in form and submit it with the keyboard."""
        self.page.goto(self.url + "/ui")
        self.page.locator("#api-key").fill(self.seeded.keys[role])
        self.page.locator("#api-key").press("Enter")
        self.page.locator("#tl-table").wait_for()

    def open(self, hash_: str, ready: str) -> None:
        """Go to a console page and wait for one of its elements."""
        self.page.goto(f"{self.url}/ui#/{hash_}")
        self.page.locator(ready).first.wait_for()

    def event(self, tenant: str, name: str) -> None:
        """Open an event's page and wait for its graph."""
        self.open(f"event/{self.seeded.ids[tenant][name]}", "svg.graph")

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)

    def texts(self, selector: str) -> list[str]:
        return [t.strip() for t in self.page.locator(selector).all_inner_texts()]

    def row_ids(self, table: str) -> list[str]:
        return [
            str(r.get_attribute("data-event-id"))
            for r in self.page.locator(f"{table} tbody tr").all()
        ]

    def check_page(self) -> None:
        """Every control has a label and every text meets its contrast ratio."""
        assert self.page.evaluate(UNLABELLED) == []
        assert self.page.evaluate(CONTRAST) == []


@pytest.fixture
def ui(browser: Any, seeded: Seeded, shots: Path) -> Iterator[Console]:
    """A fresh context at 1280x800; afterwards no dialog, error, CSP violation or other host."""
    context = browser.new_context(viewport=WIDE, accept_downloads=True)
    context.add_init_script(WATCH)
    page = context.new_page()
    page.set_default_timeout(15_000)
    console = Console(page, seeded, shots)

    def dialog(d: Any) -> None:
        console.dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", dialog)
    page.on("pageerror", lambda e: console.errors.append(str(e)))
    page.on(
        "request",
        lambda r: (
            None
            if r.url.startswith((console.url, "blob:", "data:"))
            else console.foreign.append(r.url)
        ),
    )
    yield console
    violations = page.evaluate("window.__csp") if not page.is_closed() else []
    context.close()
    assert console.dialogs == [] and console.errors == [] and console.foreign == []
    assert violations == []


def _fresh(ui: Console, since: str = "", until: str = "", kind: str = "") -> None:
    """Set the time line's kind and time filters and apply them."""
    ui.page.locator("#tl-kind").fill(kind)
    ui.page.locator("#tl-since").fill(since)
    ui.page.locator("#tl-until").fill(until)
    ui.page.locator("#tl-apply").click()
    ui.page.locator("#tl-table").wait_for()


def test_sign_in_then_the_time_line_filters_by_kind_time_and_property_and_pages(
    ui: Console,
) -> None:
    ids = ui.seeded.ids["support"]
    ui.page.goto(ui.url + "/ui")
    ui.page.locator("#api-key").wait_for()
    ui.check_page()
    ui.page.locator("#api-key").fill(ui.seeded.keys["reviewer"])
    ui.shot("signin")
    ui.page.locator("#api-key").press("Enter")
    ui.page.locator("#tl-table").wait_for()
    who = ui.page.locator("[data-testid=who]").inner_text()
    assert ui.seeded.tenants["customer-4417"] in who and "read" in who and "expires 20" in who
    assert "write" not in who
    # The key is in this tab's sessionStorage only: not in the URL, a cookie or localStorage.
    key = ui.seeded.keys["reviewer"]
    assert ui.page.evaluate("sessionStorage.getItem('memspine.key')") == key
    assert key not in ui.page.url and ui.page.context.cookies() == []
    assert ui.page.evaluate("localStorage.length") == 0
    newest_first = list(reversed(ids))  # appended oldest first
    assert ui.row_ids("#tl-table") == [ids[n] for n in newest_first]
    assert ui.texts("#tl-table tbody td:nth-child(3)") == ["current"] * 10
    ui.check_page()
    ui.shot("timeline")

    _fresh(ui, kind="tool_call")
    assert ui.row_ids("#tl-table") == [ids["open_case"], ids["track"], ids["get_order"]]
    assert set(ui.texts("#tl-table tbody td:nth-child(2)")) == {"tool_call"}
    _fresh(ui, since="2026-10-05T14:01:00", until="2026-10-05T14:02:50")
    assert ui.row_ids("#tl-table") == [ids[n] for n in ("objection", "reply", "track", "get_order")]
    _fresh(ui)
    ui.page.locator("#tl-add-prop").click()
    ui.page.locator(".prop-name").fill("speaker")
    ui.page.locator(".prop-value").fill("customer")
    ui.page.locator("#tl-apply").click()
    ui.page.locator("#tl-table").wait_for()
    expect(ui.page.locator("#tl-table tbody tr")).to_have_count(3)
    assert ui.row_ids("#tl-table") == [ids["door_turn"], ids["objection"], ids["message"]]
    ui.page.get_by_role("button", name="Remove this property filter").click()
    ui.page.locator("#tl-limit").select_option("5")
    ui.page.locator("#tl-apply").click()
    expect(ui.page.locator("#tl-table tbody tr")).to_have_count(5)
    first = ui.row_ids("#tl-table")
    assert ui.page.locator("#tl-newer").is_disabled()
    ui.page.locator("#tl-older").click()
    expect(ui.page.locator(".pager span")).to_have_text("Page 2")
    second = ui.row_ids("#tl-table")
    assert first + second == [ids[n] for n in newest_first]
    ui.page.locator("#tl-newer").click()
    expect(ui.page.locator(".pager span")).to_have_text("Page 1")
    assert ui.row_ids("#tl-table") == first


def _graph(ui: Console) -> tuple[dict[str, int], set[tuple[str, str, str]]]:
    """The drawn graph: node id -> layer, and (from, to, type) for every edge."""
    nodes = {
        str(n.get_attribute("data-event-id")): int(str(n.get_attribute("data-layer")))
        for n in ui.page.locator("svg.graph g.node").all()
    }
    edges = {
        (
            str(e.get_attribute("data-from")),
            str(e.get_attribute("data-to")),
            str(e.get_attribute("data-type")),
        )
        for e in ui.page.locator("svg.graph path.edge").all()
    }
    return nodes, edges


def test_an_event_page_draws_sources_and_derived_events_and_a_node_opens_its_event(
    ui: Console,
) -> None:
    ops = ui.seeded.ids["ops"]
    ui.sign_in("auditor")
    ui.event("ops", "W1")
    assert ui.page.locator("[data-testid=event-text]").inner_text() == (
        "set_payment_terms(SUP-2207, net 45) -> ok, change CHG-9031"
    )
    assert "CHG-9031" in ui.page.locator("#props-table").inner_text()
    nodes, edges = _graph(ui)
    assert nodes == {ops["W1"]: 0, ops["I1"]: -1, ops["L1"]: -1, ops["L2"]: -1, ops["F1"]: 1}
    source = "SOURCE_FROM"
    assert edges == {
        (ops["W1"], ops["I1"], source),
        (ops["W1"], ops["L1"], source),
        (ops["W1"], ops["L2"], source),
        (ops["F1"], ops["W1"], source),
        (ops["F1"], ops["L2"], source),
    }
    assert "Priya: move Northfield" in ui.page.locator("#source-list").inner_text()
    # A read-only key sees no control that writes.
    assert ui.page.locator("#erase").count() == 0
    assert ui.page.get_by_role("button", name="Delete").count() == 0
    ui.check_page()
    ui.shot("event")

    # The keyboard: Tab reaches the nodes, Enter opens one.
    node = ui.page.locator(f"svg.graph g.node[data-event-id='{ops['I1']}']")
    node.focus()
    node.press("Enter")
    ui.page.wait_for_url(f"**/ui#/event/{ops['I1']}")
    ui.page.locator(f"svg.graph g.node.focus[data-event-id='{ops['I1']}']").wait_for()
    nodes, _ = _graph(ui)
    assert nodes == {ops["I1"]: 0, ops["W1"]: 1, ops["F1"]: 2}
    ui.page.locator(f"svg.graph g.node[data-event-id='{ops['F1']}']").click()
    ui.page.wait_for_url(f"**/ui#/event/{ops['F1']}")
    ui.page.locator(f"svg.graph g.node.focus[data-event-id='{ops['F1']}']").wait_for()
    ui.page.locator("#hops").select_option("1")
    expect(ui.page.locator("svg.graph g.node")).to_have_count(3)
    nodes, _ = _graph(ui)
    assert nodes == {ops["F1"]: 0, ops["L2"]: -1, ops["W1"]: -1}


def test_a_superseded_version_is_marked_in_the_graph_and_on_the_time_line(ui: Console) -> None:
    project = ui.seeded.ids["project"]
    ui.sign_in("assistant")
    ui.event("project", "new_date")
    nodes, edges = _graph(ui)
    assert nodes[project["old_date"]] == -1 and nodes[project["plan_turn"]] == -2
    assert (project["new_date"], project["old_date"], "SUPERSEDES") in edges
    old = ui.page.locator(f"svg.graph g.node[data-event-id='{project['old_date']}']")
    assert "superseded" in str(old.get_attribute("class"))
    assert "superseded" in str(old.get_attribute("aria-label"))
    ui.open("timeline", "#tl-table")
    row = ui.page.locator(f"#tl-table tr[data-event-id='{project['old_date']}']")
    assert row.locator("td:nth-child(3)").inner_text() == "superseded"
    ui.page.locator("#tl-all").uncheck()
    ui.page.locator("#tl-apply").click()
    expect(ui.page.locator("#tl-table tbody tr")).to_have_count(len(project) - 1)
    assert project["old_date"] not in ui.row_ids("#tl-table")


def test_recall_shows_both_ranks_and_the_score_side_by_side_and_the_walk_in_words(
    ui: Console,
) -> None:
    ids = ui.seeded.ids["support"]
    ui.sign_in("reviewer")
    ui.page.get_by_role("link", name="Recall").click()
    ui.page.locator("#rc-text").fill("signed for at number 16")
    ui.page.locator("#rc-kind").fill("turn")
    ui.page.locator("#rc-k").fill("3")
    ui.page.locator("#rc-hops").fill("1")
    ui.page.locator("#rc-run").click()
    ui.page.locator("#rc-walked").wait_for()
    assert ui.row_ids("#rc-ranked") == [ids["reply"], ids["objection"]]
    cells = [
        r.locator("td").all_inner_texts() for r in ui.page.locator("#rc-ranked tbody tr").all()
    ]
    assert [c[2:6] for c in cells] == [
        ["1", "—", "0.0164", "1/(60+1)"],
        ["2", "—", "0.0161", "1/(60+2)"],
    ]
    summary = ui.page.locator("#rc-summary").inner_text()
    assert "from the keyword (BM25) arm." in summary  # the arm that ranked them, and no other
    assert ui.row_ids("#rc-walked") == [ids["message"], ids["get_order"], ids["track"]]
    vias = {r.get_attribute("data-via") for r in ui.page.locator("#rc-walked tbody tr").all()}
    assert vias == {ids["reply"]}
    report = ui.page.locator("#rc-walk").inner_text()
    assert "reached 4 events" in report and "returned 3" in report and "left out 1" in report
    assert ui.page.locator("#rc-omitted").inner_text() == ids["case_fact"]
    ui.check_page()
    ui.shot("recall")

    ui.page.evaluate("sessionStorage.clear()")
    ui.sign_in("assistant")
    ui.page.get_by_role("link", name="Recall").click()
    ui.page.locator("#rc-text").fill("cutover plan for billing: date, freeze, copy time")
    ui.page.locator("#rc-kind").fill("fact")
    ui.page.locator("#rc-embedding").fill("[0.7, 0.4, 0.0, 0.6]")
    ui.page.locator("#rc-hops").fill("0")
    ui.page.locator("#rc-k").fill("3")
    ui.page.locator("#rc-run").click()
    ui.page.locator("#rc-ranked").wait_for()
    cells = [
        r.locator("td").all_inner_texts() for r in ui.page.locator("#rc-ranked tbody tr").all()
    ]
    assert all(c[2].isdigit() and c[3].isdigit() for c in cells)  # both arms ranked every hit
    assert "replaces" in ui.page.locator("#rc-ranked").inner_text()  # Monday's date gave way
    summary = ui.page.locator("#rc-summary").inner_text()
    assert "from the keyword (BM25) and the vector (cosine) arms" in summary

    # Words no event holds, with an embedding: only the vector arm ranks, and the page says so
    # (it once named the keyword arm for any request with a text).
    ui.page.locator("#rc-text").fill("zzyzx")
    ui.page.locator("#rc-run").click()
    expect(ui.page.locator("#rc-summary")).to_contain_text("from the vector (cosine) arm.")
    cells = [
        r.locator("td").all_inner_texts() for r in ui.page.locator("#rc-ranked tbody tr").all()
    ]
    assert cells and all(c[2] == "—" and c[3].isdigit() for c in cells)


EXPECTED_CSV = (
    "a.change,a.tool,i.actor,i.role\r\n"
    "CHG-9031,set_payment_terms,priya.n,ap_manager\r\n"
    "CHG-9038,release_po,daniel.o,buyer\r\n"
)


def test_cypher_runs_every_example_points_at_errors_and_downloads_csv(ui: Console) -> None:
    ui.sign_in("auditor")
    ui.page.get_by_role("link", name="Cypher").click()
    ui.page.locator("#cy-run").click()
    ui.page.locator("#cy-table").wait_for()
    rows = [r.locator("td").all_inner_texts() for r in ui.page.locator("#cy-table tbody tr").all()]
    assert rows == [
        ["CHG-9031", "set_payment_terms", "priya.n", "ap_manager"],
        ["CHG-9038", "release_po", "daniel.o", "buyer"],
    ]
    ui.check_page()
    ui.shot("cypher")
    with ui.page.expect_download() as download:
        ui.page.locator("#cy-csv").click()
    assert Path(download.value.path()).read_bytes().decode() == EXPECTED_CSV

    options = ui.page.locator("#cy-example option").all_inner_texts()
    for i in range(len(options)):
        ui.page.locator("#cy-example").select_option(str(i))
        ui.page.locator("#cy-run").click()
        ui.page.locator("#cy-count, #cy-error").first.wait_for()
        assert ui.page.locator("#cy-error").count() == 0, options[i]

    ui.page.locator("#cy-query").fill("MATCH (a:Event)\nWHERE a.kind = 'turn'\nRETURN a.text ORDER")
    ui.page.locator("#cy-run").click()
    ui.page.locator("#cy-error").wait_for()
    assert "(line 3, column 20)" in ui.page.locator("#cy-error").inner_text()
    caret = ui.page.locator("#cy-error-listing .caret")
    assert (caret.get_attribute("data-line"), caret.get_attribute("data-col")) == ("3", "20")
    assert caret.inner_text() == " " * 19 + "^"
    # The editor's cursor is put on the spot: the first two lines and their newlines, then 19.
    assert ui.page.evaluate("document.querySelector('#cy-query').selectionStart") == 16 + 22 + 19
    ui.shot("cypher-error")
    ui.page.locator("#cy-query").fill("MATCH (a:Event) SET a.text = 'gone' RETURN a")
    ui.page.locator("#cy-run").click()
    ui.page.get_by_text("only read queries are accepted").wait_for()


def _hostile_dom_is_inert(ui: Console) -> None:
    """No element, attribute or link a hostile event could have brought, and nothing it ran."""
    assert ui.page.evaluate("window.__pwned") is None
    counts = ui.page.evaluate(
        """() => ({
      elements: document.querySelectorAll("main img, main script, main iframe, main object, main embed, main style, main svg svg, main b, main a[href^='javascript'], main a:not([href^='#/']):not([href^='blob:'])").length,
      handlers: [...document.querySelectorAll("*")].filter((e) => [...e.attributes].some((a) => a.name.startsWith("on"))).length,
      scripts: [...document.scripts].map((s) => s.src),
    })"""
    )
    assert counts == {"elements": 0, "handlers": 0, "scripts": [ui.url + "/ui/main.js"]}


def test_a_hostile_event_is_shown_as_text_and_runs_nothing(ui: Console) -> None:
    hostile = ui.seeded.ids["hostile"]
    ui.sign_in("hostile")
    assert "<script>window.__pwned = 1;" in ui.page.locator("#tl-table").inner_text()
    _hostile_dom_is_inert(ui)
    ui.open(f"event/{hostile['first']}", "svg.graph")
    assert ui.page.locator("[data-testid=event-text]").inner_text().startswith("<script>")
    props = ui.page.locator("#props-table").inner_text()
    assert "javascript:alert('property link')" in props and "<b onmouseover" in props
    assert HOSTILE_KIND in str(
        ui.page.locator("svg.graph g.node.focus").get_attribute("aria-label")
    )
    _hostile_dom_is_inert(ui)
    ui.page.locator(f"svg.graph g.node[data-event-id='{hostile['second']}']").click()
    ui.page.wait_for_url(f"**/ui#/event/{hostile['second']}")
    ui.page.locator("#source-list li").wait_for()
    _hostile_dom_is_inert(ui)
    ui.page.get_by_role("link", name="Recall").click()
    ui.page.locator("#rc-text").fill("pwned alert")
    ui.page.locator("#rc-run").click()
    ui.page.locator("#rc-ranked").wait_for()
    _hostile_dom_is_inert(ui)
    ui.page.get_by_role("link", name="Cypher").click()
    ui.page.locator("#cy-query").fill("MATCH (e:Event) RETURN e.kind, e.text, e.bio, e")
    ui.page.locator("#cy-params").fill("{}")
    ui.page.locator("#cy-run").click()
    ui.page.locator("#cy-table").wait_for()
    assert "<svg onload=alert('svg')>" in ui.page.locator("#cy-table").inner_text()
    _hostile_dom_is_inert(ui)


def test_the_policy_headers_and_a_frame_of_the_console_is_refused(ui: Console) -> None:
    response = ui.page.goto(ui.url + "/ui")
    headers = response.headers
    assert "default-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"
    ui.page.goto(ui.url + "/health")  # a page of the same origin, as a foreign one would be
    ui.page.evaluate(
        """(src) => new Promise((done) => {
      const f = document.createElement("iframe");
      f.src = src;
      f.onload = done;
      f.onerror = done;
      document.body.append(f);
      setTimeout(done, 3000);
    })""",
        ui.url + "/ui",
    )
    frames = [f for f in ui.page.frames if f != ui.page.main_frame]
    assert frames and all(f.query_selector("#main") is None for f in frames)


def test_a_narrow_window_keeps_every_page_inside_its_width(ui: Console) -> None:
    ui.page.set_viewport_size(NARROW)
    ui.sign_in("auditor")
    overflow = "document.documentElement.scrollWidth - window.innerWidth"
    assert ui.page.evaluate(overflow) <= 0
    for hash_, ready in [
        (f"event/{ui.seeded.ids['ops']['W2']}", "svg.graph"),
        ("recall", "#rc-text"),
        ("cypher", "#cy-query"),
    ]:
        ui.open(hash_, ready)
        assert ui.page.evaluate(overflow) <= 0, hash_
        ui.check_page()
    ui.event("ops", "W2")
    ui.page.screenshot(path=str(ui.shots / "narrow.png"))
    assert ui.page.get_by_role("link", name="Time line").is_visible()


def test_a_revoked_key_is_signed_out_at_its_next_request(ui: Console) -> None:
    ui.sign_in("revoked")
    with ui.seeded.client("revoked") as c:
        key_id = c.get("/v1/whoami").json()["key_id"]
    with ui.seeded.server.client(ADMIN_KEY) as admin:
        assert admin.delete(f"/v1/admin/keys/{key_id}").status_code == 200
    ui.page.get_by_role("link", name="Recall").click()
    ui.page.locator("#rc-text").fill("door code")
    ui.page.locator("#rc-run").click()
    expect(ui.page.locator("#signin-notice")).to_contain_text("no longer accepts this key")
    assert ui.page.evaluate("sessionStorage.getItem('memspine.key')") is None
    assert ui.page.locator("#nav").is_hidden()


def test_erasure_previews_on_the_graph_then_deletes_with_purge(ui: Console) -> None:
    ids = ui.seeded.ids["support"]
    ui.sign_in("agent")
    ui.event("support", "door_turn")
    ui.page.locator("#erase-preview").click()
    ui.page.locator("#erase-confirm").wait_for()
    doomed = {
        str(n.get_attribute("data-event-id"))
        for n in ui.page.locator("svg.graph g.node.doomed").all()
    }
    assert doomed == {ids["door_turn"], ids["door_fact"]}
    assert ui.page.locator("#erase-confirm").inner_text() == "Delete 2 events and purge"
    with ui.seeded.client("reviewer") as reviewer:
        assert reviewer.get(f"/v1/memory/event/{ids['door_turn']}").status_code == 200  # a dry run
    ui.check_page()
    ui.shot("erase")
    ui.page.locator("#erase-confirm").click()
    result = ui.page.locator("#erase-result")
    result.wait_for()
    assert result.inner_text().startswith("Deleted 2 events. Purged")
    with ui.seeded.client("reviewer") as reviewer:
        for name in ("door_turn", "door_fact"):
            r = reviewer.get(f"/v1/memory/event/{ids[name]}")
            assert (r.status_code, r.json()["detail"]) == (404, "no event with that id")
    tenant_dir = ui.seeded.server.data_dir / ui.seeded.tenants["customer-4417"]
    assert scan(tenant_dir, {"door code": b"door code"}) == {}
    assert httpx.get(ui.url + "/health", timeout=30).status_code == 200


def test_a_subject_is_erased_from_its_page_after_a_reviewed_dry_run(ui: Console) -> None:
    with ui.seeded.client("agent") as agent:
        tagged = agent.post(
            "/v1/memory/event",
            json={
                "kind": "turn",
                "text": "Customer Imogen asks for her data",
                "subjects": ["cust-imo"],
            },
        ).json()["event_id"]
        named = agent.post(
            "/v1/memory/event",
            json={"kind": "tool_call", "text": "crm_lookup(Imogen Varga) -> 3 orders"},
        ).json()["event_id"]
    ui.sign_in("agent")
    ui.open("subject", "#sj-form")
    ui.page.locator("#sj-subject").fill("cust-imo")
    ui.page.locator("#sj-identifiers").fill("Imogen Varga")
    ui.page.locator("#sj-preview").click()
    ui.page.locator("#sj-events").wait_for()
    assert "2 events would go" in ui.page.locator("#sj-plan").inner_text()
    with ui.seeded.client("reviewer") as reviewer:
        assert reviewer.get(f"/v1/memory/event/{tagged}").status_code == 200  # a dry run
    ui.check_page()
    ui.shot("subject")
    ui.page.locator(f"#sj-confirm-{named}").check()
    ui.page.locator("#sj-erase").click()
    result = ui.page.locator("#sj-result")
    result.wait_for()
    assert result.inner_text().startswith("Erased 2 events; receipt ")
    ui.page.locator("#sj-receipt-list").wait_for()
    with ui.seeded.client("reviewer") as reviewer:
        for event_id in (tagged, named):
            assert reviewer.get(f"/v1/memory/event/{event_id}").status_code == 404
        assert len(reviewer.get("/v1/memory/receipts").json()["receipts"]) == 1

"""The console's auditor's page in Debian's chromium: an audit key sees who read an event and
what a key read (ids only: it cannot read events); a key with read and audit reaches the page
from an event's "Who read this" and gets links. Reads are recorded durably here, so every read
made before a page is opened is on it (docs/audit.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memspine_admin.control import ControlDB
from tests.e2e import test_console_browser as base
from tests.e2e.test_console_browser import Console, expect
from tests.support.console_seed import ADMIN_KEY, Seeded
from tests.support.servers import ServerProcess

# The console tests' browser, screenshot folder and checked context, over this module's server.
browser, shots, ui = base.browser, base.shots, base.ui

PAGE_SIZE = 50  # memspine/ui/page-audit.js
EVENT_ROUTE = "/v1/memory/event/{event_id:str}"  # as recorded: the route, not the path
ROLES = {
    "writer": ["read", "write"],
    "reader": ["read"],
    "bulk": ["read"],
    "auditor": ["audit"],
    "lead": ["read", "audit"],
}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """A server recording reads durably, one tenant, a key per role and three events."""
    data_dir = tmp_path_factory.mktemp("console-audit") / "data"
    ControlDB.init(data_dir, actor="test:console-audit")
    env = {"MEMSPINE_ADMIN_KEY": ADMIN_KEY, "MEMSPINE_READ_AUDIT": "durable"}
    server = ServerProcess(data_dir, env).start()
    seeded = Seeded(server)
    try:
        with server.client(ADMIN_KEY) as admin:
            r = admin.post("/v1/admin/tenants", json={"name": "acme"})
            assert r.status_code == 201, r.text
            seeded.tenants["acme"] = tenant = r.json()["tenant_id"]
            for role, scopes in ROLES.items():
                body = {"tenant_id": tenant, "name": role, "scopes": scopes}
                k = admin.post("/v1/admin/keys", json=body)
                assert k.status_code == 201, k.text
                seeded.keys[role] = k.json()["api_key"]
        ids: dict[str, str] = {}
        with seeded.client("writer") as writer:
            for name in ("a", "b", "c"):
                r = writer.post("/v1/memory/event", json={"kind": "fact", "text": f"fact {name}"})
                assert r.status_code == 201, r.text
                ids[name] = r.json()["event_id"]
        seeded.ids["acme"] = ids
        yield seeded
    finally:
        server.stop()


def _key_id(seeded: Seeded, role: str) -> str:
    with seeded.client(role) as c:
        return str(c.get("/v1/whoami").json()["key_id"])


def _read(seeded: Seeded, role: str, path: str, purpose: str) -> None:
    with seeded.client(role) as c:
        r = c.get(path, headers={"Memspine-Purpose": purpose})
        assert r.status_code == 200, r.text


def _sign_in(ui: Console, role: str, ready: str) -> None:
    ui.page.goto(ui.url + "/ui")
    ui.page.locator("#api-key").fill(ui.seeded.keys[role])
    ui.page.locator("#api-key").press("Enter")
    ui.page.locator(ready).wait_for()


def _rows(ui: Console) -> list[list[str]]:
    """The auditor's table: [when, key, door, route, purpose, request, events] per row."""
    return [
        [c.strip() for c in row.locator("td").all_inner_texts()]
        for row in ui.page.locator("#au-reads tbody tr").all()
    ]


def test_an_audit_key_lists_who_read_an_event_and_what_a_key_read(ui: Console) -> None:
    ids = ui.seeded.ids["acme"]
    reader = _key_id(ui.seeded, "reader")
    _read(ui.seeded, "reader", f"/v1/memory/event/{ids['a']}", "ticket 4411")
    _read(ui.seeded, "reader", "/v1/memory/events?limit=10", "weekly review")
    _read(ui.seeded, "writer", f"/v1/memory/event/{ids['b']}", "not a")
    _sign_in(ui, "auditor", "#au-form")
    assert ui.texts("#nav a") == ["Who read what"]  # an audit key reads no events
    ui.page.locator("#au-event").fill(ids["a"])
    ui.page.locator("#au-run").click()
    ui.page.wait_for_url(f"**/ui#/audit/event/{ids['a']}")
    expect(ui.page.locator("#au-reads tbody tr")).to_have_count(2)
    rows = _rows(ui)
    assert [(r[1], r[2], r[3], r[4]) for r in rows] == [
        (reader, "http", EVENT_ROUTE, "ticket 4411"),
        (reader, "http", "/v1/memory/events", "weekly review"),
    ]
    assert rows[0][6] == ids["a"]
    assert rows[1][6].startswith(ids["a"]) and rows[1][6].endswith("and 2 others")
    assert ui.page.locator("#au-reads td a[href^='#/event/']").count() == 0  # ids only
    assert all(len(r[5]) >= 16 for r in rows)  # the request ids
    ui.check_page()
    ui.shot("audit-event")

    ui.page.locator("#au-reads a[data-testid=au-key]").first.click()
    ui.page.wait_for_url(f"**/ui#/audit/key/{reader}")
    expect(ui.page.locator("#au-reads tbody tr")).to_have_count(2)
    listed = ui.page.locator("#au-reads tbody tr").nth(1).locator("li[data-event-id]")
    assert sorted(str(li.get_attribute("data-event-id")) for li in listed.all()) == sorted(
        ids.values()
    )
    assert ui.page.locator("#au-count").inner_text() == f"2 reads of key {reader}, oldest first."


def test_the_auditor_page_pages_with_the_cursor(ui: Console) -> None:
    ids = ui.seeded.ids["acme"]
    for n in range(PAGE_SIZE + 1):
        _read(ui.seeded, "bulk", f"/v1/memory/event/{ids['c']}", f"sweep {n}")
    bulk = _key_id(ui.seeded, "bulk")
    _sign_in(ui, "auditor", "#au-form")
    ui.open(f"audit/key/{bulk}", "#au-reads")
    expect(ui.page.locator("#au-reads tbody tr")).to_have_count(PAGE_SIZE)
    ui.page.locator("#au-more").click()
    expect(ui.page.locator("#au-reads tbody tr")).to_have_count(PAGE_SIZE + 1)
    expect(ui.page.locator("#au-more")).to_have_count(0)
    purposes = [r[4] for r in _rows(ui)]
    assert purposes == [f"sweep {n}" for n in range(PAGE_SIZE + 1)]  # oldest first, no repeat


def test_an_event_page_links_who_read_it_for_a_key_with_audit(ui: Console) -> None:
    ids = ui.seeded.ids["acme"]
    lead = _key_id(ui.seeded, "lead")
    _read(ui.seeded, "reader", f"/v1/memory/event/{ids['b']}", "second look")
    _sign_in(ui, "lead", "#tl-table")
    assert ui.texts("#nav a") == [
        "Time line",
        "Recall",
        "Cypher",
        "Subjects",
        "Retention",
        "Who read what",
    ]
    ui.open(f"event/{ids['b']}", "svg.graph")
    ui.page.locator("#who-read").click()
    ui.page.wait_for_url(f"**/ui#/audit/event/{ids['b']}")
    ui.page.locator("#au-reads").wait_for()
    rows = _rows(ui)
    assert ("second look", EVENT_ROUTE) in [(r[4], r[3]) for r in rows]
    # The console's own read of the event page is recorded under the signed-in key.
    assert (lead, EVENT_ROUTE, "none given") in [(r[1], r[3], r[4]) for r in rows]
    link = ui.page.locator(f"#au-reads li[data-event-id='{ids['b']}'] a").first
    assert link.get_attribute("href") == f"#/event/{ids['b']}"
    link.click()
    ui.page.locator("svg.graph").wait_for()
    assert ui.page.locator("[data-testid=event-id]").inner_text() == ids["b"]


def test_a_read_key_sees_no_auditor_page_and_no_link(ui: Console) -> None:
    ids = ui.seeded.ids["acme"]
    _sign_in(ui, "reader", "#tl-table")
    assert "Who read what" not in ui.texts("#nav a")
    ui.open(f"event/{ids['a']}", "svg.graph")
    assert ui.page.locator("#who-read").count() == 0
    ui.open(f"audit/event/{ids['a']}", "#tl-table")  # not its page: the first it may see

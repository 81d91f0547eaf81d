"""The console's Retention page in Debian's chromium: a read key sees the tenant's windows (its
own and the server's default), its oldest event, what comes due now and within 7 days, the last
retention run and the legal holds standing, as GET /v1/memory/retention answers them after a
real retention run of the server's purger (a hold on a subject kept its events)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from memspine_admin.control import ControlDB
from memspine_admin.records import now_us
from tests.e2e import test_console_browser as base
from tests.e2e.test_console_browser import Console, expect
from tests.support.console_seed import ADMIN_KEY, Seeded
from tests.support.servers import ServerProcess
from tests.support.wait import wait_until

browser, shots, ui = base.browser, base.shots, base.ui

DAY = 86_400 * 1_000_000
HELD, GONE, SOON = 5, 3, 2  # old turns about the held subject, old turns of nobody, turns due soon
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """A server whose purger runs retention often, a tenant with windows, a hold on one subject,
    and one retention run done (it deleted the old turns the hold does not keep)."""
    data_dir = tmp_path_factory.mktemp("console-retention") / "data"
    ControlDB.init(data_dir, actor="test:console-retention")
    env = {
        "MEMSPINE_ADMIN_KEY": ADMIN_KEY,
        "MEMSPINE_PURGE_INTERVAL_SECS": "0.3",
        "MEMSPINE_RETENTION_DAYS": "365",
    }
    server = ServerProcess(data_dir, env).start()
    seeded = Seeded(server)
    try:
        with server.client(ADMIN_KEY) as admin:
            tenant = admin.post("/v1/admin/tenants", json={"name": "acme"}).json()["tenant_id"]
            seeded.tenants["acme"] = tenant
            for role, scopes in (("writer", ["read", "write"]), ("reader", ["read"])):
                body = {"tenant_id": tenant, "name": role, "scopes": scopes}
                seeded.keys[role] = admin.post("/v1/admin/keys", json=body).json()["api_key"]
            hold = admin.post(
                f"/v1/admin/tenants/{tenant}/holds",
                json={"reason": "dispute 2026-14", "subject": "c-7"},
            )
            assert hold.status_code == 201, hold.text
            seeded.ids["hold"] = {"id": hold.json()["hold_id"]}
        now = now_us()
        events: list[dict[str, object]] = [
            {"kind": "turn", "ts": now - 40 * DAY, "text": f"kept {i}", "subjects": ["c-7"]}
            for i in range(HELD)
        ]
        events += [{"kind": "turn", "ts": now - 40 * DAY, "text": f"gone {i}"} for i in range(GONE)]
        events += [{"kind": "turn", "ts": now - 26 * DAY, "text": f"soon {i}"} for i in range(SOON)]
        events += [{"kind": "fact", "ts": now - DAY, "text": "a fact kept a year"}]
        with seeded.client("writer") as c:
            r = c.post("/v1/memory/events", json={"events": events})
            assert r.status_code == 201, r.text
        url = f"{server.url}/v1/admin/tenants/{tenant}"
        assert (
            httpx.patch(
                url, json={"retention": {"turn": 30}}, headers=ADMIN, timeout=30
            ).status_code
            == 200
        )

        def ran() -> bool:
            state = httpx.get(url, headers=ADMIN, timeout=30).json()["retention_state"]
            return state["last_run"] is not None

        wait_until(ran, "the purger's retention run")
        yield seeded
    finally:
        server.stop()


def test_the_retention_page_shows_windows_outlook_last_run_and_holds(ui: Console) -> None:
    ui.page.goto(ui.url + "/ui")
    ui.page.locator("#api-key").fill(ui.seeded.keys["reader"])
    ui.page.locator("#api-key").press("Enter")
    ui.page.locator("#tl-table").wait_for()
    assert "Retention" in ui.texts("#nav a")
    ui.page.locator("#nav a[href='#/retention']").click()
    ui.page.locator("#rt-hold-table").wait_for()

    windows = {
        str(row.get_attribute("data-kind")): [
            c.strip() for c in row.locator("td").all_inner_texts()
        ]
        for row in ui.page.locator("#rt-window-table tbody tr").all()
    }
    assert windows["turn"][1:] == ["30 days", "this tenant's"]
    assert windows["*"][1:] == ["365 days", "the server's default"]
    assert list(windows) == ["turn", "*"]
    # The held turns are still due (a run skips them); those due within 7 days add the young.
    expect(ui.page.locator("[data-testid=rt-due-now]")).to_have_text(f"{HELD} events")
    expect(ui.page.locator("[data-testid=rt-due-soon]")).to_have_text(f"{HELD + SOON} events")
    assert ui.page.locator("[data-testid=rt-oldest]").inner_text().endswith("UTC")
    expect(ui.page.locator("[data-testid=rt-deleted]")).to_have_text(f"{GONE} events")
    # Every held turn has the same ts: each is counted once, not once per batch that saw it.
    expect(ui.page.locator("[data-testid=rt-held]")).to_have_text(f"{HELD} events")
    hold_id = ui.seeded.ids["hold"]["id"]
    rows = ui.page.locator("#rt-hold-table tbody tr")
    expect(rows).to_have_count(1)
    assert rows.first.get_attribute("data-hold-id") == hold_id
    cells = [c.strip() for c in rows.first.locator("td").all_inner_texts()]
    assert cells[:3] == [hold_id, "subject c-7", "dispute 2026-14"]
    ui.check_page()
    ui.shot("retention")

    # Lifted, the hold leaves the page (and the next run deletes what it kept).
    tenant = ui.seeded.tenants["acme"]
    lifted = httpx.delete(
        f"{ui.url}/v1/admin/tenants/{tenant}/holds/{hold_id}", headers=ADMIN, timeout=30
    )
    assert lifted.status_code == 200, lifted.text
    ui.page.reload()
    ui.page.locator("#rt-no-hold").wait_for()
    assert "No legal hold stands." in ui.page.locator("#rt-holds").inner_text()

"""A retention run cut by kill -9 through a real server: a failpoint stops the run after its
first batch (each later batch's journal write fails), the server is killed, and the restarted
server resumes the run: every due event deleted, each batch whole, one receipt naming them all."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import msgspec

from memspine_admin.records import now_us
from storage.receipts import RunReceipt, listing
from storage.tenants.runs import JOURNAL, RUNS
from tests.support.admin import Admin
from tests.support.servers import ServerProcess

ADMIN_KEY = "admin-key-for-the-retention-e2e-012345"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
DAY = 86_400 * 1_000_000
OLD, YOUNG = 1200, 5  # 1200 due: three batches of 500, the first done before the kill


def wait_for(what: str, check: Callable[[], bool], secs: float = 60) -> None:
    deadline = time.monotonic() + secs
    while not check():
        assert time.monotonic() < deadline, f"waited {secs} s for {what}"
        time.sleep(0.05)


def test_a_run_killed_mid_way_resumes_and_leaves_one_receipt(tmp_path: Path) -> None:
    admin = Admin(tmp_path / "data", tmp_path)
    admin.ok("init")
    env = {"MEMSPINE_ADMIN_KEY": ADMIN_KEY, "MEMSPINE_PURGE_INTERVAL_SECS": "0.3"}
    server = ServerProcess(
        tmp_path / "data", env | {"MEMSPINE_FAILPOINTS": "retention.journal=eio@1"}
    )
    server.start()
    try:
        tid = httpx.post(
            server.url + "/v1/admin/tenants", json={"name": "acme"}, headers=ADMIN, timeout=30
        )
        tenant_id = tid.json()["tenant_id"]
        body = {"tenant_id": tenant_id, "name": "k"}
        key = httpx.post(
            server.url + "/v1/admin/keys", json=body, headers=ADMIN, timeout=30
        ).json()["api_key"]
        now = now_us()
        events = [
            {"kind": "turn", "ts": now - (40 + i % 30) * DAY, "text": f"old {i}"}
            for i in range(OLD)
        ]
        events += [{"kind": "turn", "ts": now - DAY, "text": f"young {i}"} for i in range(YOUNG)]
        with server.client(key) as c:
            for start in range(0, len(events), 600):
                r = c.post("/v1/memory/events", json={"events": events[start : start + 600]})
                assert r.status_code == 201, r.text

        def tenant_url() -> str:  # the restarted server listens on another port
            return f"{server.url}/v1/admin/tenants/{tenant_id}"

        r = httpx.patch(tenant_url(), json={"retention": {"turn": 30}}, headers=ADMIN, timeout=30)
        assert r.status_code == 200 and r.json()["retention_state"]["due_now"] == OLD

        def stopped_after_one_batch() -> bool:
            state = httpx.get(tenant_url(), headers=ADMIN, timeout=30).json()["retention_state"]
            log = server.log_path.read_text(errors="replace")
            return state["due_now"] == OLD - 500 and "retention run failed" in log

        wait_for("the run to stop after its first batch", stopped_after_one_batch)
        root = tmp_path / "data" / tenant_id
        assert (root / RUNS / JOURNAL).exists() and listing(root.parent, tenant_id) == []
        server.stop(signal.SIGKILL)

        server.extra_env = env  # no failpoint: the run goes on
        server.start()

        def finished() -> bool:
            shown = httpx.get(tenant_url(), headers=ADMIN, timeout=30).json()
            return shown["retention_state"]["last_run"] is not None

        wait_for("the resumed run's receipt", finished)
        shown = httpx.get(tenant_url(), headers=ADMIN, timeout=30).json()
        last = shown["retention_state"]["last_run"]
        assert (last["deleted"], last["purged"], shown["retention_state"]["due_now"]) == (
            OLD,
            OLD,
            0,
        )
        assert shown["usage"]["events"] == {"live": YOUNG, "deleted": 0}
        (receipt,) = listing(root.parent, tenant_id)
        assert isinstance(receipt, RunReceipt)
        assert len(set(receipt.deleted_ids)) == OLD and not (root / RUNS / JOURNAL).exists()
        assert b"old 7" not in msgspec.json.encode(receipt)
        with server.client(key) as c:
            listed = c.get("/v1/memory/events", params={"limit": 1000}).json()["events"]
        assert sorted(e["text"] for e in listed) == sorted(f"young {i}" for i in range(YOUNG))
    finally:
        server.stop()

"""A legal hold placed while a delete of the same tenant waits on its writer stops that delete,
through a real server: the `delete.held` failpoint pauses the delete where it runs, the test
places the hold, lets it go, and the waiting caller gets 409 legal_hold naming the hold; the event
is still there, and once the hold is lifted the same delete goes through."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from tests.support.admin import Admin
from tests.support.servers import ServerProcess
from tests.support.wait import wait_until

ADMIN_KEY = "admin-key-for-the-queued-delete-e2e-0123"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def test_a_hold_placed_while_a_delete_waits_stops_it(tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    Admin(tmp_path / "data", tmp_path).ok("init")
    env = {
        "MEMSPINE_ADMIN_KEY": ADMIN_KEY,
        "MEMSPINE_FAILPOINTS": "delete.held=pause:1",  # the first delete only
        "MEMSPINE_FAILPOINT_GATES": str(gates),
    }
    server = ServerProcess(tmp_path / "data", env).start()
    try:
        made = httpx.post(
            server.url + "/v1/admin/tenants", json={"name": "acme"}, headers=ADMIN, timeout=30
        )
        tenant_id = made.json()["tenant_id"]
        body = {"tenant_id": tenant_id, "name": "k"}
        key = httpx.post(
            server.url + "/v1/admin/keys", json=body, headers=ADMIN, timeout=30
        ).json()["api_key"]
        with server.client(key) as c:
            ev = {"kind": "turn", "text": "the disputed order", "subjects": ["c-7"]}
            r = c.post("/v1/memory/event", json=ev)
            assert r.status_code == 201, r.text
            event_id = r.json()["event_id"]
            other = c.post("/v1/memory/event", json={"kind": "turn", "text": "unrelated"})
            other_id = other.json()["event_id"]

        answers: list[httpx.Response] = []

        def delete() -> None:
            auth = {"Authorization": f"Bearer {key}"}
            url = f"{server.url}/v1/memory/event/{event_id}"
            answers.append(httpx.delete(url, headers=auth, timeout=180))

        waiting = threading.Thread(target=delete)
        waiting.start()
        reached = gates / "delete.held.reached"
        wait_until(lambda: reached.exists() or not waiting.is_alive(), "the delete to pause")
        assert reached.exists(), answers
        hold = httpx.post(
            f"{server.url}/v1/admin/tenants/{tenant_id}/holds",
            json={"reason": "dispute 2026-14", "subject": "c-7"},
            headers=ADMIN,
            timeout=30,
        )
        assert hold.status_code == 201, hold.text
        hold_id = hold.json()["hold_id"]
        (gates / "delete.held.go").touch()
        waiting.join(timeout=180)
        assert not waiting.is_alive()

        (answer,) = answers
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"] == "legal_hold"
        assert hold_id in answer.json()["detail"]
        with server.client(key) as c:
            assert c.get(f"/v1/memory/event/{event_id}").status_code == 200
            # The hold keeps the subject's events only: another goes as before.
            assert c.delete(f"/v1/memory/event/{other_id}").status_code == 200
            lifted = httpx.delete(
                f"{server.url}/v1/admin/tenants/{tenant_id}/holds/{hold_id}",
                headers=ADMIN,
                timeout=30,
            )
            assert lifted.status_code == 200, lifted.text
            gone = c.delete(f"/v1/memory/event/{event_id}")
            assert gone.status_code == 200, gone.text
            assert c.get(f"/v1/memory/event/{event_id}").status_code == 404
    finally:
        server.stop()

"""Moving a tenant between two real nodes on one PostgreSQL control plane, under a running
writer (memspine_admin/move.py, memspine/routes/move.py).

The writer appends without pause, following the tenant to its node (421 says it left) and
waiting out 503s as Retry-After asks; every event it was answered for is on the new node
afterwards, with its links and its Idempotency-Key record; the old node's directory is gone;
an event purged before the move and one deleted after its first copy leave no byte on either
node; writes were refused only for the held round.
"""

from __future__ import annotations

import base64
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from memspine_admin.control_pg import PgControl
from memspine_admin.move import Mover
from memspine_admin.pgserver import PrivatePostgres
from storage import receipts
from storage.errors import Conflict, MemspineError
from tests.support.erasure import scan
from tests.support.servers import ServerProcess

ADMIN_KEY = "admin-key-for-the-move-test"
VECTOR = [0.5, 0.5, 0.5, 0.5]


def _event(text: str, **more: Any) -> dict[str, Any]:
    return {"kind": "note", "text": text, "embedding": VECTOR, **more}


def _bytes_anywhere(root: Path, needle: bytes) -> list[str]:
    return scan(root, {"needle": needle}).get("needle", [])


@pytest.fixture(scope="module")
def nodes(pg_server: PrivatePostgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    database = f"move_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    url = pg_server.url(database)
    root = tmp_path_factory.mktemp("move")
    servers = {
        name: ServerProcess(
            root / name,
            {
                "MEMSPINE_CONTROL_URL": url,
                "MEMSPINE_ADMIN_KEY": ADMIN_KEY,
                "MEMSPINE_NODE": f"node-{name}",
            },
        )
        for name in ("a", "b")
    }
    for server in servers.values():
        server.start()
    try:
        yield {"url": url, "servers": servers, "root": root}
    finally:
        for server in servers.values():
            server.stop()


class Writer(threading.Thread):
    """Appends until stopped, to whichever node holds the tenant; remembers what was acked."""

    def __init__(self, key: str, urls: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.clients = {n: httpx.Client(base_url=u, timeout=30) for n, u in urls.items()}
        self.headers = {"Authorization": f"Bearer {key}"}
        self.node = "node-a"
        self.acked: list[str] = []
        self.refused = 0  # 503s while the writes were held
        self.failures: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            body = _event(f"written under the move {n}")
            r = self.clients[self.node].post("/v1/memory/event", json=body, headers=self.headers)
            if r.status_code == 201:
                self.acked.append(r.json()["event_id"])
            elif r.status_code == 421:  # it left: a proxy would route the next one there
                self.node = "node-b" if self.node == "node-a" else "node-a"
            elif r.status_code == 503:
                self.refused += 1
                time.sleep(min(float(r.headers.get("Retry-After", "1")), 1.0) / 20)
            else:
                self.failures.append(f"{r.status_code} {r.text}")
            time.sleep(0.002)


def _tenant_on_a(nodes: Any, prefix: str) -> tuple[str, str]:
    """A new tenant placed on node-a, and a key of it."""
    with PgControl.open(nodes["url"]) as db:
        tenant = db.create_tenant(f"{prefix}-{uuid.uuid4().hex[:6]}", actor="test", node="node-a")
        return tenant.tenant_id, db.create_key(tenant.tenant_id, "agent", actor="test").api_key


def test_a_tenant_moves_under_a_running_writer_and_loses_nothing(nodes: Any) -> None:
    a, b = nodes["servers"]["a"], nodes["servers"]["b"]
    tid, key = _tenant_on_a(nodes, "mover")
    auth = {"Authorization": f"Bearer {key}"}
    purged_before = f"purged-before-{uuid.uuid4().hex}"
    deleted_during = f"deleted-during-{uuid.uuid4().hex}"
    with httpx.Client(base_url=a.url, headers=auth, timeout=30) as ca:
        ids = [
            ca.post("/v1/memory/event", json=_event(f"fact {i}")).json()["event_id"]
            for i in range(200)
        ]
        linked = ca.post(
            "/v1/memory/event",
            json=_event("derived", properties={"source_event_ids": ids[:2]}),
            headers={"Idempotency-Key": "derive-once"},
        )
        assert linked.status_code == 201
        gone = ca.post("/v1/memory/event", json=_event(purged_before)).json()["event_id"]
        assert ca.delete(f"/v1/memory/event/{gone}", params={"purge": "true"}).status_code == 200
        doomed = ca.post("/v1/memory/event", json=_event(deleted_during)).json()["event_id"]
    assert not _bytes_anywhere(nodes["root"], purged_before.encode())

    writer = Writer(key, {"node-a": a.url, "node-b": b.url})
    writer.start()
    time.sleep(0.3)
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if line.startswith("round 1:"):  # copied once: its deletion must follow it to node-b
            r = httpx.delete(
                f"{a.url}/v1/memory/event/{doomed}",
                params={"purge": "true"},
                headers=auth,
                timeout=30,
            )
            assert r.status_code == 200, r.text

    with PgControl.open(nodes["url"]) as db:
        report = Mover(db, ADMIN_KEY, say=say).move(tid, "node-b")
        time.sleep(0.3)  # the writer goes on against node-b
        writer.stop.set()
        writer.join(10)
        assert db.placement(tid).node == "node-b"  # type: ignore[union-attr]
        with pytest.raises(Conflict, match="on node-b already"):
            db.begin_move(tid, "node-b", actor="test")
    assert not writer.failures, writer.failures[:3]
    # The copy on node-a goes: by the move's erase, or first by node-a's leftover sweep when its
    # heartbeat sees the tenant placed elsewhere (memspine/leftovers.py; then erased is False).
    assert report.deleted >= 1, (report, said)
    assert report.erased or not (a.data_dir / tid).exists(), report
    assert report.held_secs < 5.0, report
    print(f"move: {report}, writer acked {len(writer.acked)}, refused {writer.refused}")
    assert writer.node == "node-b" and len(writer.acked) > 10

    assert not (a.data_dir / tid).exists()
    assert (b.data_dir / tid).is_dir()
    with httpx.Client(base_url=b.url, headers=auth, timeout=30) as cb:
        held: set[str] = set()
        cursor = None
        while True:
            page = cb.get(
                "/v1/memory/events", params={"limit": 500, **({"cursor": cursor} if cursor else {})}
            ).json()
            held.update(e["event_id"] for e in page["events"])
            cursor = page.get("next_cursor")
            if not cursor:
                break
        assert set(ids) <= held and set(writer.acked) <= held
        assert doomed not in held and gone not in held
        r = cb.post(
            "/v1/memory/event",
            json=_event("derived", properties={"source_event_ids": ids[:2]}),
            headers={"Idempotency-Key": "derive-once"},
        )
        assert r.status_code == 200 and r.json()["event_id"] == linked.json()["event_id"]
        # Its SOURCE_FROM links came along: a cascade from its source reaches it.
        r = cb.delete(
            f"/v1/memory/event/{ids[0]}", params={"cascade": "derived", "dry_run": "true"}
        )
        assert r.json()["would_delete"] == [ids[0], linked.json()["event_id"]], r.text
        hits = cb.post("/v1/memory/recall", json={"text": "fact 7", "k": 3}).json()["hits"]
        assert hits and hits[0]["text"] == "fact 7"
    with httpx.Client(base_url=a.url, headers=auth, timeout=30) as ca:
        r = ca.get("/v1/memory/events")
        assert r.status_code == 421, r.text
    assert not (a.data_dir / tid).exists()  # the 421 opened nothing
    for secret in (purged_before, deleted_during):
        assert not _bytes_anywhere(nodes["root"], secret.encode()), secret


def test_a_move_carries_the_tenants_signed_receipts(nodes: Any) -> None:
    """The held round hands the source's receipts to the target: after the move the new node
    lists the erasure's receipt and serves it byte for byte, signed by the old node's key."""
    a, b = nodes["servers"]["a"], nodes["servers"]["b"]
    tid, key = _tenant_on_a(nodes, "signed")
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=a.url, headers=auth, timeout=60) as ca:
        for text, who in (("Ann's order", "c-ann"), ("Bob's order", "c-bob")):
            body = _event(text, subjects=[who])
            assert ca.post("/v1/memory/event", json=body).status_code == 201
        erased = ca.post("/v1/memory/subjects/c-ann/erase", json={"dry_run": False})
        assert erased.status_code == 200, erased.text
        receipt_id = erased.json()["receipt_id"]
        signed = ca.get(f"/v1/memory/receipts/{receipt_id}").content
        old_key = base64.b64decode(ca.get("/v1/receipts/key").json()["public_key"])
    with PgControl.open(nodes["url"]) as db:
        report = Mover(db, ADMIN_KEY, say=lambda _line: None).move(tid, "node-b")
    assert report.receipts == 1, report
    assert not (a.data_dir / tid).exists()
    with httpx.Client(base_url=b.url, headers=auth, timeout=30) as cb:
        listed = cb.get("/v1/memory/receipts").json()["receipts"]
        assert [r["receipt_id"] for r in listed] == [receipt_id]
        moved = cb.get(f"/v1/memory/receipts/{receipt_id}").content
    assert moved == signed
    assert receipts.verify(moved, old_key) is not None


def test_a_move_carries_the_tenants_read_records_and_the_chain_verifies_there(
    nodes: Any,
) -> None:
    """The node the tenant left hands its read log to the new node before erasing its copy:
    the records made there come first, those made on the new node after, one chain that
    verifies against the heads the control plane kept."""
    from memspine_admin.readaudit import verify_reads
    from storage.readlog import records

    a, b = nodes["servers"]["a"], nodes["servers"]["b"]
    tid, key = _tenant_on_a(nodes, "read")
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=a.url, headers=auth, timeout=60) as ca:
        made = ca.post("/v1/memory/event", json=_event("the parcel")).json()["event_id"]
        before = [
            ca.get(f"/v1/memory/event/{made}", headers={"Memspine-Purpose": f"a{i}"})
            for i in range(3)
        ]
        assert all(r.status_code == 200 for r in before)
    with PgControl.open(nodes["url"]) as db:
        report = Mover(db, ADMIN_KEY, say=lambda _line: None).move(tid, "node-b")
        # Erased by the move's last step, or first by node-a's leftover sweep: either hands over.
        assert report.erased or not (a.data_dir / tid).exists(), report
        with httpx.Client(base_url=b.url, headers=auth, timeout=60) as cb:
            r = cb.get(f"/v1/memory/event/{made}", headers={"Memspine-Purpose": "b"})
            assert r.status_code == 200
        deadline = time.monotonic() + 30
        while len(list(records(b.data_dir / tid))) < 4:  # buffered: committed within 100 ms
            assert time.monotonic() < deadline
            time.sleep(0.05)
        found = [f.read for f in records(b.data_dir / tid)]
        assert [x.purpose for x in found] == ["a0", "a1", "a2", "b"]
        assert [x.request_id for x in found[:3]] == [r.headers["x-request-id"] for r in before]
        verdict = verify_reads(b.data_dir, db, tid)
        assert verdict.ok and verdict.checked == 4, verdict
    assert not (a.data_dir / tid).exists()


def test_verify_during_a_moves_hand_over_says_move_in_progress_then_intact(nodes: Any) -> None:
    """The source dies between the switch and its copy's erase, so its read records are not
    handed over: verify on the new node says the move is in progress (exit 4), not tampered;
    the source back, its leftover sweep hands them over and the chain verifies whole."""
    import signal
    import subprocess
    import sys

    from memspine_admin.readaudit import verify_reads
    from storage.readlog import awaits_carried, records
    from tests.support.wait import wait_until

    a, b = nodes["servers"]["a"], nodes["servers"]["b"]
    tid, key = _tenant_on_a(nodes, "window")
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=a.url, headers=auth, timeout=60) as ca:
        made = ca.post("/v1/memory/event", json=_event("the window")).json()["event_id"]
        for i in range(3):
            r = ca.get(f"/v1/memory/event/{made}", headers={"Memspine-Purpose": f"a{i}"})
            assert r.status_code == 200
    wait_until(lambda: len(list(records(a.data_dir / tid))) == 3, "node-a's records written")

    def kill_source_first(request: httpx.Request) -> None:
        if request.method == "DELETE" and str(request.url).startswith(a.url):
            a.stop(signal.SIGKILL)  # the erase, and so the hand-over, never happens

    def client(url: str, admin_key: str) -> httpx.Client:
        return httpx.Client(
            base_url=url,
            headers={"Authorization": f"Bearer {admin_key}"},
            timeout=60,
            event_hooks={"request": [kill_source_first]},
        )

    try:
        with PgControl.open(nodes["url"]) as db:
            with pytest.raises(MemspineError):
                Mover(db, ADMIN_KEY, say=lambda _line: None, client=client).move(tid, "node-b")
            with httpx.Client(base_url=b.url, headers=auth, timeout=60) as cb:
                r = cb.get(f"/v1/memory/event/{made}", headers={"Memspine-Purpose": "b"})
                assert r.status_code == 200
            wait_until(lambda: len(list(records(b.data_dir / tid))) == 1, "node-b's record")
            assert awaits_carried(b.data_dir / tid)
            verdict = verify_reads(b.data_dir, db, tid)
            assert (verdict.ok, verdict.pending, verdict.bad_seq) == (False, True, None), verdict
            env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
            env.update({"MEMSPINE_DATA_DIR": str(b.data_dir), "MEMSPINE_CONTROL_URL": nodes["url"]})
            cli = subprocess.run(
                [sys.executable, "-m", "memspine_admin.cli", "audit", "verify", tid],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert cli.returncode == 4, cli.stdout + cli.stderr
            assert "MOVE IN PROGRESS" in cli.stdout and "BROKEN" not in cli.stdout
            a.start()  # its leftover sweep hands the records over, then erases its copy
            wait_until(
                lambda: not (a.data_dir / tid).exists() and not awaits_carried(b.data_dir / tid),
                "node-a's read records handed over",
            )
            found = [f.read for f in records(b.data_dir / tid)]
            assert [x.purpose for x in found] == ["a0", "a1", "a2", "b"]
            verdict = verify_reads(b.data_dir, db, tid)
            assert verdict.ok and not verdict.pending and verdict.checked == 4, verdict
    finally:
        if a.proc is None:
            a.start()

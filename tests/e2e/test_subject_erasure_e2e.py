"""Erasure by subject through a real server and the real CLI: canaries (a name, an email, an
order number) in text, properties, a vector, a derived event and an untagged tool call leave
every file of the data directory; the receipt says so and verifies; a backup and an export
taken before bring none of them back; the seed's support session goes in one request; a kill
or a full disk mid-erasure leaves nothing half-done."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.budget import size
from tests.support.erasure import REPLY_TS, SUPPORT, door_turn_patterns, embedding_patterns, scan
from tests.support.servers import REPO, ServerProcess

TENANT = "shop-1"
NAME, EMAIL, ORDER = "Zelda Quarrington", "zelda.q@example.org", "ORD-77123-XQ"
VECTOR = [0.123456789, -0.987654321, 0.555111222, 0.314159265]
SCRIPT = Path(sys.executable).parent / "memspine-admin"
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "memspine_admin.cli"]
MIN = 60_000_000


def admin(data_dir: Path | None, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """memspine-admin as its own process (MEMSPINE_DATA_DIR set to data_dir, if given)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
    if data_dir is not None:
        full["MEMSPINE_DATA_DIR"] = str(data_dir)
    full.update(env)
    return subprocess.run(
        [*COMMAND, *args], capture_output=True, text=True, env=full, cwd=REPO, timeout=120
    )


def post(client: httpx.Client, text: str, key: str | None = None, **extra: Any) -> str:
    headers = {"Idempotency-Key": key} if key else {}
    resp = client.post(
        "/v1/memory/event", json={"kind": "note", "text": text, **extra}, headers=headers
    )
    assert resp.status_code == 201, resp.text
    return str(resp.json()["event_id"])


def world(client: httpx.Client) -> dict[str, str]:
    """Her canaries everywhere, and two events about nobody."""
    ids = {
        "turn": post(
            client,
            f"Hi, I am {NAME}, write to {EMAIL}",
            "k-turn",
            subjects=["c-42"],
            embedding=VECTOR,
        ),
        "order": post(client, "order placed", subjects=["c-42"], properties={"order": ORDER}),
        "keep": post(client, "noon weather report", "k-keep"),
        "keep2": post(client, "the shop opens at nine"),
    }
    ids["fact"] = post(
        client, f"{NAME} prefers evenings", properties={"source_event_ids": [ids["turn"]]}
    )
    ids["call"] = post(client, f"lookup_order({ORDER}) -> shipped", kind="tool_call")
    return ids


CANARIES = {"name": NAME.encode(), "email": EMAIL.encode(), "order": ORDER.encode()}


def canaries_in(root: Path) -> dict[str, list[str]]:
    """Where under root a canary (text, any case, or the vector in any encoding) is found."""
    # scan, not a walk of its own: a Tantivy temp file may go between the listing and the read
    found = scan(root, {k: v.lower() for k, v in CANARIES.items()}, any_case=True)
    for label, paths in scan(root, embedding_patterns(VECTOR)).items():
        found.setdefault(f"vector {label}", []).extend(paths)
    return found


def test_canaries_leave_every_file_and_no_copy_brings_them_back(
    start_server: Any, tmp_path: Path
) -> None:
    server: ServerProcess = start_server()
    data_dir = server.data_dir
    client = server.client(TENANT)
    ids = world(client)
    assert canaries_in(data_dir)  # the scan sees them while they are there
    # a backup and an export taken before the erasure
    backup = tmp_path / "backups" / "b1"
    done = admin(data_dir, "backup", str(backup))
    assert done.returncode == 0, done.stderr
    exported = client.get("/v1/memory/export").content
    assert ORDER.encode() in exported

    dry = client.post(
        "/v1/memory/subjects/c-42/erase", json={"identifiers": [NAME, EMAIL, ORDER]}
    ).json()
    found = {e["event_id"]: e["reasons"] for e in dry["events"]}
    assert found == {
        ids["turn"]: ["subject", "identifier"],
        ids["order"]: ["subject", "identifier"],
        ids["fact"]: ["identifier", "derived"],
        ids["call"]: ["identifier"],
    }
    resp = client.post(
        "/v1/memory/subjects/c-42/erase",
        json={"dry_run": False, "identifiers": [NAME, EMAIL, ORDER], "confirm_ids": [ids["call"]]},
    )
    assert resp.status_code == 200, resp.text
    out = resp.json()
    erased = {ids[k] for k in ("turn", "order", "fact", "call")}
    assert set(out["deleted_ids"]) == erased
    receipt = out["receipt"]["receipt"]
    assert receipt["clean"] is True, receipt
    assert {c["kind"] for c in receipt["copies_before"]} == {"backup", "export"}
    assert canaries_in(data_dir) == {}

    # the receipt verifies with the CLI; a changed byte does not
    body = client.get(f"/v1/memory/receipts/{out['receipt_id']}").content
    (tmp_path / "r.json").write_bytes(body)
    assert admin(data_dir, "receipt", "verify", str(tmp_path / "r.json")).returncode == 0
    (tmp_path / "bad.json").write_bytes(body.replace(b'"clean":true', b'"clean":fals'))
    assert admin(data_dir, "receipt", "verify", str(tmp_path / "bad.json")).returncode == 1

    # a retried append of an erased event replays and stores nothing
    again = client.post(
        "/v1/memory/event",
        json={
            "kind": "note",
            "text": f"Hi, I am {NAME}, write to {EMAIL}",
            "subjects": ["c-42"],
            "embedding": VECTOR,
        },
        headers={"Idempotency-Key": "k-turn"},
    )
    assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (200, "true")
    assert client.get(f"/v1/memory/event/{ids['turn']}").status_code == 404

    # the backup taken before, restored (the live data directory's ledger applies)
    restored = tmp_path / "restored"
    done = admin(data_dir, "--data-dir", str(restored), "restore", str(backup))
    assert done.returncode == 0, done.stderr
    assert "erased_dropped: 4" in done.stdout
    assert canaries_in(restored) == {}
    # ... and restored again from there: its ledger came along
    again_dir = tmp_path / "restored-again"
    backup2 = tmp_path / "backups2" / "b2"
    assert admin(restored, "backup", str(backup2)).returncode == 0
    done = admin(
        None, "--data-dir", str(again_dir), "restore", str(backup), "--ledger-from", str(backup2)
    )
    assert done.returncode == 0, done.stderr
    assert "erased_dropped: 4" in done.stdout and canaries_in(again_dir) == {}

    # the export taken before, imported beside the running server into another tenant
    (tmp_path / "export.ndjson").write_bytes(exported)
    done = admin(data_dir, "import", "copy-1", "--in", str(tmp_path / "export.ndjson"))
    assert done.returncode == 0, done.stderr
    assert "erased_dropped: 4" in done.stdout
    with server.client("copy-1") as copy:
        assert copy.get(f"/v1/memory/event/{ids['keep']}").status_code == 200
        assert copy.get(f"/v1/memory/event/{ids['turn']}").status_code == 404
    assert canaries_in(data_dir) == {}
    client.close()


def test_the_seed_support_session_goes_in_one_request(start_server: Any) -> None:
    server: ServerProcess = start_server()
    client = server.client("support-1")
    ids: dict[str, str] = {}
    for name, minutes, kind, text, embedding, sources in SUPPORT:
        body: dict[str, Any] = {"kind": kind, "ts": int(REPLY_TS + minutes * MIN), "text": text}
        if embedding is not None:
            body["embedding"] = embedding
        if sources:
            body["properties"] = {"source_event_ids": [ids[s] for s in sources]}
        if text.startswith("Customer:"):
            body["subjects"] = ["customer-88213"]
        resp = client.post("/v1/memory/event", json=body)
        assert resp.status_code == 201, resp.text
        ids[name] = resp.json()["event_id"]
    resp = client.post("/v1/memory/subjects/customer-88213/erase", json={"dry_run": False})
    assert resp.status_code == 200, resp.text
    deleted = set(resp.json()["deleted_ids"])
    # her three turns, and what was derived from them: the reply, the case fact, the door fact
    names = {"message", "objection", "door_turn", "reply", "case_fact", "door_fact"}
    assert deleted == {ids[n] for n in names}
    assert scan(server.data_dir, door_turn_patterns()) == {}
    assert scan(server.data_dir, {"door code 4471": b"door code 4471"}) == {}
    for name in ("get_order", "track", "open_case", "handover"):
        assert client.get(f"/v1/memory/event/{ids[name]}").status_code == 200
    client.close()


@pytest.mark.long
def test_a_kill_or_a_full_disk_mid_erasure_leaves_nothing_half_done(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir).start()
    client = server.client(TENANT)
    tagged = [post(client, f"{NAME} event {i}", subjects=["c-42"]) for i in range(30)]
    client.close()
    server.stop()

    def state() -> tuple[int, int]:
        """(tagged events still live, receipts kept)."""
        s = ServerProcess(data_dir).start()
        try:
            with s.client(TENANT) as c:
                live = sum(c.get(f"/v1/memory/event/{e}").status_code == 200 for e in tagged)
                kept = len(c.get("/v1/memory/receipts").json()["receipts"])
        finally:
            s.stop()
        return live, kept

    # a full disk at the delete's commit: 503-like refusal, nothing deleted, no receipt
    done = admin(
        data_dir, "subject", "erase", TENANT, "c-42", MEMSPINE_FAILPOINTS="log.commit=enospc"
    )
    assert done.returncode != 0 and "disk" in done.stderr.lower(), done.stderr
    assert state() == (30, 0)
    # the disk fills at the purge's copy: the delete stands (one transaction), no receipt, and
    # the next purge erases the bytes
    done = admin(
        data_dir, "subject", "erase", TENANT, "c-42", MEMSPINE_FAILPOINTS="purge.copy=enospc"
    )
    assert done.returncode != 0, done.stdout
    assert state() == (0, 0)
    server = ServerProcess(data_dir, {"MEMSPINE_PURGE_INTERVAL_SECS": "0.2"}).start()
    deadline = time.monotonic() + 60
    # scan, not rglob: the purge's swap renames directories away while the walk runs
    while scan(data_dir / TENANT, {"as sent": NAME.encode(), "lowercase": NAME.lower().encode()}):
        assert time.monotonic() < deadline, "the background purger did not erase the bytes"
        time.sleep(0.2)
    server.stop()

    # kill -9 at random moments of a real run: all or nothing, a receipt only if all
    rng = random.Random(31)
    before = 0
    for attempt in range(size(3, 1)):  # kills: one in make test (tests/support/budget.py)
        server = ServerProcess(data_dir).start()
        with server.client(TENANT) as c:
            tagged = [post(c, f"{NAME} round {attempt} {i}", subjects=["c-42"]) for i in range(30)]
        server.stop()
        full = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
        full["MEMSPINE_DATA_DIR"] = str(data_dir)
        proc = subprocess.Popen(
            [*COMMAND, "subject", "erase", TENANT, "c-42"],
            env=full,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.3, 3.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        live, kept = state()
        assert live in (0, 30), live
        if live == 30:
            assert kept == before  # no receipt for this round
        else:
            assert kept in (before, before + 1)
        before = kept
    receipts_dir = data_dir / "_receipts" / TENANT
    for path in receipts_dir.glob("*.json"):
        assert json.loads(path.read_bytes())["receipt"]["clean"] is True

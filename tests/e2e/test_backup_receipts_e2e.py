"""A backup carries each tenant's signed erasure receipts and the key that signed them, with its
read log: restored into a new data directory, the receipts are listed by a server on it and
`memspine-admin receipt verify` trusts them against that directory's key (the same key, so the
restored server's public key is the old one), and `audit verify` still verifies the read chain,
the access export's record among them. A crafted backup's linked receipt is not copied in."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from memspine_admin.control import ControlDB
from storage import receipts
from tests.support.admin import Admin
from tests.support.servers import REPO, ServerProcess, cheap_hasher


def admin(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """memspine-admin as its own process on data_dir."""
    result: subprocess.CompletedProcess[str] = Admin(data_dir, REPO).run(*args)
    return result


def test_backup_and_restore_carry_receipts_and_read_records(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with ControlDB.open(data, create=True, hasher=cheap_hasher()) as db:
        tenant = db.create_tenant("acme", actor="test").tenant_id
        rw = db.create_key(tenant, "rw", ("read", "write"), actor="test").api_key
    env = {"MEMSPINE_READ_AUDIT": "durable"}
    server = ServerProcess(data, env).start()
    try:
        with server.client(rw) as c:
            for text, subject in (("Ann's order", "cust-ann"), ("Bob's order", "cust-bob")):
                body = {"kind": "turn", "text": text, "subjects": [subject]}
                assert c.post("/v1/memory/event", json=body).status_code == 201
            export = c.get("/v1/memory/subjects/cust-bob/export")
            assert export.status_code == 200
            erased = c.post("/v1/memory/subjects/cust-ann/erase", json={"dry_run": False})
            assert erased.status_code == 200, erased.text
            receipt_id = erased.json()["receipt_id"]
            key = c.get("/v1/receipts/key").json()["public_key"]
    finally:
        server.stop()  # the read writer hands its chain heads over when it stops
    assert admin(data, "audit", "verify", tenant).returncode == 0

    made = admin(data, "--json", "backup", str(tmp_path / "bk"))
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["receipts"] == 1
    restored = tmp_path / "restored"
    done = admin(restored, "--json", "restore", str(tmp_path / "bk"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["receipts"] == 1

    kept = restored / receipts.DIR / tenant / f"{receipt_id}.json"
    assert kept.read_bytes() == (data / receipts.DIR / tenant / f"{receipt_id}.json").read_bytes()
    verdict = admin(restored, "--json", "receipt", "verify", str(kept))
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    assert json.loads(verdict.stdout)["receipt"]["receipt_id"] == receipt_id
    audit = admin(restored, "--json", "audit", "verify", tenant)
    assert audit.returncode == 0, audit.stdout + audit.stderr

    again = ServerProcess(restored, env).start()
    try:
        with again.client(rw) as c:
            listed = c.get("/v1/memory/receipts").json()["receipts"]
            assert [r["receipt_id"] for r in listed] == [receipt_id]
            assert c.get("/v1/receipts/key").json()["public_key"] == key
    finally:
        again.stop()


def test_a_restore_copies_no_linked_receipt(tmp_path: Path) -> None:
    """A crafted backup whose receipt file is a link (to a secret of the machine) restores
    without it; a plain one beside it comes in."""
    data = tmp_path / "data"
    server = ServerProcess(data).start()
    try:
        with server.client("acme") as c:
            assert c.post("/v1/memory/event", json={"kind": "n", "text": "x"}).status_code == 201
    finally:
        server.stop()
    assert admin(data, "backup", str(tmp_path / "bk")).returncode == 0
    folder = tmp_path / "bk" / receipts.DIR / "acme"
    folder.mkdir(parents=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for a data directory")
    (folder / f"{'a' * 32}.json").symlink_to(secret)
    (folder / f"{'b' * 32}.json").write_text("{}")
    restored = tmp_path / "restored"
    done = admin(restored, "--json", "restore", str(tmp_path / "bk"))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (restored / receipts.DIR / "acme").iterdir()) == [
        f"{'b' * 32}.json"
    ]

"""Backup and restore of a data directory on real stores: a restore answers every question as
the original did with indexes rebuilt from the logs, a backup holds no deleted event's bytes,
and a backup or restore killed half-way leaves its target absent (tests/support/transfer_world.py
builds the tenants)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import lmdb
import msgspec
import pytest

from storage import files
from storage.errors import Conflict, InvalidRequest
from storage.model import NewEvent
from storage.tenants.tenant import Tenant
from storage.transfer import backup as bk
from tests.support.transfer_world import DIM, answers, populate

REPO = Path(__file__).resolve().parents[2]
CONTROL = ("_control", 1 << 24)


def _control_env(data_dir: Path) -> None:
    """An LMDB environment where the control database lives, with one record."""
    env = lmdb.open(str(data_dir / "_control"), map_size=CONTROL[1], max_dbs=2)
    with env.begin(write=True) as txn:
        txn.put(b"tenant", b"acme")
    env.close()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """A data directory of two populated tenants (closed) and a control environment, with
    each tenant's answers."""
    data_dir = tmp_path_factory.mktemp("source") / "data"
    seen: dict[str, object] = {}
    for tenant_id, seed in (("acme", 7), ("globex", 8)):
        t = Tenant.open(tenant_id, data_dir / tenant_id, embedding_dim=DIM)
        try:
            ids = populate(t, seed=seed, n=90)
            t.purge()  # the deletions populate left pending: BM25 counts them until then
            seen[tenant_id] = (ids, answers(t, ids))
        finally:
            t.close()
    _control_env(data_dir)
    return data_dir, seen


def test_a_restore_answers_every_question_alike(source, tmp_path: Path) -> None:
    data_dir, seen = source
    stats = bk.backup(data_dir, tmp_path / "bk", environments=[CONTROL])
    assert (stats.tenants, stats.environments) == (2, ["_control"])
    held = {p.relative_to(tmp_path / "bk").parts[:3] for p in (tmp_path / "bk").rglob("*")}
    assert ("tenants", "acme", files.KEYWORD) not in held  # logs only: indexes are rebuilt
    assert not list((tmp_path / "bk").rglob(files.VECTORS))
    restored = bk.restore(tmp_path / "bk", tmp_path / "new", default_dim=DIM)
    assert restored.events == stats.events
    for tenant_id, (ids, before) in seen.items():  # type: ignore[misc]
        t = Tenant.open(tenant_id, tmp_path / "new" / tenant_id, embedding_dim=DIM)
        try:
            assert answers(t, ids) == before
        finally:
            t.close()
    env = lmdb.open(str(tmp_path / "new" / "_control"), map_size=CONTROL[1], max_dbs=2)
    with env.begin() as txn:
        assert txn.get(b"tenant") == b"acme"
    env.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bk", "new"]  # no stage left


def test_a_backup_holds_no_byte_of_a_deleted_event(tmp_path: Path) -> None:
    """Deleted and purged, or deleted and awaiting its purge: its text is on no backup page,
    while the live log (not purged yet) still holds it."""
    data_dir = tmp_path / "data"
    t = Tenant.open("acme", data_dir / "acme", embedding_dim=DIM)
    secrets = [b"door code 4417 purged-one", b"door code 9921 pending-one"]
    ids = [
        t.submit_append([NewEvent(kind="turn", ts=1 + i, text=s.decode())]).result()[0].event_id
        for i, s in enumerate(secrets)
    ]
    t.submit_append([NewEvent(kind="turn", ts=9, text="kept")]).result()
    t.submit_delete([ids[0]]).result()
    t.purge()
    t.submit_delete([ids[1]]).result()  # awaits the next purge
    t.close()
    assert secrets[1] in (data_dir / "acme" / files.LOG / "data.mdb").read_bytes()
    bk.backup(data_dir, tmp_path / "bk")
    for path in (tmp_path / "bk").rglob("*"):
        if path.is_file():
            blob = path.read_bytes()
            assert not any(s in blob for s in secrets), path
    assert b"kept" in (tmp_path / "bk" / "tenants" / "acme" / files.LOG / "data.mdb").read_bytes()


def test_a_backup_or_restore_goes_only_into_an_empty_place(source, tmp_path: Path) -> None:
    data_dir, _seen = source
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(Conflict, match="not empty"):
        bk.backup(data_dir, tmp_path / "full")
    (tmp_path / "empty").mkdir()
    bk.backup(data_dir, tmp_path / "empty")  # an empty directory is taken
    with pytest.raises(Conflict, match="not empty"):
        bk.restore(tmp_path / "empty", tmp_path / "full")
    with pytest.raises(InvalidRequest, match="not a memspine backup"):
        bk.restore(tmp_path / "full", tmp_path / "new")
    manifest = tmp_path / "empty" / bk.MANIFEST
    body = msgspec.json.decode(manifest.read_bytes())
    manifest.write_bytes(msgspec.json.encode({**body, "version": 99}))
    with pytest.raises(InvalidRequest, match="version 99"):
        bk.restore(tmp_path / "empty", tmp_path / "new")
    manifest.write_bytes(b'{"format": "memspine-backup", "vers')
    with pytest.raises(InvalidRequest, match="damaged"):
        bk.restore(tmp_path / "empty", tmp_path / "new")
    assert not (tmp_path / "new").exists()


KILLED = """
import sys, time
from pathlib import Path
from storage.transfer import backup as bk
import storage.transfer.load as load

load.BATCH_EVENTS = 10
def slow(tenant_id, n):
    print("done", tenant_id, n, flush=True)
    time.sleep(60)
if sys.argv[1] == "backup":
    bk.backup(Path(sys.argv[2]), Path(sys.argv[3]), progress=slow)
else:
    bk.restore(Path(sys.argv[2]), Path(sys.argv[3]), default_dim=4, progress=slow)
"""


def _kill_after_first_step(*args: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, *args],
        stdout=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith(b"done")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_backup_and_a_restore_killed_half_way_leave_no_target(source, tmp_path: Path) -> None:
    data_dir, seen = source
    _kill_after_first_step("backup", str(data_dir), str(tmp_path / "bk"))
    assert not (tmp_path / "bk").exists()
    (stage,) = tmp_path.iterdir()  # the killed one's stage, hidden, holding one tenant
    assert stage.name.startswith(".bk" + bk.PARTIAL)
    bk.backup(data_dir, tmp_path / "bk")  # sweeps it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bk"]

    _kill_after_first_step("restore", str(tmp_path / "bk"), str(tmp_path / "new"))
    assert not (tmp_path / "new").exists()
    bk.restore(tmp_path / "bk", tmp_path / "new", default_dim=DIM)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bk", "new"]
    ids, before = seen["globex"]  # type: ignore[misc]
    t = Tenant.open("globex", tmp_path / "new" / "globex", embedding_dim=DIM)
    try:
        assert answers(t, ids)["get"] == before["get"]
    finally:
        t.close()

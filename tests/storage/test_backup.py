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


def _crafted(source: tuple[Path, dict[str, object]], at: Path) -> tuple[Path, dict[str, object]]:
    """A true backup of `source` at `at`, and its manifest as a dict to craft."""
    data_dir, _seen = source
    bk.backup(data_dir, at, environments=[CONTROL])
    return at, msgspec.json.decode((at / bk.MANIFEST).read_bytes())


def _write_manifest(at: Path, manifest: dict[str, object]) -> None:
    (at / bk.MANIFEST).write_bytes(msgspec.json.encode(manifest))


def test_a_restore_refuses_a_crafted_environment_that_would_write_outside(
    source, tmp_path: Path
) -> None:
    src, manifest = _crafted(source, tmp_path / "a" / "bk")
    # src/../outside holds a data file; the stage's ../outside is beside the target.
    (tmp_path / "a" / "outside").mkdir()
    (tmp_path / "a" / "outside" / "data.mdb").write_bytes(b"planted")
    for name in ("../outside", "..", "", "x/../../outside", "tenants", "acme"):
        _write_manifest(src, {**manifest, "environments": [name]})
        with pytest.raises(InvalidRequest, match="environment"):
            bk.restore(src, tmp_path / "new", default_dim=DIM)
    assert not (tmp_path / "outside").exists() and not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no stage left either


def test_a_restore_refuses_a_symlinked_data_file(source, tmp_path: Path) -> None:
    src, manifest = _crafted(source, tmp_path / "bk")
    secret = tmp_path / "secret"
    secret.write_bytes(b"any file the operator can read")
    (src / "_control" / "data.mdb").unlink()
    (src / "_control" / "data.mdb").symlink_to(secret)
    with pytest.raises(InvalidRequest, match="plain file"):
        bk.restore(src, tmp_path / "new", default_dim=DIM)
    # The same for a tenant's log file, and for a directory on the way to it.
    (src / "_control" / "data.mdb").unlink()
    _write_manifest(src, {**manifest, "environments": []})
    log = src / "tenants" / "acme" / files.LOG
    (log / "data.mdb").rename(tmp_path / "acme.mdb")
    (log / "data.mdb").symlink_to(tmp_path / "acme.mdb")
    with pytest.raises(InvalidRequest, match="plain file"):
        bk.restore(src, tmp_path / "new", default_dim=DIM)
    (log / "data.mdb").unlink()
    (tmp_path / "acme.mdb").rename(log / "data.mdb")
    log.rename(tmp_path / "elsewhere")
    log.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InvalidRequest, match="plain file"):
        bk.restore(src, tmp_path / "new", default_dim=DIM)
    assert not (tmp_path / "new").exists()


def test_a_restore_refuses_a_symlinked_tenant_that_would_clone_another(
    source, tmp_path: Path
) -> None:
    src, manifest = _crafted(source, tmp_path / "bk")
    acme = next(e for e in manifest["tenants"] if e["tenant_id"] == "acme")  # type: ignore[attr-defined]
    (src / "tenants" / "clone").symlink_to(src / "tenants" / "acme")
    tenants = [*manifest["tenants"], {"tenant_id": "clone", "events": acme["events"]}]  # type: ignore[misc]
    _write_manifest(src, {**manifest, "tenants": tenants})
    with pytest.raises(InvalidRequest, match="clone"):
        bk.restore(src, tmp_path / "new", default_dim=DIM)
    assert not (tmp_path / "new").exists()
    # Without the crafted entry the same backup restores.
    _write_manifest(src, manifest)
    assert bk.restore(src, tmp_path / "new", default_dim=DIM).tenants == 2

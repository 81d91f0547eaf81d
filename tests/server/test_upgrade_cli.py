"""`memspine-admin upgrade`: every tenant of a data directory opened once, its log migrated to
this version's format before any client asks (docs/operations.md, "Upgrading")."""

from __future__ import annotations

from pathlib import Path

from storage import files
from storage.datalock import hold
from storage.log import layout
from storage.log.eventlog import SCHEMA_VERSION, snapshot
from storage.model import NewEvent
from storage.tenants.tenant import Tenant
from tests.support.admin import Admin
from tests.support.control import T0
from tests.support.oldlog import make_v6


def _schema(log: Path) -> int | None:
    with snapshot(log) as r:
        return r.meta_int(layout.SCHEMA)


def test_every_tenant_is_migrated_and_keeps_its_events(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    ids: dict[str, list[str]] = {}
    for name in ("acme", "globex"):
        tenant = Tenant.open(name, data_dir / name, embedding_dim=4)
        try:
            events = [NewEvent(kind="turn", ts=T0 + i, text=f"{name} {i}") for i in range(30)]
            ids[name] = [a.event_id for a in tenant.submit_append(events).result()]
        finally:
            tenant.close()
        make_v6(data_dir / name / files.LOG)
        assert _schema(data_dir / name / files.LOG) == 6
    admin = Admin(data_dir, tmp_path, in_process=True)
    done = admin.json("upgrade")
    assert done["tenants"] == 2
    for name, made in ids.items():
        log = data_dir / name / files.LOG
        assert _schema(log) == SCHEMA_VERSION
        with snapshot(log) as r:
            assert [r.get(e).text for e in made] == [f"{name} {i}" for i in range(30)]  # type: ignore[union-attr]
    assert admin.json("upgrade")["tenants"] == 2  # again: each opens as it is, nothing changes


def test_a_served_data_directory_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    tenant = Tenant.open("acme", data_dir / "acme", embedding_dim=4)
    try:
        tenant.submit_append([NewEvent(kind="turn", ts=T0, text="kept")]).result()
    finally:
        tenant.close()
    make_v6(data_dir / "acme" / files.LOG)
    admin = Admin(data_dir, tmp_path, in_process=True)
    lock = hold(data_dir, "memspine-server", "http://127.0.0.1:7781")  # as a running server does
    try:
        refused = admin.error("upgrade")
    finally:
        lock.close()
    assert refused["error"] == "conflict", refused
    assert "memspine-server" in refused["detail"] and "stop it" in refused["detail"], refused
    assert _schema(data_dir / "acme" / files.LOG) == 6  # not opened: the server's files untouched
    assert admin.json("upgrade")["tenants"] == 1  # once the server is gone
    assert _schema(data_dir / "acme" / files.LOG) == SCHEMA_VERSION

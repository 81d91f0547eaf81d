"""The erasure ledger (storage/transfer/ledger.py, the log's "erased" database): written by
every delete, kept by the purge and pruned by its age, carried by a move's export and by
backups, applied by import and restore."""

from __future__ import annotations

import io
import time
from pathlib import Path

from storage.model import NewEvent
from storage.tenants.tenant import Tenant
from storage.transfer import backup as bk
from storage.transfer import ledger
from storage.transfer.export import export_lines, tenant_export
from storage.transfer.landing import import_tenant

DIM = 4
TS = 1_800_000_000_000_000


def fill(t: Tenant, n: int) -> list[str]:
    events = [NewEvent(kind="note", ts=TS + i, text=f"note {i}") for i in range(n)]
    return [r.event_id for r in t.submit_append(events).result()]  # type: ignore[union-attr]


def test_a_delete_is_in_the_ledger_past_its_purge_until_it_is_too_old(tmp_path: Path) -> None:
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=DIM)
    try:
        a, b, _c = fill(t, 3)
        before = time.time_ns() // 1000
        assert t.submit_delete([a, b]).result() == [a, b]
        t.purge()
        held = t.snapshot_read(ledger.of_log)
        assert set(held) == {a, b} and all(at >= before for at in held.values())
        t.ledger_days = 1e-12  # every entry is older than that
        fill(t, 1)
        t.submit_delete([_c]).result()
        time.sleep(0.01)
        t.purge()
        assert t.snapshot_read(ledger.of_log) == {}
    finally:
        t.close()


def test_an_import_drops_what_a_ledger_of_the_data_dir_names(tmp_path: Path) -> None:
    data = tmp_path / "data"
    t = Tenant.open("src", data / "src", embedding_dim=DIM)
    try:
        ids = fill(t, 4)
        with tenant_export(t) as lines:
            before = b"".join(lines)
        t.submit_delete(ids[:2]).result()
    finally:
        t.close()
    stats = import_tenant(data, "copy", io.BytesIO(before))
    assert (stats.events, stats.erased_dropped) == (2, 2)
    copy = Tenant.open("copy", data / "copy", embedding_dim=DIM)
    try:
        assert [copy.get(e) is None for e in ids] == [True, True, False, False]
    finally:
        copy.close()


def test_a_moves_export_carries_the_ledger_to_the_new_tenant(tmp_path: Path) -> None:
    t = Tenant.open("src", tmp_path / "a" / "src", embedding_dim=DIM)
    try:
        ids = fill(t, 3)
        t.submit_delete([ids[0]]).result()
        moved = t.snapshot_read(lambda r: b"".join(export_lines(r, "src", ledger=True)))
        plain = t.snapshot_read(lambda r: b"".join(export_lines(r, "src")))
    finally:
        t.close()
    assert ids[0].encode() in moved and ids[0].encode() not in plain
    stats = import_tenant(tmp_path / "b", "src", io.BytesIO(moved))
    assert stats.events == 2
    assert set(ledger.of_tenant(tmp_path / "b" / "src")) == {ids[0]}


def test_a_restore_applies_the_ledgers_it_is_given_and_keeps_them(tmp_path: Path) -> None:
    data = tmp_path / "data"
    t = Tenant.open("t1", data / "t1", embedding_dim=DIM)
    try:
        ids = fill(t, 5)
        t.close()
        bk.backup(data, tmp_path / "b1")
        t = Tenant.open("t1", data / "t1", embedding_dim=DIM)
        t.submit_delete(ids[:3]).result()
        t.purge()
    finally:
        t.close()
    stats = bk.restore(tmp_path / "b1", tmp_path / "r1", erased=ledger.of_path(data))
    assert (stats.events, stats.erased_dropped) == (2, 3)
    assert set(ledger.of_tenant(tmp_path / "r1" / "t1")) == set(ids[:3])
    # a backup of the restored directory carries the ledger: it applies to the first backup
    bk.backup(tmp_path / "r1", tmp_path / "b2")
    again = bk.restore(tmp_path / "b1", tmp_path / "r2", erased=ledger.of_path(tmp_path / "b2"))
    assert again.erased_dropped == 3
    r2 = Tenant.open("t1", tmp_path / "r2" / "t1", embedding_dim=DIM)
    try:
        assert [r2.get(e) is None for e in ids] == [True, True, True, False, False]
    finally:
        r2.close()

"""The receipt's scan of a tenant's files (storage/erasure/scan.py): every needle found wherever
it stands in a file, whatever the case, across a chunk's edge, and after hex that looks like the
start of another id; a needle that is nowhere maps to []."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest

from storage.erasure import scan
from storage.model import NewEvent
from storage.tenants.tenant import Tenant


def test_every_id_and_identifier_is_found_where_it_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scan, "CHUNK", 4096)  # many chunks, so needles straddle their edges
    rng = random.Random(5)
    ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)).encode() for _ in range(200)]
    blob = bytearray(rng.getrandbits(8) for _ in range(40_000))
    blob[100:136] = ids[0]
    blob[500:504], blob[504:540] = b"abcd", ids[1]  # hex just before the id
    blob[4096 - 10 : 4096 + 26] = ids[2]  # across the first chunk's edge
    blob[9000:9036] = ids[3].upper()  # ASCII case ignored
    # an id-like run whose last 12 hex digits take the id's first 8: the id overlaps it
    blob[12000:12028] = b"12345678-1234-1234-1234-1234"
    blob[12028:12064] = ids[4]
    blob[20000:20009] = b"ANN SMITH"
    (tmp_path / "data.mdb").write_bytes(bytes(blob))
    (tmp_path / "keyword").mkdir()
    (tmp_path / "keyword" / "seg").write_bytes(b"..." + ids[5] + b"...")
    found = scan.files_holding(tmp_path, [*ids, b"Ann Smith", b"nobody"])
    assert {n for n, where in found.items() if where} == {*ids[:6], b"Ann Smith"}
    assert found[ids[5]] == ["keyword/seg"] and found[ids[0]] == ["data.mdb"]
    assert found[b"nobody"] == [] and found[ids[6]] == []


def test_the_log_scan_names_each_database_holding_an_id_until_the_purge(tmp_path: Path) -> None:
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=4)
    try:
        kept, gone = (
            o.event_id
            for o in t.submit_append(
                [
                    NewEvent(kind="turn", ts=1_000_000 + i, text="x", properties_raw=b'{"a": 1}')
                    for i in range(2)
                ]
            ).result()
        )
        live = t.snapshot_read(lambda r: scan.log_holding(r, [kept, gone]))
        assert live[gone] == ["by_kind", "by_prop", "by_ts", "ids", "ops", "records"] == live[kept]
        t.submit_delete([gone]).result()
        deleted = t.snapshot_read(lambda r: scan.log_holding(r, [gone]))
        assert deleted[gone] == ["tombstones"]  # the delete op holds it by design
        t.purge()
        purged = t.snapshot_read(lambda r: scan.log_holding(r, [kept, gone]))
    finally:
        t.close()
    assert purged == {kept: live[kept], gone: []}


def test_a_child_process_scans_as_the_thread_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=4)
    try:
        kept, gone = (
            o.event_id
            for o in t.submit_append(
                [NewEvent(kind="turn", ts=1_000_000 + i, text=f"Zelda {i}") for i in range(2)]
            ).result()
        )
        t.submit_delete([gone]).result()
        t.keyword.flush()
        needles = ["zelda", "nobody", kept, gone]

        def both() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
            return t.snapshot_read(lambda r: scan.tenant_holding(t.root, r, needles, [kept, gone]))

        here = both()
        monkeypatch.setattr(scan.apart, "APART_FROM_RECORDS", 0)  # a large tenant's way
        assert both() == here
        assert here[0]["nobody"] == [] and here[0]["zelda"] and here[1][gone] == ["tombstones"]
    finally:
        t.close()

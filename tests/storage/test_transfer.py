"""Export and import on real stores: a lossless round trip, refusals that name the line, and an
import that is whole or absent (tests/support/transfer_world.py builds the tenant)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from storage import files
from storage.errors import Conflict, InvalidRequest
from storage.model import NewEvent, StoredEvent
from storage.read.listing import ListQuery
from storage.tenants.tenant import Tenant
from storage.transfer import format as fmt
from storage.transfer import load
from storage.transfer.export import tenant_export
from storage.transfer.format import FORMAT_VERSION
from storage.transfer.landing import STAGING_PREFIX, import_tenant
from tests.support.transfer_world import DIM, MODEL, answers, populate

REPO = Path(__file__).resolve().parents[2]


def export_bytes(t: Tenant) -> bytes:
    with tenant_export(t) as lines:
        return b"".join(lines)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[str, object], list[str]]:
    """A populated tenant's export and its answers (the tenant closed again)."""
    root = tmp_path_factory.mktemp("world") / "acme"
    t = Tenant.open("acme", root, embedding_dim=DIM)
    try:
        ids = populate(t)
        exported = export_bytes(t)  # two deleted events await their purge: not exported
        # Tantivy's BM25 counts deleted documents until a merge, so keyword scores are the
        # copy's once the original's deletions are purged too (the purger's next round).
        t.purge()
        seen = answers(t, ids)
    finally:
        t.close()
    return exported, seen, ids


def imported(tmp_path: Path, data: bytes, tenant_id: str = "acme", **kw: object) -> Tenant:
    import_tenant(tmp_path / "data", tenant_id, io.BytesIO(data), **kw)  # type: ignore[arg-type]
    return Tenant.open(tenant_id, tmp_path / "data" / tenant_id, embedding_dim=DIM)


def test_a_round_trip_answers_every_question_alike(world, tmp_path: Path) -> None:
    exported, seen, ids = world
    t = imported(tmp_path, exported)
    try:
        again = answers(t, ids)
        assert again["get"] == seen["get"]
        assert again["list"] == seen["list"]
        assert again["cypher"] == seen["cypher"]
        assert again["recall"] == seen["recall"]
        # and the copy exports the same lines (all but the header's time and the checksum)
        assert _body(export_bytes(t)) == _body(exported)
    finally:
        t.close()


def _body(data: bytes) -> list[bytes]:
    return data.splitlines()[1:-1]


def test_the_export_carries_every_field_of_the_record(world) -> None:
    exported, _seen, _ids = world
    lines = exported.splitlines()
    header = msgspec.json.decode(lines[0])
    assert header["type"] == "header" and header["version"] == fmt.FORMAT_VERSION
    assert header["embedding_model"] == MODEL and header["embedding_dim"] == DIM
    events = [msgspec.json.decode(line) for line in lines[1:] if b'"type":"event"' in line]
    derived = {"seq", "filterable", "properties_raw"}
    for name in set(StoredEvent.__struct_fields__) - derived:
        assert any(name in e for e in events), name  # every field of the record is carried
    assert any(e["embedding"] and e["embedding_model"] == MODEL for e in events)
    assert any("properties_text" in e for e in events)  # the pretty-printed ones, as sent
    assert any(e["links"].get("SOURCE_FROM") for e in events)
    assert any(e["links"].get("SUPERSEDES") for e in events)
    assert any(e["idempotency"] for e in events)
    assert any(b'"type":"idempotency"' in line for line in lines)  # a deleted keyed event
    end = msgspec.json.decode(lines[-1])
    assert end["type"] == "end" and end["events"] == header["events"] == len(events)


def test_properties_come_back_byte_for_byte(world, tmp_path: Path) -> None:
    exported, _seen, _ids = world
    src = _records(exported)
    t = imported(tmp_path, exported)
    try:
        for event_id, raw in src.items():
            state = t.get(event_id)
            assert state is not None and state.event.properties_raw == raw
    finally:
        t.close()


def _records(data: bytes) -> dict[str, bytes | None]:
    reader = fmt.Reader()
    out: dict[str, bytes | None] = {}
    for line in io.BytesIO(data):
        item = reader.feed(line)
        if hasattr(item, "event"):
            out[item.event.event_id] = item.event.properties_raw  # type: ignore[union-attr]
    return out


def test_an_idempotent_retry_replays_after_the_move(world, tmp_path: Path) -> None:
    exported, _seen, ids = world
    t = imported(tmp_path, exported)
    try:
        import hashlib

        # populate() keyed every 6th append "key-i" with a body hash of the key; 6 and 12 were deleted
        for i, expect_live in ((0, True), (6, False), (12, False), (18, True)):
            body_hash = hashlib.sha256(f"key-{i}".encode()).digest()
            again = NewEvent(kind="turn", ts=1, event_id=ids[i], body_hash=body_hash)
            result = t.submit_append([again]).result()[0]
            assert result.replayed and result.event_id == ids[i]
            assert (t.get(ids[i]) is not None) is expect_live
    finally:
        t.close()


def _corruptions(data: bytes) -> list[tuple[str, bytes, str]]:
    lines = data.splitlines(keepends=True)
    mid = len(lines) // 2
    flipped = lines[mid].replace(b"note", b"nobe", 1)
    return [
        ("cut in a line", data[: len(data) - len(lines[-1]) - 7], f"line {len(lines) - 1}"),
        ("no trailer", b"".join(lines[:-1]), f"after line {len(lines) - 1}"),
        (
            "a changed text",
            b"".join([*lines[:mid], flipped, *lines[mid + 1 :]]),
            f"line {len(lines)}",
        ),
        ("a line gone", b"".join([*lines[:mid], *lines[mid + 1 :]]), f"line {len(lines) - 1}"),
        (
            "junk",
            b"".join([*lines[:mid], b'{"type":"event",\n', *lines[mid + 1 :]]),
            f"line {mid + 1}",
        ),
        ("not json", b"".join([*lines[:3], b"\x00\xff\n", *lines[3:]]), "line 4"),
        ("no header", b"".join(lines[1:]), "line 1"),
        ("after the end", data + lines[1], f"line {len(lines) + 1}"),
        ("empty", b"", "empty"),
    ]


@pytest.mark.parametrize("case", range(9))
def test_a_damaged_file_is_refused_naming_the_line_and_nothing_lands(
    world, tmp_path: Path, case: int
) -> None:
    exported, _seen, _ids = world
    name, data, where = _corruptions(exported)[case]
    with pytest.raises(InvalidRequest) as refused:
        import_tenant(tmp_path / "data", "acme", io.BytesIO(data))
    assert where in refused.value.detail, (name, refused.value.detail)
    data_dir = tmp_path / "data"
    assert not data_dir.exists() or list(data_dir.iterdir()) == []  # no tenant, no staging


def test_a_tenant_with_events_is_refused_unless_merging(world, tmp_path: Path) -> None:
    exported, _seen, ids = world
    root = tmp_path / "data" / "acme"
    t = Tenant.open("acme", root, embedding_dim=DIM)
    own = t.submit_append([NewEvent(kind="turn", ts=5, text="already here")]).result()[0].event_id
    first = ids[0]
    t.close()
    with pytest.raises(Conflict, match="holds 1 events"):
        import_tenant(tmp_path / "data", "acme", io.BytesIO(exported))
    stats = import_tenant(tmp_path / "data", "acme", io.BytesIO(exported), merge=True)
    assert stats.events == len(_records(exported)) and stats.skipped == 0
    again = import_tenant(tmp_path / "data", "acme", io.BytesIO(exported), merge=True)
    assert again.events == 0 and again.skipped == stats.events  # a second merge adds nothing
    t = Tenant.open("acme", root, embedding_dim=DIM)
    try:
        assert t.get(own) is not None and t.get(first) is not None
        assert not (root / "purge.new").exists() and not (root / "purge.old").exists()
    finally:
        t.close()


def test_an_empty_tenant_directory_takes_an_import(world, tmp_path: Path) -> None:
    exported, seen, ids = world
    root = tmp_path / "data" / "acme"
    t = Tenant.open("acme", root, embedding_dim=DIM)
    gone = t.submit_append([NewEvent(kind="turn", ts=5, text="soon deleted")]).result()[0].event_id
    t.submit_delete([gone]).result()
    t.close()
    t = imported(tmp_path, exported)
    try:
        assert answers(t, ids) == seen
    finally:
        t.close()


def test_a_different_dimension_is_refused_for_a_merge(world, tmp_path: Path) -> None:
    exported, _seen, _ids = world
    t = Tenant.open("acme", tmp_path / "data" / "acme", embedding_dim=8)
    t.submit_append([NewEvent(kind="turn", ts=5)]).result()
    t.close()
    with pytest.raises(InvalidRequest, match="8"):
        import_tenant(tmp_path / "data", "acme", io.BytesIO(exported), merge=True)


KILLED_IMPORT = """
import io, sys
from pathlib import Path
from storage.transfer.landing import import_tenant
import storage.transfer.load as load

load.BATCH_EVENTS = 10
def slow(n):
    if n >= 60:
        print("written", n, flush=True)
        import time; time.sleep(60)
data = Path(sys.argv[1]).read_bytes()
merge = sys.argv[3:] == ["merge"]
import_tenant(Path(sys.argv[2]), "acme", io.BytesIO(data), merge=merge, progress=slow)
"""


def test_an_import_killed_half_way_leaves_no_tenant(world, tmp_path: Path) -> None:
    exported, seen, ids = world
    (tmp_path / "export.ndjson").write_bytes(exported)
    data_dir = tmp_path / "data"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_IMPORT, str(tmp_path / "export.ndjson"), str(data_dir)],
        stdout=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith(b"written")  # 60 events are in the staging log
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (data_dir / "acme").exists()
    (stage,) = [p for p in data_dir.iterdir() if p.name.startswith(STAGING_PREFIX)]
    assert (stage / files.LOG).is_dir()
    # the next import sweeps the dead stage and lands whole
    t = imported(tmp_path, exported)
    try:
        assert answers(t, ids) == seen
        assert sorted(p.name for p in data_dir.iterdir()) == ["acme"]
    finally:
        t.close()


def test_an_import_holds_one_batch_whatever_the_file_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 events of 12 KB (36 MB of NDJSON) read from a generator: the Python memory the
    import holds at its peak is a few batches, not the file."""
    import hashlib
    import tracemalloc

    n, text = 3000, "x" * 12_000

    def chunks() -> Iterator[bytes]:
        digest = hashlib.sha256()
        head = fmt.header_line(
            fmt.Header(
                format=fmt.FORMAT,
                version=fmt.FORMAT_VERSION,
                tenant_id="big",
                embedding_dim=DIM,
                embedding_model=None,
                exported_at=0,
                events=n,
            )
        )
        digest.update(head)
        yield head
        for i in range(n):
            ev = StoredEvent(
                event_id=f"{i:08x}-0000-4000-8000-000000000000",
                seq=0,
                kind="turn",
                ts=i,
                text=f"{i} {text}",
            )
            line = fmt.event_line(ev, fmt.Links(), None)
            digest.update(line)
            yield line
        yield fmt.end_line(n, 0, digest.hexdigest())

    class Stream(io.RawIOBase):
        def __init__(self) -> None:
            self.it, self.buf = chunks(), b""

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            while not self.buf:
                self.buf = next(self.it, b"")
                if not self.buf:
                    return 0
            k = min(len(b), len(self.buf))
            b[:k], self.buf = self.buf[:k], self.buf[k:]
            return k

    monkeypatch.setattr(load, "BATCH_BYTES", 2 << 20)
    tracemalloc.start()
    try:
        stats = import_tenant(tmp_path / "data", "big", io.BufferedReader(Stream()))  # type: ignore[arg-type]
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stats.events == n
    assert peak < 16 << 20, peak  # the file is 36 MB, a batch 2 MB


def test_a_later_format_version_is_refused_naming_the_ones_read(world, tmp_path: Path) -> None:
    exported, _seen, _ids = world
    now, next_ = FORMAT_VERSION, FORMAT_VERSION + 1
    later = exported.replace(f'"version":{now},'.encode(), f'"version":{next_},'.encode(), 1)
    assert later != exported
    with pytest.raises(InvalidRequest, match=f"version {next_}; this version of memspine reads"):
        import_tenant(tmp_path / "data", "acme", io.BytesIO(later))


def test_an_op_the_format_cannot_carry_stops_the_export(tmp_path: Path) -> None:
    """Exporting past a kind of log op with no line for it would lose what it wrote."""
    from storage.log import layout

    t = Tenant.open("acme", tmp_path / "acme", embedding_dim=DIM)
    try:
        made = t.submit_append([NewEvent(kind="turn", ts=1, text="x")]).result()[0].event_id

        def odd_op(txn: Any) -> None:
            value = layout.op_value(b"Z", layout.id_bytes(made))
            txn.put(layout.op_key(99), value, db=t.log.dbs["ops"])

        t.log.write(odd_op)
        with pytest.raises(RuntimeError, match="does not carry log op b'Z'"):
            export_bytes(t)
    finally:
        t.close()


@pytest.mark.parametrize(
    ("properties", "why"),
    [
        (b'{"a":' * 40 + b"1" + b"}" * 40, "nest at most 32 levels"),
        (b'{"a":' * 5000 + b"1" + b"}" * 5000, "nested too deeply"),
        (b'{"a": 1e999}', "a number no JSON reader can hold"),
        (b"[1, 2]", "must be a JSON object"),
    ],
)
def test_properties_the_api_would_not_store_are_refused(
    tmp_path: Path, properties: bytes, why: str
) -> None:
    head = fmt.Header(
        format=fmt.FORMAT,
        version=fmt.FORMAT_VERSION,
        tenant_id="x",
        embedding_dim=DIM,
        embedding_model=None,
        exported_at=0,
        events=1,
    )
    line = b'{"type":"event","event_id":"00000000-0000-4000-8000-000000000001","kind":"k",'
    line += b'"ts":1,"properties":' + properties + b"}\n"
    with pytest.raises(InvalidRequest, match=f"line 2: .*{why}"):
        import_tenant(tmp_path / "data", "x", io.BytesIO(fmt.header_line(head) + line))
    assert list((tmp_path / "data").iterdir()) == []


def test_a_merge_killed_half_way_leaves_the_tenant_as_it_was(world, tmp_path: Path) -> None:
    exported, _seen, ids = world
    (tmp_path / "export.ndjson").write_bytes(exported)
    data_dir = tmp_path / "data"
    t = Tenant.open("acme", data_dir / "acme", embedding_dim=DIM)
    own = t.submit_append([NewEvent(kind="turn", ts=5, text="already here")]).result()[0].event_id
    t.close()
    args = [str(tmp_path / "export.ndjson"), str(data_dir), "merge"]
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_IMPORT, *args],
        stdout=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith(b"written")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (data_dir / "acme" / "purge.new").is_dir()  # the uncommitted copy the kill left
    t = Tenant.open("acme", data_dir / "acme", embedding_dim=DIM)  # discards it
    try:
        assert t.get(own) is not None and t.get(ids[0]) is None
        assert t.list_events(ListQuery(limit=1000))[0] == [t.get(own).event]  # type: ignore[union-attr]
        assert not (data_dir / "acme" / "purge.new").exists()
    finally:
        t.close()

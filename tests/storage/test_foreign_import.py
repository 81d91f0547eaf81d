"""memspine-admin import-from on real stores: the report of a dry run, current-state recall on
the imported tenant, a second run that stores nothing, and damaged files that store nothing
(tests/support/foreign_files.py builds each source's file from its own schema)."""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from memspine_admin.cli import main
from storage.read.listing import ListQuery
from storage.read.recall import RecallQuery
from storage.tenants.tenant import Tenant
from storage.transfer.foreign import convert
from storage.transfer.foreign.records import event_id
from tests.support import foreign_files as ff

FILES: dict[str, Callable[[], bytes]] = {
    "automem": ff.automem_file,
    "mem0": ff.mem0_file,
    "zep": ff.zep_file,
}
# Per source: a query, the key of the head of its chain, the keys it must not return (current),
# and a field the report names as not carried.
CASES = {
    "automem": (
        "billing invoices",
        f"automem:{ff.A_HEAD}",
        [f"automem:{ff.A_OLD}", f"automem:{ff.A_MID}"],
        "tag_prefixes (derived from tags)",
    ),
    "mem0": (
        "roast coffee",
        f"mem0:{ff.M_COFFEE}",
        [f"mem0:{ff.M_COFFEE}@h1", f"mem0:{ff.M_COFFEE}@h2"],
        "hash (Mem0's MD5 of the text)",
    ),
    "zep": (
        "Alice works",
        f"zep:{ff.E_GLOBEX}",
        [f"zep:{ff.E_ACME}"],
        "entity node summary (Graphiti's generated digest of its edges)",
    ),
}
EXPECTED = {  # events created, by kind
    "automem": {"decision": 2, "insight": 1, "preference": 1, "relation": 1},
    "mem0": {"memory": 5},
    "zep": {"turn": 2, "fact": 3},
}


def run(capsys: pytest.CaptureFixture[str], data: Path, *argv: str) -> tuple[int, Any]:
    """memspine-admin --json, in process: its exit code and its JSON (stdout, else stderr)."""
    code = main(["--data-dir", str(data), "--json", *argv])
    out, err = capsys.readouterr()
    return code, json.loads(out or err)


def write(tmp_path: Path, source: str, data: bytes | None = None) -> Path:
    path = tmp_path / f"{source}.json"
    path.write_bytes(FILES[source]() if data is None else data)
    return path


def open_tenant(data: Path, tenant: str) -> Tenant:
    return Tenant.open(tenant, data / tenant, embedding_dim=384)


def recalled(t: Tenant, text: str, *, current: bool = True) -> list[str]:
    result = t.recall(RecallQuery(text=text, k=20, current=current))
    return [h.event.event_id for h in result.hits]


def all_ids(t: Tenant) -> list[str]:
    events, _ = t.list_events(ListQuery(limit=1000, current=False))
    return sorted(e.event_id for e in events)


@pytest.mark.parametrize("source", FILES)
def test_a_dry_run_reports_and_writes_nothing(capsys, tmp_path: Path, source: str) -> None:
    data = tmp_path / "data"
    code, report = run(
        capsys,
        data,
        "import-from",
        source,
        str(write(tmp_path, source)),
        "--tenant",
        "t1",
        "--dry-run",
    )
    assert code == 0
    assert report["created"] == EXPECTED[source]
    assert report["events"] == sum(EXPECTED[source].values())
    assert report["held"] == 0 and "imported" not in report
    assert CASES[source][3] in report["dropped"]
    assert report["mapping"] and report["read"]
    assert not (data / "t1").exists()


@pytest.mark.parametrize("source", FILES)
def test_recall_returns_each_chain_head_and_a_rerun_stores_nothing(
    capsys, tmp_path: Path, source: str
) -> None:
    data = tmp_path / "data"
    path = write(tmp_path, source)
    code, first = run(capsys, data, "import-from", source, str(path), "--tenant", "t1")
    assert code == 0 and first["imported"] == first["events"] and first["skipped"] == 0
    query, head, retired, _ = CASES[source]
    t = open_tenant(data, "t1")
    try:
        before = all_ids(t)
        hits = recalled(t, query)
        assert event_id("t1", head) in hits
        assert not {event_id("t1", k) for k in retired} & set(hits)
        # Without current state the retired versions are there: the test above can fail.
        assert {event_id("t1", k) for k in retired} <= set(recalled(t, query, current=False))
    finally:
        t.close()
    code, second = run(capsys, data, "import-from", source, str(path), "--tenant", "t1")
    assert code == 0
    assert (second["imported"], second["skipped"], second["held"]) == (
        0,
        first["events"],
        first["events"],
    )
    t = open_tenant(data, "t1")
    try:
        assert all_ids(t) == before
    finally:
        t.close()


@pytest.mark.parametrize("source", FILES)
def test_a_truncated_file_stores_nothing(capsys, tmp_path: Path, source: str) -> None:
    data = tmp_path / "data"
    whole = FILES[source]()
    for cut in (len(whole) // 3, len(whole) - 2):
        path = write(tmp_path, source, whole[:cut])
        code, err = run(capsys, data, "import-from", source, str(path), "--tenant", "t1")
        assert code == 1 and err["error"] == "invalid_request"
        assert "truncated" in err["detail"]
        assert not (data / "t1").exists()
    # Into a tenant holding an earlier import: refused, and it holds what it held.
    run(capsys, data, "import-from", source, str(write(tmp_path, source)), "--tenant", "t1")
    t = open_tenant(data, "t1")
    before = all_ids(t)
    t.close()
    code, _ = run(
        capsys,
        data,
        "import-from",
        source,
        str(write(tmp_path, source, whole[:-2])),
        "--tenant",
        "t1",
    )
    assert code == 1
    t = open_tenant(data, "t1")
    try:
        assert all_ids(t) == before
    finally:
        t.close()


def test_a_value_of_the_wrong_type_is_refused_with_its_place(capsys, tmp_path: Path) -> None:
    dump = ff.zep_dump()
    dump["episodes"][1]["content"] = 12
    path = write(tmp_path, "zep", json.dumps(dump).encode())
    code, err = run(capsys, tmp_path / "data", "import-from", "zep", str(path), "--tenant", "t1")
    assert code == 1
    assert err["detail"] == "zep.json: episodes[1].content: expected a string, got int"
    broken = json.dumps(ff.zep_dump(), indent=2).replace('"fact":', '"fact"', 1).encode()
    code, err = run(
        capsys,
        tmp_path / "data",
        "import-from",
        "zep",
        str(write(tmp_path, "zep", broken)),
        "--tenant",
        "t1",
    )
    assert code == 1 and "(line " in err["detail"] and ", column " in err["detail"]


def test_automem_supersession_validity_and_relations(capsys, tmp_path: Path) -> None:
    data = tmp_path / "data"
    run(capsys, data, "import-from", "automem", str(write(tmp_path, "automem")), "--tenant", "t1")
    t = open_tenant(data, "t1")
    try:
        old = t.get(event_id("t1", f"automem:{ff.A_OLD}"))
        mid = t.get(event_id("t1", f"automem:{ff.A_MID}"))
        head = t.get(event_id("t1", f"automem:{ff.A_HEAD}"))
        assert old is not None and mid is not None and head is not None
        assert mid.event.supersedes == [old.event.event_id]
        assert head.event.supersedes == [mid.event.event_id]
        assert old.event.valid_until == 1_740_787_200_000_000  # 2025-03-01T00:00:00Z
        props = head.event.properties()
        assert props["automem_id"] == ff.A_HEAD and props["tags"] == ["billing", "database"]
        assert props["metadata"] == {"files_modified": ["db.ts"]}  # FalkorDB's JSON text, decoded
        assert props["supersession"] == [
            {"of": ff.A_MID, "relation": "EVOLVED_INTO", "confidence": 0.8}
        ]
        assert "tag_prefixes" not in props and "processed" not in props
        rel_id = event_id("t1", f"automem:{ff.A_PREF}-RELATES_TO-{ff.A_HEAD}")
        rel = t.get(rel_id)
        assert rel is not None and rel.event.kind == "relation"
        assert rel.event.properties()["source_event_ids"] == [
            event_id("t1", f"automem:{ff.A_PREF}"),
            head.event.event_id,
        ]
    finally:
        t.close()


def test_automem_vectors_are_kept_only_with_their_model(capsys, tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = tmp_path / "automem-backup.tar.gz"
    path.write_bytes(ff.automem_tarball(dim=4))
    code, report = run(
        capsys, data, "import-from", "automem", str(path), "--tenant", "t1", "--dry-run"
    )
    assert code == 0 and report["embedding_model"] is None
    assert any(k.startswith("embedding (the backup does not name") for k in report["dropped"])
    code, report = run(
        capsys,
        data,
        "import-from",
        "automem",
        str(path),
        "--tenant",
        "t2",
        "--embedding-model",
        "nomic-4",
    )
    assert code == 0 and report["embedding_model"] == "nomic-4"
    t = Tenant.open("t2", data / "t2", embedding_dim=4)
    try:
        assert t.dim == 4
        head = t.get(event_id("t2", f"automem:{ff.A_HEAD}"))
        assert head is not None and head.event.embedding_model == "nomic-4"
        assert head.event.embedding is not None and len(head.event.embedding) == 4
    finally:
        t.close()


def test_mem0_history_users_and_deletes(capsys, tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = write(tmp_path, "mem0")
    code, report = run(
        capsys, data, "import-from", "mem0", str(path), "--tenant", "bob", "--user", "bob"
    )
    assert code == 0 and report["imported"] == 1
    code, report = run(
        capsys, data, "import-from", "mem0", str(path), "--tenant", "alice", "--user", "alice"
    )
    assert report["imported"] == 4  # coffee: 3 versions; city
    t = open_tenant(data, "alice")
    try:
        head = t.get(event_id("alice", f"mem0:{ff.M_COFFEE}"))
        assert head is not None and head.event.text == "Likes dark roast coffee"
        assert head.event.supersedes == [event_id("alice", f"mem0:{ff.M_COFFEE}@h2")]
        city = t.get(event_id("alice", f"mem0:{ff.M_CITY}"))
        assert city is not None and city.event.valid_until == 1_893_456_000_000_000  # 2030-01-01
        assert city.event.properties()["agent_id"] == "travel-agent"
        assert "hash" not in city.event.properties()
        assert t.get(event_id("alice", f"mem0:{ff.M_GONE}")) is None
        assert recalled(t, "tea") == []
    finally:
        t.close()


def test_zep_facts_link_their_episodes(capsys, tmp_path: Path) -> None:
    data = tmp_path / "data"
    run(capsys, data, "import-from", "zep", str(write(tmp_path, "zep")), "--tenant", "t1")
    t = open_tenant(data, "t1")
    try:
        fact = t.get(event_id("t1", f"zep:{ff.E_GLOBEX}"))
        assert fact is not None and fact.event.kind == "fact"
        assert fact.event.supersedes == [event_id("t1", f"zep:{ff.E_ACME}")]
        assert fact.event.properties()["source_event_ids"] == [event_id("t1", f"zep:{ff.EP_2}")]
        assert fact.event.valid_from == 1_748_131_200_000_000  # 2025-05-25
        assert fact.event.properties()["target_node"] == {"uuid": ff.N_GLOBEX, "name": "Globex"}
        old = t.get(event_id("t1", f"zep:{ff.E_ACME}"))
        assert old is not None and old.event.valid_until == 1_748_131_200_000_000
        turn = t.get(event_id("t1", f"zep:{ff.EP_1}"))
        assert turn is not None and turn.event.kind == "turn"
    finally:
        t.close()


def test_a_gzipped_mem0_file_reads_alike(capsys, tmp_path: Path) -> None:
    path = tmp_path / "mem0.json.gz"
    path.write_bytes(gzip.compress(ff.mem0_file()))
    code, report = run(
        capsys, tmp_path / "data", "import-from", "mem0", str(path), "--tenant", "t1", "--dry-run"
    )
    assert code == 0 and report["events"] == 5


def test_an_automem_graph_snapshot_converts_alike() -> None:
    backup = ff.automem_backup()
    inner = {n["id"]: n["properties"] for n in backup["nodes"]}
    nodes = [  # GET /graph/snapshot's node: the memory's fields and drawing hints
        {
            **{
                k: p[k]
                for k in (
                    "id",
                    "content",
                    "type",
                    "importance",
                    "confidence",
                    "tags",
                    "timestamp",
                    "updated_at",
                )
            },
            "metadata": {"files_modified": ["db.ts"]},
            "color": "#fff",
            "radius": 1.0,
            "opacity": 0.9,
        }
        for p in list(inner.values())[:4]
    ]
    edges = [
        {
            "id": "x",
            "source": inner[r["source_id"]]["id"],
            "target": inner[r["target_id"]]["id"],
            "type": r["type"],
            "strength": 0.5,
            "color": "#000",
            "properties": r["properties"],
        }
        for r in backup["relationships"][:3]
    ]
    raw = json.dumps({"nodes": nodes, "edges": edges, "stats": {}}).encode()
    conv = convert("automem", raw)
    assert conv.report.created == EXPECTED["automem"]
    assert "color (a graph snapshot's drawing hint)" in conv.report.dropped
    assert any("no t_valid" in n for n in conv.report.notes)
    head = next(r for r in conv.records if r.key == f"automem:{ff.A_HEAD}")
    assert head.supersedes == [f"automem:{ff.A_MID}"]


def test_mem0_per_user_makes_one_tenant_per_user_id(capsys, tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = write(tmp_path, "mem0")
    code, out = run(capsys, data, "import-from", "mem0", str(path), "--tenant", "m", "--per-user")
    assert code == 0
    assert {p["tenant_id"]: p["imported"] for p in out["tenants"]} == {"m-alice": 4, "m-bob": 1}
    assert sorted(p.name for p in data.iterdir() if not p.name.startswith(".")) == [
        "m-alice",
        "m-bob",
    ]
    code, err = run(capsys, data, "import-from", "zep", str(path), "--tenant", "m", "--per-user")
    assert code == 1 and err["detail"] == "--per-user is for mem0 files, without --user"


def test_mem0_subjects_makes_each_user_id_the_subject_of_its_memories(
    capsys, tmp_path: Path
) -> None:
    """--subjects: one tenant, every version of a user's memories tagged with its user_id, so an
    erasure by subject reaches the whole chain; a memory without a user_id names nobody."""
    from storage.read.subjects import Reach, reach

    data = tmp_path / "data"
    export = ff.mem0_export()
    export["results"].append(
        {"id": "9d1c7a4e-0000-4000-8000-00000000000a", "memory": "Office plants need water",
         "user_id": None, "created_at": "2025-03-01T10:00:00Z", "updated_at": None}
    )  # fmt: skip
    path = write(tmp_path, "mem0", json.dumps(export).encode())
    code, dry = run(capsys, data, "import-from", "mem0", str(path), "--tenant", "m", "--subjects", "--dry-run")  # fmt: skip
    assert code == 0 and any("-> subjects" in line for line in dry["mapping"])
    assert not any("--per-user" in n for n in dry["notes"])
    code, report = run(capsys, data, "import-from", "mem0", str(path), "--tenant", "m", "--subjects")  # fmt: skip
    assert code == 0 and report["imported"] == 6
    t = open_tenant(data, "m")
    try:
        coffee = [
            event_id("m", k)
            for k in (f"mem0:{ff.M_COFFEE}@h1", f"mem0:{ff.M_COFFEE}@h2", f"mem0:{ff.M_COFFEE}")
        ]
        for eid in coffee:
            found = t.get(eid)
            assert found is not None and found.event.subjects == ["alice"]
        about = {
            who: sorted(
                f.event_id for f in t.snapshot_read(lambda r, w=who: reach(r, Reach(subject=w)))
            )
            for who in ("alice", "bob")
        }
        assert about["alice"] == sorted([*coffee, event_id("m", f"mem0:{ff.M_CITY}")])
        assert len(about["bob"]) == 1
        plants = t.get(event_id("m", "mem0:9d1c7a4e-0000-4000-8000-00000000000a"))
        assert plants is not None and plants.event.subjects == []
    finally:
        t.close()
    # A user_id that cannot be a subject id is refused with its place, nothing written.
    export["results"][0]["user_id"] = "al\x01ice"
    bad = write(tmp_path, "mem0", json.dumps(export).encode())
    code, err = run(capsys, tmp_path / "other", "import-from", "mem0", str(bad), "--tenant", "m", "--subjects")  # fmt: skip
    assert code == 1 and "results[0].user_id" in err["detail"] and "--subjects" in err["detail"]
    assert not (tmp_path / "other" / "m").exists()
    code, err = run(capsys, data, "import-from", "zep", str(path), "--tenant", "z", "--subjects")
    assert code == 1 and err["detail"].startswith("--subjects is for mem0 files")
    code, err = run(capsys, data, "import-from", "mem0", str(path), "--tenant", "m", "--subjects", "--per-user")  # fmt: skip
    assert code == 1 and "not with --per-user" in err["detail"]


def test_a_file_on_stdin_reads_alike(capsys, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(ff.zep_file()))))
    code, report = run(
        capsys, tmp_path / "data", "import-from", "zep", "-", "--tenant", "t1", "--dry-run"
    )
    assert code == 0 and report["created"] == EXPECTED["zep"]
    code, err = run(
        capsys,
        tmp_path / "data",
        "import-from",
        "zep",
        str(tmp_path / "nope.json"),
        "--tenant",
        "t1",
    )
    assert (
        code == 1 and err["detail"].startswith("cannot read ") and "No such file" in err["detail"]
    )


def test_what_is_past_its_retention_window_is_dropped_as_by_import(
    capsys, monkeypatch, tmp_path: Path
) -> None:
    # A window that ends on 2025-02-15, whatever today is: the two memories before it go.
    days = (datetime.now(UTC) - datetime(2025, 2, 15, tzinfo=UTC)).days
    monkeypatch.setenv("MEMSPINE_RETENTION_DAYS", str(days))
    data = tmp_path / "data"
    code, out = run(
        capsys, data, "import-from", "automem", str(write(tmp_path, "automem")), "--tenant", "t1"
    )
    assert code == 0 and (out["imported"], out["retention_dropped"]) == (3, 2)
    t = open_tenant(data, "t1")
    try:
        mid = t.get(event_id("t1", f"automem:{ff.A_MID}"))
        # what it superseded is gone, and so is the link to it (as for any import's drop)
        assert mid is not None and mid.event.supersedes == []
        assert t.get(event_id("t1", f"automem:{ff.A_OLD}")) is None
        assert t.get(event_id("t1", f"automem:{ff.A_PREF}")) is None
    finally:
        t.close()


def test_a_value_the_event_rules_refuse_is_refused_with_its_place(capsys, tmp_path: Path) -> None:
    dump = ff.zep_dump()
    dump["episodes"][1]["content"] = "x" * 100_001  # a json episode of Graphiti may be that long
    path = write(tmp_path, "zep", json.dumps(dump).encode())
    code, err = run(capsys, tmp_path / "data", "import-from", "zep", str(path), "--tenant", "t1")
    assert code == 1
    assert err["detail"] == "zep.json: episodes[1]: text may be at most 100000 characters"
    assert not (tmp_path / "data" / "t1").exists()

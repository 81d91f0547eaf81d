"""Read audit in process: every read door leaves one record naming exactly the ids its answer
carried; purposes required and refused; the audit scope and its isolation; retention; verify
(tests/e2e/test_read_audit_e2e.py: real processes, MCP over both transports, kill -9)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from memspine.client import Memspine, MemspineAdmin
from memspine.readaudit import DAY_US, ReadAudit, Reader
from memspine_admin.control import ControlDB
from memspine_admin.readaudit import verify_reads
from memspine_admin.records import ReadMark
from storage import failpoints
from storage.errors import DiskFull, Unavailable
from storage.readlog import READS_JOURNAL, records, verify
from tests.support.disk_full import fill_disk
from tests.support.servers import AppTransport, InProcessServer, cheap_hasher

ADMIN_KEY = "an-admin-key-of-some-length"
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


class World:
    """A server with two tenants and keys of each kind, and events in the first tenant."""

    def __init__(self, server: InProcessServer, keys: dict[str, str], tenants: list[str]) -> None:
        self.server = server
        self.keys = keys
        self.tenant, self.other = tenants
        self.ids: list[str] = []

    def client(self, key: str, **headers: str) -> httpx.Client:
        return self.server.client(self.keys[key], headers=headers)

    def reads(self, key: str = "audit", **params: Any) -> list[dict[str, Any]]:
        with self.client(key) as c:
            r = c.get("/v1/memory/audit/reads", params=params)
        assert r.status_code == 200, r.text
        out: list[dict[str, Any]] = r.json()["reads"]
        return out

    def wait_reads(self, count: int, **params: Any) -> list[dict[str, Any]]:
        """The tenant's records once there are `count` of them (the writer commits in groups)."""
        deadline = time.monotonic() + 30
        while True:
            found = self.reads(**params)
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.02)

    def mcp(self, key: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": tool, "arguments": args},
        }
        with self.client(key, **MCP_HEADERS) as c:
            r = c.post("/mcp", json=body)
        assert r.status_code == 200, r.text
        result: dict[str, Any] = r.json()["result"]
        return result


def make_world(data_dir: Path, env: dict[str, str]) -> World:
    hasher = cheap_hasher()
    keys: dict[str, str] = {}
    with ControlDB.open(data_dir, create=True, hasher=hasher) as db:
        tenant = db.create_tenant("acme", actor="test").tenant_id
        other = db.create_tenant("other", actor="test").tenant_id
        for name, scopes, purpose in (
            ("rw", ("read", "write"), False),
            ("read", ("read",), False),
            ("purposeful", ("read",), True),
            ("audit", ("audit",), False),
        ):
            keys[name] = db.create_key(
                tenant, name, scopes, actor="test", require_purpose=purpose
            ).api_key
        keys["other_audit"] = db.create_key(other, "a", ("audit",), actor="test").api_key
        keys["other_rw"] = db.create_key(other, "rw", ("read", "write"), actor="test").api_key
    server = InProcessServer(
        data_dir, {"MEMSPINE_ADMIN_KEY": ADMIN_KEY, **env}, hasher=hasher
    ).start()
    world = World(server, keys, [tenant, other])
    with world.client("rw") as c:
        for i in range(12):
            r = c.post(
                "/v1/memory/event", json={"kind": "fact", "text": f"invoice {i} paid in full"}
            )
            assert r.status_code == 201
            world.ids.append(r.json()["event_id"])
        # The other tenant's own events and reads, which this tenant's auditor never sees.
    with world.client("other_rw") as c:
        r = c.post("/v1/memory/event", json={"kind": "fact", "text": "invoice elsewhere"})
        c.get(f"/v1/memory/event/{r.json()['event_id']}")
    return world


@pytest.fixture(scope="module", params=["durable", "buffered"])
def world(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[World]:
    env = {"MEMSPINE_READ_AUDIT": request.param}
    w = make_world(tmp_path_factory.mktemp("audit") / "data", env)
    yield w
    w.server.stop()


def _http_get(w: World) -> tuple[str, str, list[str]]:
    with w.client("read", **{"Memspine-Purpose": "ticket 4411"}) as c:
        r = c.get(f"/v1/memory/event/{w.ids[3]}")
    assert r.status_code == 200
    return "http", "/v1/memory/event/{event_id:str}", [r.json()["event_id"]]


def _http_list(w: World) -> tuple[str, str, list[str]]:
    with w.client("read", **{"Memspine-Purpose": "ticket 4411"}) as c:
        r = c.get("/v1/memory/events", params={"limit": 5})
    return "http", "/v1/memory/events", [e["event_id"] for e in r.json()["events"]]


def _http_recall(w: World) -> tuple[str, str, list[str]]:
    with w.client("read", **{"Memspine-Purpose": "ticket 4411"}) as c:
        r = c.post("/v1/memory/recall", json={"text": "invoice paid", "k": 4})
    return "http", "/v1/memory/recall", [h["event_id"] for h in r.json()["hits"]]


def _http_cypher(w: World) -> tuple[str, str, list[str]]:
    query = "MATCH (e:Event) WHERE e.text CONTAINS 'invoice 1' RETURN e.event_id, e.text"
    with w.client("read", **{"Memspine-Purpose": "ticket 4411"}) as c:
        r = c.post("/v1/memory/cypher", json={"query": query})
    return "http", "/v1/memory/cypher", sorted(row[0] for row in r.json()["rows"])


def _http_export(w: World) -> tuple[str, str, list[str]]:
    with w.client("read", **{"Memspine-Purpose": "ticket 4411"}) as c:
        r = c.get("/v1/memory/export")
    lines = [json.loads(line) for line in r.text.splitlines()]
    ids = [line["event_id"] for line in lines if line.get("type") == "event"]
    return "http", "/v1/memory/export", ids


def _mcp_cypher(w: World) -> tuple[str, str, list[str]]:
    query = "MATCH (e:Event) WHERE e.text CONTAINS 'invoice 2' RETURN e"
    out = w.mcp("read", "memory_cypher", {"query": query, "purpose": "ticket 4411"})
    rows = out["structuredContent"]["rows"]
    return "mcp", "memory_cypher", sorted(r[0]["event_id"] for r in rows)


def _mcp_get(w: World) -> tuple[str, str, list[str]]:
    out = w.mcp("read", "memory_get", {"id": w.ids[5], "purpose": "ticket 4411"})
    return "mcp", "memory_get", [out["structuredContent"]["event_id"]]


def _mcp_list(w: World) -> tuple[str, str, list[str]]:
    out = w.mcp("read", "memory_list", {"limit": 3, "purpose": "ticket 4411"})
    return "mcp", "memory_list", [e["event_id"] for e in out["structuredContent"]["events"]]


def _mcp_recall(w: World) -> tuple[str, str, list[str]]:
    out = w.mcp("read", "memory_recall", {"text": "invoice", "k": 2, "purpose": "ticket 4411"})
    return "mcp", "memory_recall", [h["event_id"] for h in out["structuredContent"]["hits"]]


def _python_client(w: World) -> tuple[str, str, list[str]]:
    assert w.server.runner is not None
    transport = AppTransport(w.server.runner, w.server.port)
    headers = {"Memspine-Purpose": "ticket 4411"}
    with Memspine(w.server.url, w.keys["read"], transport=transport, headers=headers) as c:
        hits = c.recall("invoice paid", k=3).hits
    return "http", "/v1/memory/recall", [h.event_id for h in hits]


DOORS: dict[str, Callable[[World], tuple[str, str, list[str]]]] = {
    "http get": _http_get,
    "http list": _http_list,
    "http recall": _http_recall,
    "http cypher": _http_cypher,
    "http export": _http_export,
    "python client recall": _python_client,
    "mcp get": _mcp_get,
    "mcp cypher": _mcp_cypher,
    "mcp list": _mcp_list,
    "mcp recall": _mcp_recall,
}


@pytest.mark.parametrize("door", list(DOORS))
def test_every_read_door_leaves_one_record_naming_exactly_the_ids_it_answered(
    world: World, door: str
) -> None:
    before = world.reads(limit=1000)
    kind, route, answered = DOORS[door](world)
    assert answered
    after = world.wait_reads(len(before) + 1, limit=1000)
    new = after[len(before) :]
    assert len(new) == 1
    record = new[0]
    assert (record["door"], record["route"]) == (kind, route)
    assert record["event_ids"] == answered
    assert record["purpose"] == "ticket 4411"
    assert record["key_id"] == world.keys["read"].split("_")[2]
    assert record["request_id"] not in ("", "-")
    # The auditor finds it by an event it names, and by its key.
    by_event = world.reads(event_id=answered[0], limit=1000)
    assert record in by_event
    assert record in world.reads(key_id=record["key_id"], limit=1000)


def test_a_key_that_requires_a_purpose_is_refused_without_one(world: World) -> None:
    with world.client("purposeful") as c:
        r = c.get(f"/v1/memory/event/{world.ids[0]}")
        assert r.status_code == 400
        assert "Memspine-Purpose" in r.json()["detail"]
        r = c.post("/v1/memory/recall", json={"text": "invoice"})
        assert r.status_code == 400
        r = c.get(f"/v1/memory/event/{world.ids[0]}", headers={"Memspine-Purpose": "audit of Q3"})
        assert r.status_code == 200
    out = world.mcp("purposeful", "memory_get", {"id": world.ids[0]})
    assert out["isError"] is True
    assert "Memspine-Purpose" in out["structuredContent"]["detail"]


@pytest.mark.parametrize("purpose", ["x" * 201, "two\nlines", "tab\there", "é" * 101])
def test_a_purpose_too_long_or_with_control_characters_is_refused(
    world: World, purpose: str
) -> None:
    with world.client("read") as c:
        r = c.get(
            f"/v1/memory/event/{world.ids[0]}",
            headers={"Memspine-Purpose": purpose.encode()},
        )
    assert r.status_code == 400
    assert r.json()["error"] == "invalid_request"


def test_scopes_keep_reads_and_records_apart_and_tenants_apart(world: World) -> None:
    with world.client("audit") as c:
        assert c.get(f"/v1/memory/event/{world.ids[0]}").status_code == 403
        assert c.post("/v1/memory/recall", json={"text": "invoice"}).status_code == 403
    for key in ("read", "rw"):
        with world.client(key) as c:
            assert c.get("/v1/memory/audit/reads").status_code == 403
    _http_get(world)
    world.wait_reads(1)
    mine = {e for r in world.reads(limit=1000) for e in r["event_ids"]}
    theirs = world.reads("other_audit", limit=1000)
    assert len(theirs) == 1  # the other tenant's own read only
    assert not mine & set(theirs[0]["event_ids"])
    with world.client("other_audit") as c:
        r = c.get("/v1/memory/audit/reads", params={"event_id": world.ids[3]})
        assert r.json() == {"reads": [], "next_cursor": None}


def test_the_admin_reads_any_tenants_records_and_pages_with_a_cursor(world: World) -> None:
    for _ in range(3):
        _http_get(world)
    all_reads = world.wait_reads(3, limit=1000)
    with world.server.client(ADMIN_KEY) as c:
        r = c.get(f"/v1/admin/tenants/{world.tenant}/reads", params={"limit": 1000})
        assert r.status_code == 200
        assert r.json()["reads"][: len(all_reads)] == all_reads
        seen: list[dict[str, Any]] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 2}
            if cursor:
                params["cursor"] = cursor
            page = c.get(f"/v1/admin/tenants/{world.tenant}/reads", params=params).json()
            seen += page["reads"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen[: len(all_reads)] == all_reads
        bad = c.get("/v1/admin/tenants/not-a-tenant/reads")
        assert bad.status_code == 400
    assert world.server.runner is not None
    transport = AppTransport(world.server.runner, world.server.port)
    with Memspine(world.server.url, world.keys["audit"], transport=transport) as client:
        got = msgspec.to_builtins(client.reads(limit=1000).reads)
        assert got[: len(all_reads)] == all_reads  # buffered: more may have landed since
    with MemspineAdmin(world.server.url, ADMIN_KEY, transport=transport) as admin:
        page = admin.tenant_reads(world.tenant, limit=2)
        assert msgspec.to_builtins(page.reads) == all_reads[:2] and page.next_cursor
    with world.client("audit") as c:
        r = c.get("/v1/memory/audit/reads", params={"cursor": "../etc"})
        assert r.status_code == 400
        r = c.get("/v1/memory/audit/reads", params={"event_id": "nope"})
        assert r.status_code == 400
        r = c.get("/v1/memory/audit/reads", params={"subject": "nobody-here"})
        assert r.json() == {"reads": [], "next_cursor": None}


def test_the_chain_verifies_and_counts_in_the_tenants_usage(world: World) -> None:
    _http_recall(world)
    world.wait_reads(1)
    server = world.server
    assert server.app is not None
    server.app.state["engine"].reads.writer.flush().result(30)
    assert server.auth is not None
    db = server.auth.control()
    assert db is not None
    verdict = verify_reads(server.data_dir, db, world.tenant)
    head, _cut = db.read_marks(world.tenant)
    assert verdict.ok, verdict.detail
    assert head is not None and head.seq == verdict.checked
    with server.client(ADMIN_KEY) as c:
        shown = c.get(f"/v1/admin/tenants/{world.tenant}").json()
    assert shown["usage"]["bytes"]["reads"] > 0
    # Ids and keys, never what the events say.
    raw = (server.data_dir / world.tenant / "reads.log").read_bytes()
    assert b"invoice" not in raw and b"paid" not in raw


def test_deleting_a_tenant_erases_its_read_records(tmp_path: Path) -> None:
    w = make_world(tmp_path / "data", {"MEMSPINE_READ_AUDIT": "durable"})
    try:
        _http_get(w)
        assert (w.server.data_dir / w.tenant / "reads.log").is_file()
        with w.server.client(ADMIN_KEY) as c:
            assert c.delete(f"/v1/admin/tenants/{w.tenant}").status_code == 200
        assert not (w.server.data_dir / w.tenant).exists()
        assert w.server.auth is not None
        control = w.server.auth.control()
        assert control is not None and control.read_marks(w.tenant) == (None, None)
    finally:
        w.server.stop()


def test_retention_drops_old_records_in_chain_order_and_the_chain_still_verifies(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    with ControlDB.open(data_dir, create=True, hasher=cheap_hasher()) as db:
        tenant = db.create_tenant("acme", actor="test").tenant_id
    (data_dir / tenant).mkdir()
    db = ControlDB.open(data_dir)
    audit = ReadAudit("durable", lambda t: data_dir / t)
    audit.keep_marks_in(lambda: db)
    reader = Reader("AbCdEfGhIjKl", "http", "/v1/memory/events", "r1", "p")
    made: list[str] = []

    async def read(n: int) -> None:
        for _ in range(n):
            made.append(str(uuid.uuid4()))
            await audit.record(tenant, reader, [made[-1]])

    try:
        anyio.run(read, 5)
        time.sleep(0.01)
        middle = time.time_ns() // 1000
        anyio.run(read, 5)
        audit.writer.flush().result(30)
        assert verify_reads(data_dir, db, tenant).ok
        dropped = audit.expire([tenant], 1, now_us=middle + DAY_US, slack_us=0)
        assert dropped == 5
        kept = [f.read.event_ids[0] for f in records(data_dir / tenant)]
        assert kept == made[5:]
        head, cut = db.read_marks(tenant)
        assert cut is not None and cut.seq == 5
        assert head is not None and head.seq == 10
        assert verify_reads(data_dir, db, tenant).ok
        anyio.run(read, 2)  # the chain goes on from the cut file
        audit.writer.flush().result(30)
        verdict = verify_reads(data_dir, db, tenant)
        assert verdict.ok and verdict.checked == 7, verdict.detail
        # Without the recorded cut the dropped records are records removed.
        db.keep_read_mark(tenant, ReadMark(seq=0, hash=bytes(32)), cut=True)
        assert not verify_reads(data_dir, db, tenant).ok
    finally:
        audit.close()
        db.close()


def test_a_full_disk_refuses_durable_reads_and_holds_buffered_records_up_to_a_bound(
    tmp_path: Path,
) -> None:
    root = tmp_path / "t"
    root.mkdir()
    reader = Reader("AbCdEfGhIjKl", "http", "/v1/memory/recall", "r1", None)

    async def read(audit: ReadAudit) -> None:
        await audit.record("t", reader, [str(uuid.uuid4())])

    durable = ReadAudit("durable", lambda _t: root)
    try:
        anyio.run(read, durable)
        failpoints.arm("reads.append", "enospc")
        with pytest.raises(DiskFull):  # 503: the read is not answered
            anyio.run(read, durable)
        failpoints.disarm_all()
        anyio.run(read, durable)
    finally:
        failpoints.disarm_all()
        durable.close()
    assert len(list(records(root))) == 2  # the refused read left no record

    buffered = ReadAudit("buffered", lambda _t: root, max_pending_per_tenant=20)
    try:
        failpoints.arm("reads.append", "enospc")
        held = 0
        with pytest.raises(Unavailable):  # past the bound: refused
            for _ in range(1000):
                anyio.run(read, buffered)
                held += 1
        assert 1 <= held <= 20
        failpoints.disarm_all()
        buffered.writer.flush().result(30)
    finally:
        failpoints.disarm_all()
        buffered.close()
    assert len(list(records(root))) == 2 + held  # every record held was written, in order
    assert verify(root, None, None).ok


def test_on_a_real_full_disk_buffered_records_are_held_to_the_bound_then_refused(
    small_fs: Path,
) -> None:
    """A small tmpfs filled for real (tests/support/disk_full.py), the round journal on it as
    the server has it: records are held in memory up to the tenant's bound, then reads are
    refused as a full disk (503, Retry-After); freed, every record held is written, in order."""
    root = small_fs / "t"
    root.mkdir()
    reader = Reader("AbCdEfGhIjKl", "http", "/v1/memory/recall", "r1", None)

    async def read(audit: ReadAudit) -> None:
        await audit.record("t", reader, [str(uuid.uuid4())])

    audit = ReadAudit(
        "buffered", lambda _t: root, max_pending_per_tenant=20, journal=small_fs / READS_JOURNAL
    )
    try:
        anyio.run(read, audit)
        audit.writer.flush().result(30)  # the log made
        filler = fill_disk(small_fs)
        answered = 1
        with pytest.raises(DiskFull) as refused:  # the log's last page fills, then 20 held
            for _ in range(10_000):
                anyio.run(read, audit)
                answered += 1
        assert refused.value.status == 503 and refused.value.headers["Retry-After"].isdigit()
        assert "disk is full" in refused.value.detail
        assert audit.writer.stuck("t") and audit.writer.pending() == 20
        filler.unlink()
        audit.writer.flush().result(30)
        assert not audit.writer.stuck("t") and audit.writer.pending() == 0
    finally:
        audit.close()
    assert len(list(records(root))) == answered
    assert verify(root, None, None).ok


def test_reads_of_a_subject_and_its_access_export(tmp_path: Path) -> None:
    w = make_world(tmp_path / "data", {"MEMSPINE_READ_AUDIT": "durable"})
    try:
        with w.client("rw") as c:
            body = {"kind": "fact", "text": "Ann lives in Paris", "subjects": ["cust-ann"]}
            ann = c.post("/v1/memory/event", json=body).json()["event_id"]
        with w.client("read", **{"Memspine-Purpose": "art. 15 request"}) as c:
            c.get(f"/v1/memory/event/{ann}")
            c.get(f"/v1/memory/event/{w.ids[0]}")
        mine = w.reads(subject="cust-ann")
        assert [r["event_ids"] for r in mine] == [[ann]]
        with w.client("read") as c:
            lines = [
                json.loads(x)
                for x in c.get("/v1/memory/subjects/cust-ann/export").text.splitlines()
            ]
        reads = [x for x in lines if x["type"] == "read"]
        assert [(x["event_ids"], x["purpose"]) for x in reads] == [([ann], "art. 15 request")]
    finally:
        w.server.stop()


def test_an_access_export_is_itself_a_recorded_read(tmp_path: Path) -> None:
    """The access export leaves a record like every read door: its key, route (the template,
    never the subject), purpose and every event it carried, the derived one too; the auditor
    finds it by subject, and the next access export carries it."""
    w = make_world(tmp_path / "data", {"MEMSPINE_READ_AUDIT": "durable"})
    try:
        with w.client("rw") as c:
            body = {"kind": "fact", "text": "Ann lives in Paris", "subjects": ["cust-ann"]}
            ann = c.post("/v1/memory/event", json=body).json()["event_id"]
            derived = {
                "kind": "fact",
                "text": "she moved",
                "properties": {"source_event_ids": [ann]},
            }
            moved = c.post("/v1/memory/event", json=derived).json()["event_id"]
        before = w.reads(limit=1000)
        with w.client("read", **{"Memspine-Purpose": "art. 15 request"}) as c:
            r = c.get("/v1/memory/subjects/cust-ann/export")
        assert r.status_code == 200
        carried = [
            x["event_id"] for x in map(json.loads, r.text.splitlines()) if x["type"] == "event"
        ]
        assert sorted(carried) == sorted([ann, moved])
        new = w.reads(limit=1000)[len(before) :]
        assert len(new) == 1
        record = new[0]
        assert (record["door"], record["route"]) == (
            "http",
            "/v1/memory/subjects/{subject:str}/export",
        )
        assert (record["event_ids"], record["purpose"]) == (carried, "art. 15 request")
        assert record["key_id"] == w.keys["read"].split("_")[2]
        assert "cust-ann" not in json.dumps(record)
        assert record in w.reads(subject="cust-ann", limit=1000)
        with w.client("read") as c:
            again = [
                json.loads(x)
                for x in c.get("/v1/memory/subjects/cust-ann/export").text.splitlines()
            ]
        routes = [x["route"] for x in again if x["type"] == "read"]
        assert routes == ["/v1/memory/subjects/{subject:str}/export"]
        # A key that must give a purpose is refused without one, as on every read.
        with w.client("purposeful") as c:
            refused = c.get("/v1/memory/subjects/cust-ann/export")
        assert refused.status_code == 400 and "Memspine-Purpose" in refused.json()["detail"]
    finally:
        w.server.stop()


@pytest.mark.timeout(60)
def test_noting_a_cypher_answers_events_walks_a_shared_list_once(world: World) -> None:
    """A value that shares one list thirty times over (2^30 leaves, 31 lists) is refused by the
    bounds at once: the read audit's walk of the rows does not unfold it first (it hung)."""
    query = "WITH [1] AS l " + "WITH [l, l] AS l " * 30 + "RETURN DISTINCT l"
    with world.client("read") as c:
        r = c.post("/v1/memory/cypher", json={"query": query})
    assert r.status_code == 400 and "at most 100000 elements" in r.json()["detail"], r.text

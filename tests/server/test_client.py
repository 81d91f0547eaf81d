"""memspine.client against the app in process: the blocking clients through the app's in-process
transport (tests/support/servers.py AppTransport), the async ones over httpx's ASGI transport into an app
whose lifespan runs on the test's own event loop. Real Litestar, real stores, no socket
(tests/e2e/test_client_e2e.py: a real server, a dropped connection, docs/python.md's session)."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from litestar import Litestar

from memspine.client import (
    AsyncMemspine,
    AsyncMemspineAdmin,
    BatchAppended,
    BrokenExport,
    Conflict,
    EmbeddingMismatch,
    Event,
    ExportDeletedKey,
    ExportEnd,
    ExportEvent,
    ExportHeader,
    Forbidden,
    Hit,
    IdempotencyMismatch,
    InvalidRequest,
    LegalHold,
    Memspine,
    MemspineAdmin,
    NotFound,
    QuotaExceeded,
    Unauthorized,
    UnexpectedAnswer,
    event,
)
from memspine.client import routes as r
from memspine.client.export import ExportCheck
from memspine_admin.plane import init_control
from storage.errors import InvalidRequest as StorageInvalid
from storage.transfer import format as fmt
from tests.support.servers import AppTransport, InProcessServer, cheap_hasher

ADMIN_KEY = "client-admin-key-5d2e8c"
NOWISH = 1_791_208_939_000_000  # 2026-10-05, as in README's session
NO_EVENT = "no event with that id"


class Issued:
    """One app with a control database and the admin key; clients for it through its transport."""

    def __init__(self, server: InProcessServer) -> None:
        self.server = server

    def transport(self) -> AppTransport:
        assert self.server.runner is not None
        return AppTransport(self.server.runner, self.server.port)

    def admin(self, key: str = ADMIN_KEY, **kw: Any) -> MemspineAdmin:
        return MemspineAdmin(self.server.url, key, transport=self.transport(), **kw)

    def tenant(self, key: str, **kw: Any) -> Memspine:
        return Memspine(self.server.url, key, transport=self.transport(), **kw)

    def new_tenant(self, name: str, scopes: list[str] | None = None) -> tuple[str, str]:
        """A tenant and a key of it: (tenant_id, api_key)."""
        with self.admin() as admin:
            tenant = admin.create_tenant(name)
            key = admin.create_key(tenant.tenant_id, "agent", scopes=scopes)
        return tenant.tenant_id, key.api_key


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Issued]:
    data_dir = tmp_path_factory.mktemp("client") / "data"
    init_control(data_dir, None, actor="test")
    server = InProcessServer(data_dir, {"MEMSPINE_ADMIN_KEY": ADMIN_KEY}, hasher=cheap_hasher())
    server.start()
    yield Issued(server)
    server.stop()


def test_a_session_through_the_blocking_client(issued: Issued) -> None:
    tenant_id, key = issued.new_tenant("session")
    with issued.tenant(key) as c:
        assert c.health().status == "ok"
        who = c.whoami()
        assert (who.tenant_id, who.scopes) == (tenant_id, ["read", "write"])
        assert who.vector_space is not None and who.vector_space.made_by == "none"
        assert (who.vector_space.dim, who.vector_space.server_embeds) == (4, False)
        turn = c.append(
            "turn",
            "Lena: the billing cutover is planned for Saturday 10 October",
            ts=NOWISH,
            embedding=[0.9, 0.1, 0.0, 0.0],
            properties={"speaker": "lena", "conversation": "c-1"},
        )
        ghost = str(uuid.uuid4())
        fact = c.append(
            "fact",
            "Billing cutover planned for 2026-10-10",
            ts=NOWISH + 60_000_000,
            properties={"topic": "cutover_date"},
            source_event_ids=[turn.event_id, ghost],
        )
        assert fact.unlinked == [ghost] and not fact.replayed
        got = c.get(fact.event_id)
        assert isinstance(got, Event)
        assert got.properties == {
            "topic": "cutover_date",
            "source_event_ids": [turn.event_id, ghost],
        }
        assert (got.current, got.superseded_by, got.embedding) == (True, [], None)
        assert c.get(turn.event_id).embedding == pytest.approx([0.9, 0.1, 0.0, 0.0])

        page = c.list_events(kind="fact", filter={"topic": "cutover_date"})
        assert [e.event_id for e in page.events] == [fact.event_id] and page.next_cursor is None

        recalled = c.recall("billing cutover", kind="fact", hops=1)
        assert all(isinstance(h, Hit) for h in recalled.hits)
        ranked, walked = recalled.hits
        assert (ranked.event_id, ranked.via, ranked.score > 0) == (fact.event_id, None, True)
        assert (walked.event_id, walked.via, walked.hop) == (turn.event_id, fact.event_id, 1)
        assert recalled.walk is not None and recalled.walk.reached == 1

        rows = c.cypher(
            "MATCH (f:Event {kind: $kind})-[:SOURCE_FROM]->(t) RETURN f.text, t.kind",
            {"kind": "fact"},
        )
        assert rows.columns == ["f.text", "t.kind"]
        assert rows.rows == [["Billing cutover planned for 2026-10-10", "turn"]]

        assert c.would_delete(turn.event_id, cascade=True).would_delete == [
            turn.event_id,
            fact.event_id,
        ]
        done = c.delete(turn.event_id, cascade=True, purge=True)
        assert (done.deleted, done.purged, done.deleted_ids) == (
            True,
            True,
            [turn.event_id, fact.event_id],
        )
        with pytest.raises(NotFound) as caught:
            c.get(fact.event_id)
        err = caught.value
        assert (err.status, err.code, err.detail) == (404, "not_found", NO_EVENT)
        assert err.request_id  # the server's log line carries the same id
        assert list(c.iter_events()) == []


def test_iter_events_walks_every_page_newest_first(issued: Issued) -> None:
    _, key = issued.new_tenant("pages")
    with issued.tenant(key) as c:
        made = [c.append("turn", f"turn {i}", ts=NOWISH + i).event_id for i in range(7)]
        seen = [e.event_id for e in c.iter_events(kind="turn", page_size=3)]
        assert seen == made[::-1]
        assert [e.text for e in c.iter_events(since=NOWISH + 5)] == ["turn 6", "turn 5"]
        first = c.list_events(limit=3)
        assert len(first.events) == 3 and first.next_cursor is not None


def test_every_append_goes_under_an_idempotency_key(issued: Issued) -> None:
    tenant_id, key = issued.new_tenant("idempotency")
    namespace = uuid.uuid5(uuid.NAMESPACE_URL, "memspine:" + tenant_id)
    with issued.tenant(key) as c:
        one = c.append("fact", "same words")
        two = c.append("fact", "same words")
        assert one.idempotency_key and two.idempotency_key
        assert one.idempotency_key != two.idempotency_key  # two calls, two events
        assert one.event_id == str(uuid.uuid5(namespace, one.idempotency_key))
        again = c.append("fact", "same words", idempotency_key=one.idempotency_key)
        assert (again.event_id, again.replayed) == (one.event_id, True)
        mine = c.append("fact", "chosen key", idempotency_key="fact-cutover-1")
        assert mine.event_id == str(uuid.uuid5(namespace, "fact-cutover-1"))
        with pytest.raises(IdempotencyMismatch, match="Idempotency-Key"):
            c.append("fact", "other words", idempotency_key="fact-cutover-1")
        assert sorted(e.text or "" for e in c.iter_events()) == [
            "chosen key",
            "same words",
            "same words",
        ]


def test_errors_carry_the_apis_code_and_sentence(issued: Issued) -> None:
    _, key = issued.new_tenant("errors")
    _, read_key = issued.new_tenant("errors-read", scopes=["read"])
    with issued.tenant(key) as c:
        with pytest.raises(EmbeddingMismatch) as mismatch:
            c.append("turn", "x", embedding=[1.0, 0.0])
        assert mismatch.value.status == 422 and "vectors have 4" in mismatch.value.detail
        with pytest.raises(InvalidRequest, match="limit"):
            c.list_events(limit=5000)
        with pytest.raises(InvalidRequest, match="looks like seconds"):
            c.append("turn", "x", ts=1_791_208_939)
        with pytest.raises(InvalidRequest, match="event id must be a UUID"):
            c.get("not-a-uuid")
        with pytest.raises(NotFound, match="no such route"):  # quoted: it cannot leave the route
            c.get("../../v1/whoami")
        with pytest.raises(ValueError, match="not both"):
            c.append("x", properties={"source_event_ids": []}, source_event_ids=[])
    with issued.tenant(key, time_check=False) as c:  # Memspine-Time-Check: off
        assert c.get(c.append("turn", "small", ts=1_791_208_939).event_id).ts == 1_791_208_939
    with issued.tenant(read_key) as reader:
        with pytest.raises(Forbidden, match="missing the 'write' scope") as refused:
            reader.append("fact", "sneaky")
        assert refused.value.code == "forbidden"
        with pytest.raises(NotFound):  # another tenant's event is not there
            reader.get(issued.tenant(key).iter_events().__next__().event_id)
    with issued.tenant("smk_live_nope_nope") as stranger, pytest.raises(Unauthorized):
        stranger.whoami()


def test_the_admin_client(issued: Issued) -> None:
    with issued.admin() as admin:
        tenant = admin.create_tenant("admin-client")
        assert tenant.name == "admin-client"
        with pytest.raises(Conflict):  # a name in use: a 409 that is never retried
            admin.create_tenant("admin-client")
        assert tenant.tenant_id in {t.tenant_id for t in admin.list_tenants()}
        issued_key = admin.create_key(tenant.tenant_id, "reader", scopes=["read"], ttl_secs=3600)
        assert issued_key.api_key.startswith(f"smk_live_{issued_key.key_id}_")
        assert issued_key.scopes == ["read"] and issued_key.expires_at is not None
        [listed] = admin.list_keys(tenant.tenant_id)
        assert (listed.key_id, listed.status) == (issued_key.key_id, "active")
        with issued.tenant(issued_key.api_key) as reader:
            assert reader.whoami().key_id == issued_key.key_id
            revoked = admin.revoke_key(listed.prefix)
            assert revoked.status == "revoked" and revoked.revoked_at is not None
            with pytest.raises(Unauthorized):
                reader.whoami()
        actions = [e.action for e in admin.iter_audit(tenant_id=tenant.tenant_id, page_size=2)]
        assert actions[:3] == ["tenant.create", "key.create", "key.revoke"]
        gone = admin.delete_tenant(tenant.tenant_id)
        assert gone.deleted and gone.revoked_keys == []
        with pytest.raises(NotFound):
            admin.delete_tenant(tenant.tenant_id)
    with issued.admin("wrong-admin-key") as stranger, pytest.raises(Unauthorized):
        stranger.list_tenants()


# -- async, over httpx's ASGI transport --------------------------------------------------------


@asynccontextmanager
async def asgi_app(data_dir: Path, env: dict[str, str] | None = None) -> AsyncIterator[Litestar]:
    """memspine-server's app with its lifespan (purger, idle closer) on this event loop."""
    from memspine.app import create_app
    from memspine.config import load_settings

    settings = load_settings(
        {"MEMSPINE_DATA_DIR": str(data_dir), "MEMSPINE_EMBEDDING_DIM": "4", **(env or {})}
    )
    app = create_app(settings)
    async with app.lifespan():
        yield app


def asgi(app: Litestar) -> httpx.ASGITransport:
    return httpx.ASGITransport(app=app, client=("127.0.0.1", 40123))


URL = "http://127.0.0.1:7781"


def test_the_async_client_over_the_asgi_transport(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            asgi_app(tmp_path / "data") as app,
            AsyncMemspine(URL, "my-project", transport=asgi(app)) as c,
        ):
            assert (await c.whoami()).key_id == "local"
            turn = await c.append("turn", "Lena: the cutover is on Saturday", ts=NOWISH)
            fact = await c.append(
                "fact", "Cutover on 2026-10-10", ts=NOWISH + 1, source_event_ids=[turn.event_id]
            )
            again = await c.append(
                "fact",
                "Cutover on 2026-10-10",
                ts=NOWISH + 1,
                source_event_ids=[turn.event_id],
                idempotency_key=fact.idempotency_key,
            )
            assert (again.event_id, again.replayed) == (fact.event_id, True)
            assert (await c.get(fact.event_id)).properties["source_event_ids"] == [turn.event_id]
            hits = (await c.recall("cutover", hops=1)).hits
            assert {h.event_id for h in hits} == {turn.event_id, fact.event_id}
            assert [e.event_id async for e in c.iter_events(page_size=1)] == [
                fact.event_id,
                turn.event_id,
            ]
            assert (await c.cypher("MATCH (e) RETURN count(e)")).rows == [[2]]
            would = await c.would_delete(turn.event_id, cascade=True)
            assert would.would_delete == [turn.event_id, fact.event_id]
            assert (await c.delete(fact.event_id)).deleted_ids == [fact.event_id]
            with pytest.raises(NotFound, match=NO_EVENT):
                await c.get(fact.event_id)

    anyio.run(main)


def test_the_async_admin_client(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"

    async def main() -> None:
        env = {"MEMSPINE_ADMIN_KEY": ADMIN_KEY}
        async with (
            asgi_app(data_dir, env) as app,
            AsyncMemspineAdmin(URL, ADMIN_KEY, transport=asgi(app)) as admin,
        ):
            with pytest.raises(Conflict, match="memspine-admin init"):
                await admin.list_tenants()
            init_control(data_dir, None, actor="test")
            tenant = await admin.create_tenant("async")
            key = await admin.create_key(tenant.tenant_id, "agent")
            async with AsyncMemspine(URL, key.api_key, transport=asgi(app)) as c:
                assert (await c.whoami()).tenant_id == tenant.tenant_id
            assert [k.key_id for k in await admin.list_keys()] == [key.key_id]
            entries = [e.action async for e in admin.iter_audit(page_size=1)]
            assert entries[-2:] == ["tenant.create", "key.create"]

    anyio.run(main)


def test_the_mcp_bridge_answers_with_the_routes_json(tmp_path: Path) -> None:
    """`memspine mcp --url`'s backend: the route's JSON as sent, the server's refusals as they
    came (code, sentence), replays marked as EngineBackend marks them."""
    from memspine.mcp.remote import Refused, RemoteBackend

    async def main() -> None:
        async with (
            asgi_app(tmp_path / "data") as app,
            AsyncMemspine(URL, "bridge", transport=asgi(app)) as c,
            httpx.AsyncClient(
                base_url=URL, transport=asgi(app), headers={"Authorization": "Bearer bridge"}
            ) as http,
        ):
            backend = RemoteBackend(c)
            body = {"kind": "fact", "text": "Gate code 4417", "properties": {"n": 1.0}}
            made = await backend.append(body, "k-1")
            assert await backend.append(body, "k-1") == {**made, "replayed": True}
            raw = (await http.get(f"/v1/memory/event/{made['event_id']}")).json()
            assert await backend.get(made["event_id"]) == raw
            page = await backend.list_events({"kind": "fact", "limit": 5})
            assert page == (await http.get("/v1/memory/events?kind=fact&limit=5")).json()
            assert (await backend.recall({"text": "gate code", "k": 3}))["hits"][0][
                "event_id"
            ] == made["event_id"]
            with pytest.raises(Refused) as refused:
                await backend.get(str(uuid.uuid4()))
            assert (refused.value.status, refused.value.code, refused.value.detail) == (
                404,
                "not_found",
                NO_EVENT,
            )
            would = await backend.delete(made["event_id"], cascade=False, dry_run=True)
            assert would == {"would_delete": [made["event_id"]]}

    anyio.run(main)


def test_answers_decode_as_structs_and_ignore_fields_a_newer_server_adds() -> None:
    raw = b'{"event_id": "e", "kind": "k", "ts": 1, "text": null, "properties": {}, "new": 1}'
    assert msgspec.json.decode(raw, type=Event) == Event(event_id="e", kind="k", ts=1)
    request = httpx.Request("GET", URL + "/v1/memory/event/e")
    page = httpx.Response(200, content=b"<html>a portal</html>", request=request)
    with pytest.raises(UnexpectedAnswer, match="GET /v1/memory/event/e is not what") as caught:
        r.get("e").result(page)
    assert (caught.value.status, caught.value.code) == (200, "unexpected_answer")


# -- the client covers the server's routes, and says only what they take -----------------------

ID = "5ea4079f-31a8-463d-88cc-9903938a1a42"
# Every operation the server declares (memspine/routes/), as the client sends it with every
# argument given. A route added to the server without a client method fails the test below.
CLIENT_CALLS: dict[str, Any] = {
    "health": lambda: r.health(),
    "whoami": lambda: r.whoami(),
    "append_event": lambda: r.append(
        r.event(
            "fact",
            "t",
            ts=1,
            embedding=[1.0],
            embedding_model="m",
            properties={"a": 1},
            source_event_ids=[ID],
            supersedes=[ID],
            valid_from=0,
            valid_until=2,
        ),
        "key",
    ),
    "get_event": lambda: r.get(ID),
    "delete_event": lambda: r.delete(ID, cascade=True, purge=True),
    "list_events": lambda: r.list_events(
        kind="k",
        since=0,
        until=1,
        limit=2,
        cursor="c",
        filter={"topic": "x"},
        current=False,
        as_of=3,
    ),
    "recall": lambda: r.recall(
        "t",
        embedding=[1.0],
        embedding_model="m",
        kind="k",
        k=1,
        hops=1,
        filter={"a": 1},
        current=False,
        as_of=2,
        explain=True,
    ),
    "cypher": lambda: r.cypher("RETURN 1", {"p": 1}),
    "append_events": lambda: r.append_batch(
        [
            event(
                "fact",
                "t",
                ts=1,
                embedding=[1.0],
                embedding_model="m",
                properties={"a": 1},
                source_event_ids=[ID],
                supersedes=[ID],
                valid_from=0,
                valid_until=2,
                idempotency_key="k",
            )
        ],
        "batch-key",
    ),
    "export_events": lambda: r.export(),
    "create_tenant": lambda: r.create_tenant("n", ID),
    "get_tenant": lambda: r.get_tenant(ID),
    "set_tenant_limits": lambda: r.set_tenant_limits(
        ID, max_events=1, max_bytes=None, max_memory=3
    ),
    "list_tenants": lambda: r.list_tenants(),
    "delete_tenant": lambda: r.delete_tenant(ID),
    "create_key": lambda: r.create_key(
        ID, "n", scopes=["read"], ttl_secs=60, requests_per_minute=600, require_purpose=True
    ),
    "list_keys": lambda: r.list_keys(ID),
    "revoke_key": lambda: r.revoke_key("abc"),
    "audit": lambda: r.audit(limit=1, cursor="c", tenant_id=ID),
    "audit_reads": lambda: r.reads(
        event_id=ID, key_id="k", subject="s", since=0, until=1, cursor="1", limit=2
    ),
    "admin_tenant_reads": lambda: r.reads(tenant_id=ID, event_id=ID, limit=2),
    "place_hold": lambda: r.place_hold(ID, "dispute 7", "cust-1"),
    "list_holds": lambda: r.list_holds(ID),
    "lift_hold": lambda: r.lift_hold(ID, "h1"),
    "erase_subject": lambda: r.erase_subject(
        "cust-1", dry_run=False, identifiers=["Ann"], confirm_ids=[ID], cascade="none"
    ),
    "export_subject": lambda: r.export_subject("cust-1"),
    "list_receipts": lambda: r.list_receipts(),
    "get_receipt": lambda: r.get_receipt("0" * 32),
    "receipt_key": lambda: r.receipt_key(),
    "tenant_retention": lambda: r.tenant_retention(),
    "erase_subject_everywhere": lambda: r.erase_subject_everywhere(
        "cust-1", dry_run=False, identifiers=["Ann"], confirm_ids=[ID], cascade="none"
    ),
}
NOT_IN_THE_CLIENT = {
    "metrics": "Prometheus text, for a scraper",
    "home": "the paths a person starts from (/ui, /schema), for a person or a browser",
}


def test_every_route_of_the_server_has_a_client_call_that_sends_only_what_it_takes() -> None:
    from memspine.routes import OPERATIONS

    # The node-to-node routes of a tenant move (memspine/routes/move.py): memspine-admin tenant
    # move drives them between nodes; no client of the API calls them.
    operations = [op for op in OPERATIONS if not op.name.startswith("move_")]
    assert {op.name for op in operations} == set(CLIENT_CALLS) | set(NOT_IN_THE_CLIENT)
    for op in operations:
        if op.name in NOT_IN_THE_CLIENT:
            continue
        call = CLIENT_CALLS[op.name]()
        pattern = re.sub(r"\{[a-z_]+:str\}", "[^/]+", op.path)
        assert call.method == op.method and re.fullmatch(pattern, call.path), op.name
        for name in call.params or {}:
            assert name in op.params or (op.props and name.startswith("prop.")), (op.name, name)
        if call.body is None:
            assert op.body is None, op.name
        else:
            assert op.body is not None, op.name
            sent = msgspec.json.decode(call.body)
            assert set(sent) <= set(op.body.__struct_fields__), op.name
            if op.name == "append_events":  # each event: the batch item's fields, no other
                from memspine.batch import BatchItem

                assert set(sent["events"][0]) <= set(BatchItem.__struct_fields__), op.name
        assert set(call.headers) <= {h.name for h in op.headers}, op.name


def test_importing_the_client_loads_nothing_of_the_server() -> None:
    code = (
        "import sys, memspine.client; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'litestar', 'storage', "
        "'memspine_admin', 'lmdb', 'tantivy', 'hnswlib', 'mcp', 'uvicorn', 'numpy', 'argon2'}), "
        "sorted(m for m in sys.modules if m.startswith('memspine.') and "
        "not m.startswith('memspine.client')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[] []"


# -- batch append, export, a tenant's record and limits ----------------------------------------


def test_a_batch_goes_under_a_key_per_event_so_a_resent_batch_stores_nothing(
    issued: Issued,
) -> None:
    tenant_id, key = issued.new_tenant("batch")
    namespace = uuid.uuid5(uuid.NAMESPACE_URL, "memspine:" + tenant_id)
    with issued.tenant(key) as c:
        events = [
            event("turn", "Lena: the cutover is on Saturday", ts=NOWISH),
            event("fact", "Cutover on 2026-10-10", ts=NOWISH + 1, source_event_ids=["$0"]),
            event("fact", "mine", ts=NOWISH + 2, idempotency_key="fact-mine-1"),
        ]
        call = r.append_batch(events)
        done = c._run(call)
        assert isinstance(done, BatchAppended) and done.replayed == [] and done.unlinked == []
        assert len(done.idempotency_keys) == 3 and done.idempotency_keys[2] == "fact-mine-1"
        # each id derives from its key exactly as a one-event append's does
        assert done.event_ids == [str(uuid.uuid5(namespace, k)) for k in done.idempotency_keys]
        assert c.get(done.event_ids[1]).properties["source_event_ids"] == [done.event_ids[0]]
        again = c._run(call)  # the same request again, as a retry sends it
        assert again.event_ids == done.event_ids and again.replayed == [0, 1, 2]
        alone = c.append("fact", "mine", ts=NOWISH + 2, idempotency_key="fact-mine-1")
        assert (alone.event_id, alone.replayed) == (done.event_ids[2], True)
        fresh = c.append_batch(events)  # a new call: new keys, new events
        assert set(fresh.event_ids[:2]).isdisjoint(done.event_ids)
        assert fresh.event_ids[2] == done.event_ids[2] and fresh.replayed == [2]
        assert len(list(c.iter_events())) == 5


def test_a_batch_under_one_key_takes_its_per_event_keys_from_it(issued: Issued) -> None:
    tenant_id, key = issued.new_tenant("batch-key")
    namespace = uuid.uuid5(uuid.NAMESPACE_URL, "memspine:" + tenant_id)
    with issued.tenant(key) as c:
        events = [event("turn", f"turn {i}", ts=NOWISH + i) for i in range(3)]
        done = c.append_batch(events, idempotency_key="load-7")
        assert done.idempotency_keys == ["load-7/0", "load-7/1", "load-7/2"]
        assert done.event_ids == [str(uuid.uuid5(namespace, f"load-7/{i}")) for i in range(3)]
        assert c.append_batch(events, idempotency_key="load-7").replayed == [0, 1, 2]
        assert len(list(c.iter_events())) == 3


def test_a_refused_batch_raises_its_events_error_and_stores_nothing(issued: Issued) -> None:
    _, key = issued.new_tenant("batch-refused")
    with issued.tenant(key) as c:
        good = event("turn", "fine", ts=NOWISH, embedding=[1.0, 0.0, 0.0, 0.0])
        bad = event("turn", "short", ts=NOWISH, embedding=[1.0, 0.0])
        with pytest.raises(EmbeddingMismatch, match=r"events\[1\]: .*stored nothing"):
            c.append_batch([good, bad])
        with pytest.raises(InvalidRequest, match=r"events\[0\]: .*\$1"):
            c.append_batch([event("fact", "x", source_event_ids=["$1"]), good])
        with pytest.raises(ValueError, match="1 to 1000 events"):
            c.append_batch([])
        assert list(c.iter_events()) == []


def _exported(c: Memspine) -> tuple[str, list[str]]:
    """A tenant with a linked pair, a pretty-printed properties object, and a deleted keyed
    append: its export's bytes, and the ids of the live events."""
    made = c.append_batch(
        [
            event("turn", "parcel late", ts=NOWISH, embedding=[0.1, 0.2, 0.3, 0.4]),
            event("fact", "refund agreed", ts=NOWISH + 1, source_event_ids=["$0"]),
            event("fact", "soon gone", ts=NOWISH + 2),
        ]
    )
    c.delete(made.event_ids[2])
    lines = list(c.export_lines())
    return b"".join(lines).decode(), made.event_ids[:2]


def test_an_export_streams_as_lines_the_import_reader_accepts(issued: Issued) -> None:
    tenant_id, key = issued.new_tenant("export")
    with issued.tenant(key) as c:
        text, live = _exported(c)
        reader = fmt.Reader()
        for line in text.splitlines(keepends=True):
            reader.feed(line.encode())
        assert reader.finish().events == 2 and reader.header is not None
        assert reader.header.tenant_id == tenant_id

        records = list(c.iter_export())
        header, turn, fact, deleted, end = records
        assert isinstance(header, ExportHeader) and (header.events, header.embedding_dim) == (2, 4)
        assert isinstance(turn, ExportEvent) and isinstance(fact, ExportEvent)
        assert [turn.event_id, fact.event_id] == live
        assert turn.embedding == pytest.approx([0.1, 0.2, 0.3, 0.4])
        assert [live[0]] == fact.links.SOURCE_FROM
        assert fact.properties == {"source_event_ids": [live[0]]}
        assert fact.idempotency is not None and len(fact.idempotency.body_hash) == 64
        assert isinstance(deleted, ExportDeletedKey)
        assert isinstance(end, ExportEnd) and (end.events, end.idempotency) == (2, 1)


def test_a_damaged_export_is_refused_by_the_client_as_by_the_import(issued: Issued) -> None:
    _, key = issued.new_tenant("export-damaged")
    with issued.tenant(key) as c:
        text, _ = _exported(c)
    lines = text.splitlines(keepends=True)
    damaged = {
        "changed": "".join(lines).replace("refund agreed", "refund refused"),
        "a line less": "".join(lines[:2] + lines[3:]),
        "a line more": "".join(lines[:2] + lines[1:]),
        "cut short": "".join(lines)[:-10],
        "no end": "".join(lines[:-1]),
    }
    for what, body in damaged.items():
        check = ExportCheck()
        with pytest.raises(BrokenExport, match="not a whole export"):
            for i in range(0, len(body), 7):  # in chunks that cut lines anywhere
                check.lines(body[i : i + 7].encode())
            check.finish()
        reader = fmt.Reader()
        with pytest.raises(StorageInvalid):
            for line in body.splitlines(keepends=True):
                reader.feed(line.encode())
            reader.finish()
        assert what
    whole = ExportCheck()
    assert b"".join(whole.lines(text.encode())) == text.encode() and whole.finish().events == 2


def test_the_admin_client_shows_a_tenant_and_sets_its_limits(issued: Issued) -> None:
    chosen = str(uuid.uuid4())
    with issued.admin() as admin:
        tenant = admin.create_tenant("limited", tenant_id=chosen.upper())
        assert tenant.tenant_id == chosen
        shown = admin.get_tenant(chosen)
        assert (shown.name, shown.max_events, shown.usage.events.live) == ("limited", None, 0)
        capped = admin.set_tenant_limits(chosen, max_events=2, max_bytes=1 << 20)
        assert (capped.max_events, capped.max_bytes, capped.limits.max_events) == (2, 1 << 20, 2)
        kept = admin.set_tenant_limits(chosen, max_bytes=None)  # max_events not named: it stays
        assert (kept.max_events, kept.max_bytes) == (2, None)
        issued_key = admin.create_key(chosen, "agent", requests_per_minute=600)
        assert issued_key.requests_per_minute == 600
        [listed] = admin.list_keys(chosen)
        assert listed.requests_per_minute == 600
        with issued.tenant(issued_key.api_key) as c:
            assert c.whoami().key_id == issued_key.key_id
            c.append_batch([event("turn", "one"), event("turn", "two")])
            with pytest.raises(QuotaExceeded, match="max_events"):
                c.append("turn", "three")
        assert admin.get_tenant(chosen).usage.events.live == 2
        with pytest.raises(NotFound):
            admin.get_tenant(str(uuid.uuid4()))


def test_the_async_client_appends_batches_and_reads_exports(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            asgi_app(tmp_path / "data") as app,
            AsyncMemspine(URL, "my-project", transport=asgi(app)) as c,
        ):
            events = [event("turn", "a", ts=NOWISH), event("fact", "b", ts=NOWISH + 1)]
            done = await c.append_batch(events, idempotency_key="async-1")
            assert done.idempotency_keys == ["async-1/0", "async-1/1"]
            assert (await c.append_batch(events, idempotency_key="async-1")).replayed == [0, 1]
            records = [x async for x in c.iter_export()]
            assert [type(x).__name__ for x in records] == [
                "ExportHeader",
                "ExportEvent",
                "ExportEvent",
                "ExportEnd",
            ]
            raw = b"".join([line async for line in c.export_lines()])
            assert raw.count(b"\n") == 4 and raw.endswith(b"\n")
            assert [e.event_id for e in records if isinstance(e, ExportEvent)] == done.event_ids

    anyio.run(main)


def test_an_admin_places_lists_and_lifts_a_hold_that_stops_a_delete(issued: Issued) -> None:
    tenant_id, key = issued.new_tenant("held")
    with issued.tenant(key) as c:
        kept = c.append("turn", "the dispute evidence", ts=NOWISH).event_id
    with issued.admin() as admin:
        hold = admin.place_hold(tenant_id, "dispute 7")
        assert [h.hold_id for h in admin.list_holds(tenant_id).holds] == [hold.hold_id]
        with issued.tenant(key) as c, pytest.raises(LegalHold):
            c.delete(kept)
        lifted = admin.lift_hold(tenant_id, hold.hold_id)
        assert lifted.lifted and admin.list_holds(tenant_id).holds == []
    with issued.tenant(key) as c:
        assert c.delete(kept).deleted


def test_subjects_and_their_erasure_through_the_blocking_client(issued: Issued) -> None:
    _tenant_id, key = issued.new_tenant("subjects")
    with issued.tenant(key) as c:
        tagged = c.append("turn", "Ann asked for a refund", subjects=["cust-9"]).event_id
        c.append("turn", "the weather")
        assert c.get(tagged).subjects == ["cust-9"]
        assert [e.event_id for e in c.list_events(subject="cust-9").events] == [tagged]
        dry = c.erase_subject("cust-9")
        assert (dry.subject, dry.count, dry.events[0].reasons) == ("cust-9", 1, ["subject"])
        done = c.erase_subject("cust-9", dry_run=False)
        assert done.deleted_ids == [tagged] and done.receipt is not None
        assert [r["receipt_id"] for r in c.receipts().receipts] == [done.receipt_id]
        assert c.receipt(done.receipt_id or "").signature == done.receipt.signature
        assert c.receipt_key().public_key == done.receipt.public_key
    with issued.admin() as admin:
        assert admin.erase_subject_everywhere("cust-9").tenants == []

"""MCP in process: every tool through the SDK's in-memory client with issued read and write keys,
and /mcp's refusals and origins through the app (tests/e2e/test_mcp_e2e.py: a real server over
Streamable HTTP, `memspine mcp` over stdio, embedded and as a client of the server)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from memspine.auth import Authenticator
from memspine.config import Settings
from memspine.engine import Engine
from memspine.mcp.backend import EngineBackend
from memspine.mcp.http import origin_allowed
from memspine.mcp.render import iso
from memspine.mcp.server import Caller, build_server
from memspine.mcp.tools import TOOLS
from tests.support.mcp_calls import (
    ALL_TOOLS,
    CHEAP_HASHER,
    FORBIDDEN,
    NO_EVENT,
    READ_TOOLS,
    call,
    issue_keys,
    refused,
    text,
)
from tests.support.servers import InProcessServer


class InProcess:
    """An engine on tmp_path and the issued keys; connects the SDK's in-process client as a key."""

    def __init__(self, data_dir: Path) -> None:
        self.keys = issue_keys(data_dir)
        self.engine = Engine(Settings(data_dir=data_dir, embedding_dim=4))
        self.auth = Authenticator(data_dir, None, hasher=CHEAP_HASHER)

    @asynccontextmanager
    async def client(self, key: str, mode: str = "auto") -> AsyncIterator[Client]:
        """The in-process client; every request authenticates `key` as the HTTP endpoint does."""

        def resolve(_ctx: Any) -> Caller:
            principal = self.auth.authenticate(key)
            return Caller(principal, EngineBackend(self.engine, principal))

        async with Client(build_server(resolve), mode=mode) as client:
            yield client

    def close(self) -> None:
        self.engine.close()
        self.auth.close()


@pytest.fixture
def inproc(tmp_path: Path) -> Iterator[InProcess]:
    env = InProcess(tmp_path / "data")
    yield env
    env.close()


# -- in process --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_tools_listed_by_scope(inproc: InProcess, mode: str) -> None:
    async def main() -> None:
        seen = {}
        for name in ("read", "write", "rw"):
            async with inproc.client(inproc.keys[name], mode) as client:
                seen[name] = {t.name: t for t in (await client.list_tools()).tools}
        assert set(seen["read"]) == READ_TOOLS
        assert set(seen["write"]) == {"memory_append", "memory_delete"}
        assert set(seen["rw"]) == ALL_TOOLS
        for tool in seen["rw"].values():
            assert tool.description and len(tool.description) > 200
            assert tool.input_schema["type"] == "object"
            assert tool.annotations is not None
            assert tool.annotations.read_only_hint is (tool.name in READ_TOOLS)
        assert seen["rw"]["memory_delete"].annotations.destructive_hint is True  # type: ignore[union-attr]
        assert "dry_run=true" in (seen["rw"]["memory_delete"].description or "")

    anyio.run(main)


def test_schemas_match_the_arguments_the_tools_parse() -> None:
    for spec in TOOLS:
        schema = spec.tool.input_schema
        fields = set(spec.args.__struct_fields__)
        assert set(schema["properties"]) == fields, spec.tool.name
        required = {f for f in fields if _required(spec.args, f)}
        assert set(schema["required"]) >= required, spec.tool.name
        assert schema["additionalProperties"] is False
        for name, prop in schema["properties"].items():
            assert prop.get("description"), f"{spec.tool.name}.{name} has no description"


def _required(struct: Any, field: str) -> bool:
    fields = struct.__struct_fields__
    defaults = struct.__struct_defaults__
    return fields.index(field) < len(fields) - len(defaults)


PARCEL = "The parcel was signed for at number 16."
REFUND = {
    "kind": "decision",
    "text": "Refund the customer: the parcel went to number 16.",
    "idempotency_key": "refund-1",
}


async def seed(c: Client) -> tuple[str, str]:
    """A fact and a decision derived from it (with one source id that names nothing)."""
    args = {"kind": "fact", "text": PARCEL, "properties": {"topic": "parcel", "priority": 2}}
    fact = (await call(c, "memory_append", args))["event_id"]
    refund = await call(c, "memory_append", {**REFUND, "source_event_ids": [fact, "nope"]})
    assert refund["unlinked"] == ["nope"]
    return fact, refund["event_id"]


def test_append_links_sources_and_replays_an_idempotent_retry(inproc: InProcess) -> None:
    async def main() -> None:
        async with inproc.client(inproc.keys["rw"]) as c:
            fact, refund = await seed(c)
            again = await c.call_tool(
                "memory_append", {**REFUND, "source_event_ids": [fact, "nope"]}
            )
            assert again.structured_content == {
                "event_id": refund,
                "unlinked": ["nope"],
                "replayed": True,
            }
            assert text(again).startswith(f"Already stored as {refund}")
            changed = await refused(c, "memory_append", {**REFUND, "text": "other"})
            assert changed["error"] == "idempotency_mismatch"
            got = await call(c, "memory_get", {"id": refund})
            assert got["properties"] == {"source_event_ids": [fact, "nope"]}
            rows = await call(
                c,
                "memory_cypher",
                {
                    "query": "MATCH (d:Event)-[:SOURCE_FROM]->(s:Event {event_id: $id}) RETURN d.event_id, d.kind",
                    "params": {"id": fact},
                },
            )
            assert rows == {"columns": ["d.event_id", "d.kind"], "rows": [[refund, "decision"]]}
            assert "1 row(s):" in text(
                await c.call_tool("memory_cypher", {"query": "MATCH (n) RETURN count(n)"})
            )

    anyio.run(main)


def test_recall_prints_one_line_per_event_and_the_walk(inproc: InProcess) -> None:
    async def main() -> None:
        async with inproc.client(inproc.keys["rw"]) as c:
            fact, refund = await seed(c)
            hits = await c.call_tool(
                "memory_recall", {"text": "signed parcel", "kind": "fact", "hops": 1}
            )
            out = hits.structured_content
            assert [h["event_id"] for h in out["hits"]] == [fact, refund]
            assert (out["hits"][1]["via"], out["hits"][1]["hop"]) == (fact, 1)
            lines = text(hits).splitlines()
            assert lines[1] == f"1. {fact} · fact · {iso(out['hits'][0]['ts'])} · {PARCEL}"
            assert lines[-1].startswith(f"- {refund} · decision · ")
            assert lines[-1].endswith(f" · via {fact} (hop 1)")
            filtered = await call(
                c, "memory_recall", {"text": "parcel", "filter": {"topic": "parcel"}}
            )
            assert [h["event_id"] for h in filtered["hits"]] == [fact]
            none = await c.call_tool("memory_recall", {"text": "zebra"})
            assert none.structured_content["hits"] == [] and text(none).startswith(
                "No matching events"
            )

    anyio.run(main)


def test_get_shows_supersession_and_list_pages_newest_first(inproc: InProcess) -> None:
    async def main() -> None:
        async with inproc.client(inproc.keys["rw"]) as c:
            fact, refund = await seed(c)
            newer = (
                await call(
                    c,
                    "memory_append",
                    {
                        "kind": "fact",
                        "text": "Signed for at number 18.",
                        "supersedes": [fact],
                    },
                )
            )["event_id"]
            got = await c.call_tool("memory_get", {"id": fact})
            assert got.structured_content["current"] is False
            assert got.structured_content["superseded_by"] == [newer]
            assert f"state: not current; superseded by {newer}" in text(got)
            assert text(got).endswith(f"text:\n{PARCEL}")
            page = await call(c, "memory_list", {"limit": 1})
            assert [e["event_id"] for e in page["events"]] == [newer]
            rest = await c.call_tool("memory_list", {"cursor": page["next_cursor"]})
            assert [e["event_id"] for e in rest.structured_content["events"]] == [
                refund
            ]  # fact is superseded
            assert f'cursor "{page["next_cursor"]}"' in text(
                await c.call_tool("memory_list", {"limit": 1})
            )
            ts = (await call(c, "memory_get", {"id": refund}))["ts"]
            window = await call(c, "memory_list", {"since": str(ts), "until": ts + 1})
            assert [e["event_id"] for e in window["events"]] == [refund]
            later = await call(c, "memory_list", {"since": "2999-01-01T00:00:00Z"})
            assert later["events"] == []
            earlier = await call(c, "memory_list", {"until": "2000-01-01", "kind": "fact"})
            assert earlier["events"] == []
            # Times before 2000 are refused as a likely mistake of unit (docs/api.md).
            assert "until" in (await refused(c, "memory_list", {"until": 1791208939}))["detail"]

    anyio.run(main)


def test_recall_says_what_current_state_left_out(inproc: InProcess) -> None:
    async def main() -> None:
        async with inproc.client(inproc.keys["rw"]) as c:
            fact, _refund = await seed(c)
            newer = {"kind": "fact", "text": "Signed for at number 18.", "supersedes": [fact]}
            await call(c, "memory_append", newer)
            out = await c.call_tool("memory_recall", {"text": "signed for at number"})
            assert out.structured_content["withheld"] == {
                "superseded": 1,
                "expired": 0,
                "not_yet_valid": 0,
            }
            assert text(out).endswith(
                "Current state left out matching events: 1 superseded by newer events."
            )
            plain = await c.call_tool("memory_recall", {"text": "refund"})
            assert "withheld" not in plain.structured_content and "left out" not in text(plain)

    anyio.run(main)


def test_delete_dry_runs_by_default_and_cascades_on_request(inproc: InProcess) -> None:
    async def main() -> None:
        async with inproc.client(inproc.keys["rw"]) as c:
            fact, refund = await seed(c)
            dry = await c.call_tool("memory_delete", {"id": fact})
            assert dry.structured_content == {"would_delete": [fact]}
            assert "nothing deleted" in text(dry) and "dry_run=false" in text(dry)
            dry = await call(c, "memory_delete", {"id": fact, "cascade": True})
            assert dry == {"would_delete": [fact, refund]}
            await call(c, "memory_get", {"id": fact})  # dry runs change nothing
            one = await call(c, "memory_delete", {"id": refund, "dry_run": False})
            assert one == {"deleted": True, "purged": False, "deleted_ids": [refund]}
            assert await refused(c, "memory_get", {"id": refund}) == NO_EVENT
            assert await refused(c, "memory_delete", {"id": refund}) == NO_EVENT
            later = await call(
                c, "memory_append", {"kind": "summary", "text": "s", "source_event_ids": [fact]}
            )
            gone = await c.call_tool(
                "memory_delete", {"id": fact, "cascade": True, "dry_run": False}
            )
            assert gone.structured_content["deleted_ids"] == [fact, later["event_id"]]
            assert text(gone).startswith(f"Deleted 2 event(s): {fact}, {later['event_id']}.")
            assert (await call(c, "memory_list", {}))["events"] == []

    anyio.run(main)


def test_a_read_key_cannot_write(inproc: InProcess) -> None:
    async def main() -> None:
        async with inproc.client(inproc.keys["rw"]) as rw:
            kept = (await call(rw, "memory_append", {"kind": "fact", "text": "kept"}))["event_id"]
        async with inproc.client(inproc.keys["read"]) as c:
            assert (
                await refused(c, "memory_append", {"kind": "fact", "text": "sneaky"}) == FORBIDDEN
            )
            for dry_run in (True, False):
                assert (
                    await refused(c, "memory_delete", {"id": kept, "dry_run": dry_run}) == FORBIDDEN
                )
            listed = await call(c, "memory_list", {})
            assert [e["event_id"] for e in listed["events"]] == [kept]
        async with inproc.client(inproc.keys["write"]) as c:
            assert await refused(c, "memory_recall", {"text": "kept"}) == {
                "error": "forbidden",
                "detail": "api key is missing the 'read' scope",
            }

    anyio.run(main)


def test_bad_arguments_are_tool_errors_that_say_what_to_fix(inproc: InProcess) -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("memory_recall", {"txt": "parcel"}, "unknown field `txt`"),
        ("memory_recall", {"text": "parcel", "k": 500}, "k must be from 1 to 100"),
        ("memory_recall", {"text": "parcel", "hops": 9}, "hops must be from 0 to 3"),
        ("memory_recall", {"text": 16}, "Expected `str`, got `int` - at `text`"),
        ("memory_append", {"text": "no kind"}, "missing required field `kind`"),
        (
            "memory_append",
            {
                "kind": "x",
                "text": "t",
                "properties": {"source_event_ids": []},
                "source_event_ids": [],
            },
            "give source_event_ids once",
        ),
        ("memory_get", {"id": "16"}, "event id must be a UUID"),
        ("memory_list", {"since": "last tuesday"}, "since must be an ISO 8601 time"),
        ("memory_list", {"limit": 0}, "limit must be from 1 to 1000"),
        ("memory_list", {"cursor": "junk"}, "cursor is not valid"),
        ("memory_cypher", {"query": "MATCH (n RETURN n"}, "line 1"),
        (
            "memory_cypher",
            {"query": "MATCH (n) WHERE n.kind = $k RETURN n"},
            "missing parameter $k",
        ),
        (
            "memory_cypher",
            {"query": "MATCH (n) " + "WITH n " * 600 + "RETURN n"},
            "more than 100 clauses",
        ),
    ]

    async def main() -> None:
        async with inproc.client(inproc.keys["rw"]) as c:
            for name, args, expected in cases:
                err = await refused(c, name, args)
                assert err["error"] == "invalid_request", (name, args, err)
                assert expected in err["detail"], (name, args, err)
            with pytest.raises(MCPError, match="unknown tool"):
                await c.call_tool("memory_update", {})
            assert (await call(c, "memory_list", {}))["events"] == []  # nothing was written

    anyio.run(main)


@pytest.mark.parametrize(
    ("origin", "host", "bind", "allowed"),
    [
        (None, "127.0.0.1:7781", "127.0.0.1", True),
        ("http://localhost:5173", "127.0.0.1:7781", "127.0.0.1", True),
        ("http://127.0.0.1:7781", "127.0.0.1:7781", "127.0.0.1", True),
        ("http://[::1]:7781", "[::1]:7781", "::1", True),
        ("https://evil.example", "127.0.0.1:7781", "127.0.0.1", False),
        (
            "http://rebound.example:7781",
            "rebound.example:7781",
            "127.0.0.1",
            False,
        ),  # DNS rebinding
        ("https://memory.example.com", "memory.example.com", "0.0.0.0", True),
        ("https://evil.example", "memory.example.com", "0.0.0.0", False),
        ("null", "127.0.0.1:7781", "127.0.0.1", False),
        ("http://[bad", "127.0.0.1:7781", "127.0.0.1", False),
    ],
)
def test_origin_rule(origin: str | None, host: str, bind: str, allowed: bool) -> None:
    assert origin_allowed(origin, host, bind) is allowed


LISTED = frozenset({"https://agent.example.com", "http://10.0.0.5:3000"})


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("https://agent.example.com", True),
        ("https://AGENT.example.com:443", True),  # as the setting is normalised
        ("http://agent.example.com", False),  # another scheme is another origin
        ("https://agent.example.com:8443", False),
        ("http://10.0.0.5:3000", True),
        ("http://10.0.0.5", False),
        ("https://evil.example", False),
        ("http://localhost:5173", True),  # the built-in rules still apply
        ("null", False),
    ],
)
def test_listed_origins_pass_beside_the_rule(origin: str, allowed: bool) -> None:
    assert origin_allowed(origin, "127.0.0.1:7781", "127.0.0.1", LISTED) is allowed


# -- /mcp through the app ----------------------------------------------------------------------


class Served:
    """The app in process over a control database with issued keys."""

    def __init__(self, server: InProcessServer, keys: dict[str, str]) -> None:
        self.server = server
        self.keys = keys

    def post(self, **kw: Any) -> httpx.Response:
        """POST /mcp."""
        return self.server.request("POST", "/mcp", **kw)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data_dir = tmp_path_factory.mktemp("mcp") / "data"
    keys = issue_keys(data_dir)
    server = InProcessServer(data_dir, hasher=CHEAP_HASHER).start()
    yield Served(server, keys)
    server.stop()


def test_streamable_http_refuses_no_key_another_origin_and_a_huge_body(served: Served) -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    for auth in (
        {},
        {"Authorization": "Bearer smk_live_nope_nope"},
        {"Authorization": "Basic dTpw"},
    ):
        r = served.post(json=init, headers={**headers, **auth})
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert r.json() == {"error": "unauthorized", "detail": "invalid or expired api key"}
    bearer = {"Authorization": f"Bearer {served.keys['rw']}"}
    r = served.post(json=init, headers={**headers, **bearer, "Origin": "https://evil.example"})
    assert r.status_code == 403
    assert r.json() == {
        "error": "forbidden",
        "detail": "cross-origin requests to /mcp are not allowed",
    }
    huge = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "pad": "' + b"x" * (1 << 20) + b'"}'
    big = {**headers, **bearer, "Content-Type": "application/json"}
    r = served.post(content=huge, headers=big)
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
    local = {**headers, **bearer, "Origin": "http://localhost:6274"}
    ok = served.post(json=init, headers=local)
    assert ok.status_code == 200, ok.text  # a local browser tool (the MCP inspector) may connect


def test_an_origin_listed_in_the_settings_may_connect(start_server: Any) -> None:
    server = start_server(env={"MEMSPINE_MCP_ALLOWED_ORIGINS": "https://agent.example.com"})
    init = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "Authorization": "Bearer acme"}
    listed = {**headers, "Origin": "https://agent.example.com"}
    ok = server.request("POST", "/mcp", json=init, headers=listed)
    assert ok.status_code == 200, ok.text
    assert {t["name"] for t in ok.json()["result"]["tools"]} == ALL_TOOLS
    evil = {**headers, "Origin": "https://evil.example"}
    assert server.request("POST", "/mcp", json=init, headers=evil).status_code == 403


def test_append_takes_subjects_and_no_tool_erases_a_subject(inproc: InProcess) -> None:
    async def main() -> None:
        async with inproc.client(inproc.keys["rw"]) as c:
            args = {"kind": "turn", "text": "Ann wants a refund", "subjects": ["cust-5"]}
            made = (await call(c, "memory_append", args))["event_id"]
            got = await call(c, "memory_get", {"id": made})
            assert got["subjects"] == ["cust-5"]
            bad = await refused(c, "memory_append", {**args, "subjects": ["x" * 129]})
            assert bad["error"] == "invalid_request" and "subjects[0]" in bad["detail"]
            names = {t.name for t in (await c.list_tools()).tools}
            assert not any("subject" in n or "erase" in n for n in names)

    anyio.run(main)

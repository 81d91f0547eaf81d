"""POST /v1/memory/cypher through the app in local mode: the seed's four queries over its
three tenants (loaded through the API) return exactly the seed's rows, and the refusals, errors,
limits and tenant isolation answer as docs/cypher.md says."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cypher_world import WHO, load_ops
from tests.support.seed import MONDAY_9, PROJECT, SUPPORT, SUPPORT_TS, load
from tests.support.servers import InProcessServer

READ_ONLY = (
    "only read queries are accepted (MATCH, WITH, RETURN); write through POST /v1/memory/event"
)
WHO_PARAMS = {"supplier": "SUP-2207", "effect": "write", "kind": "turn"}
SOURCES = (
    "MATCH (a:Event)-[:SOURCE_FROM]->(s:Event) WHERE a.change = $change "
    "RETURN s.kind, s.text ORDER BY s.ts"
)
DERIVED = (
    "MATCH (d:Event)-[:SOURCE_FROM]->(s:Event) WHERE s.event_id = $id "
    "RETURN d.event_id, d.kind, d.text"
)
NEWEST = (
    "MATCH (f:Event) WHERE f.kind = $kind AND f.topic = $topic "
    "RETURN f.text ORDER BY f.ts DESC LIMIT 1"
)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    """One server with the default limits; each test loads its own tenants."""
    server = InProcessServer(tmp_path_factory.mktemp("cypher") / "data").start()
    yield server
    server.stop()


def tenant(srv: InProcessServer, name: str) -> httpx.Client:
    """A client for a tenant of its own (local mode: the token is the tenant id)."""
    return srv.client(f"{name}-{uuid.uuid4().hex[:8]}")


def cypher(client: httpx.Client, query: str, params: dict[str, Any] | None = None) -> Any:
    """A query that must succeed; its answer has exactly the keys columns and rows."""
    body: dict[str, Any] = {"query": query} | ({"params": params} if params is not None else {})
    resp = client.post("/v1/memory/cypher", json=body)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert sorted(answer) == ["columns", "rows"]
    return answer


def refused(client: httpx.Client, query: str, params: dict[str, Any] | None = None) -> str:
    """A query that must fail with 400 invalid_request; its detail."""
    resp = client.post("/v1/memory/cypher", json={"query": query, "params": params or {}})
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert sorted(body) == ["detail", "error"] and body["error"] == "invalid_request"
    return str(body["detail"])


@pytest.fixture(scope="module")
def ops(srv: InProcessServer) -> tuple[httpx.Client, dict[str, str]]:
    """The operations tenant, loaded once for the tests that only read it."""
    client = tenant(srv, "purchasing")
    return client, load_ops(client)


# ---- the seed's four queries ------------------------------------------------------------------


def test_seed_which_actions_on_whose_instruction(ops: tuple[httpx.Client, dict[str, str]]) -> None:
    client, _ = ops
    assert cypher(client, WHO, WHO_PARAMS) == {
        "columns": ["a.change", "a.tool", "i.actor", "i.role"],
        "rows": [
            ["CHG-9031", "set_payment_terms", "priya.n", "ap_manager"],
            ["CHG-9038", "release_po", "daniel.o", "buyer"],
        ],
    }


def test_seed_what_a_write_had_in_front_of_it(ops: tuple[httpx.Client, dict[str, str]]) -> None:
    client, _ = ops
    assert cypher(client, SOURCES, {"change": "CHG-9038"}) == {
        "columns": ["s.kind", "s.text"],
        "rows": [
            ["turn", "Daniel: release PO-7741 for Northfield, the quality hold was cleared this morning"],
            ["tool_call", "get_po(PO-7741) -> SUP-2207, 18,400.00 EUR, on hold: incoming inspection"],
            ["tool_call", "get_inspection(PO-7741) -> lot 44 passed 2026-10-06 08:55"],
        ],
    }  # fmt: skip


def test_seed_derived_from_the_door_code_before_the_erasure(srv: InProcessServer) -> None:
    client = tenant(srv, "customer-4417")
    ids = load(client, SUPPORT, SUPPORT_TS, {"conversation": "c-1005-01"})
    assert cypher(client, DERIVED, {"id": ids["door_turn"]}) == {
        "columns": ["d.event_id", "d.kind", "d.text"],
        "rows": [
            [ids["door_fact"], "fact", "Delivery instruction: door code 4471, leave parcels in the hall"]
        ],
    }  # fmt: skip
    # the reply was derived from nothing; three events were derived into it
    assert cypher(client, DERIVED, {"id": ids["reply"]})["rows"] == []
    back = "MATCH (r {event_id: $id})-[:SOURCE_FROM]->(s) RETURN s.event_id"
    assert cypher(client, back, {"id": ids["reply"]})["rows"] == [
        [ids["message"]],
        [ids["get_order"]],
        [ids["track"]],
    ]


def test_seed_newest_fact_on_a_topic(srv: InProcessServer) -> None:
    client = tenant(srv, "billing-ledger")
    load(client, PROJECT, MONDAY_9, {})
    assert cypher(client, NEWEST, {"kind": "fact", "topic": "cutover_date"}) == {
        "columns": ["f.text"],
        "rows": [
            ["Billing cutover moved to Saturday 2026-10-17: finance closes September on 12 October"]
        ],
    }


# ---- refusals and errors ----------------------------------------------------------------------


def test_seed_set_is_refused_and_changes_nothing(ops: tuple[httpx.Client, dict[str, str]]) -> None:
    client, _ = ops
    query = "MATCH (a:Event) WHERE a.change = $change SET a.text = $text RETURN a"
    params = {"change": "CHG-9038", "text": "release_po(PO-7741) -> not released"}
    assert refused(client, query, params) == READ_ONLY
    for write in ("CREATE (n:Event {kind: 'x'}) RETURN n", "MATCH (n) DETACH DELETE n"):
        assert refused(client, write) == READ_ONLY
    text = "MATCH (a {change: $change}) RETURN a.text"
    assert cypher(client, text, {"change": "CHG-9038"})["rows"] == [
        ["release_po(PO-7741) -> released, change CHG-9038"]
    ]
    assert cypher(client, "MATCH (n) RETURN count(*)")["rows"] == [[12]]


def test_syntax_error_names_line_and_column(ops: tuple[httpx.Client, dict[str, str]]) -> None:
    client, _ = ops
    detail = refused(client, "MATCH (a:Event)\nWHERE a.kind = 'turn'\nRETURN a.kind a.ts")
    assert detail.startswith("unexpected 'a'; expected ")
    assert "(line 3, column 15)" in detail
    assert refused(client, "MATCH (a:Event) WHERE a.kind = 'turn'") == (
        "expected RETURN (line 1, column 38)\nMATCH (a:Event) WHERE a.kind = 'turn'\n"
        + " " * 37
        + "^"
    )


def test_missing_parameter_and_other_faults_get_their_own_sentence(
    ops: tuple[httpx.Client, dict[str, str]],
) -> None:
    client, _ = ops
    assert refused(client, SOURCES) == "missing parameter $change; pass it in params"
    assert refused(client, WHO, {"supplier": "SUP-2207"}) == (
        "missing parameters $effect, $kind; pass them in params"
    )
    assert refused(client, "RETURN 'a' - 1") == "cannot apply - to a string and an integer"
    assert refused(client, "RETURN foo(1)").startswith("unknown function foo(); the functions are")
    assert refused(client, "MATCH (n:Fact) RETURN n").startswith("unknown label :Fact")


# ---- limits, through the settings -------------------------------------------------------------


@pytest.mark.timing
def test_row_and_time_limits_from_the_environment(start_server: Any, tmp_path: Path) -> None:
    # The row limit on a server whose time limit a loaded machine cannot reach (with 50 ms, the
    # 144-row query was refused for its time at load 20), the time limit on one of its own.
    rows = start_server(
        env={"MEMSPINE_CYPHER_MAX_ROWS": "100", "MEMSPINE_CYPHER_TIMEOUT_MS": "120000"},
        data_dir=tmp_path / "rows",
    )
    client = tenant(rows, "limits")
    load_ops(client)
    pairs = "MATCH (a), (b) RETURN a.ts, b.ts"  # 144 rows
    assert refused(client, pairs) == "query produced more than 100 rows; add LIMIT"
    assert len(cypher(client, pairs + " LIMIT 100")["rows"]) == 100

    server = start_server(env={"MEMSPINE_CYPHER_TIMEOUT_MS": "50"}, data_dir=tmp_path / "time")
    client = tenant(server, "limits")
    load_ops(client)
    started = time.monotonic()
    runaway = "MATCH (a), (b), (c), (d), (e), (f) RETURN count(*)"  # 12^6 rows to count
    assert refused(client, runaway) == (
        "query exceeded the 50 ms time limit; narrow it with an indexed predicate"
    )
    assert time.monotonic() - started < 5
    # the worker is free again: the next query answers at once
    assert cypher(client, "MATCH (n {kind: 'fact'}) RETURN n.topic")["rows"] == [["payment_terms"]]
    assert server.request("GET", "/health").status_code == 200


# ---- isolation --------------------------------------------------------------------------------


def test_another_tenant_sees_no_rows(
    srv: InProcessServer, ops: tuple[httpx.Client, dict[str, str]]
) -> None:
    _, ids = ops
    other = tenant(srv, "other-company")
    assert cypher(other, WHO, WHO_PARAMS) == {
        "columns": ["a.change", "a.tool", "i.actor", "i.role"],
        "rows": [],
    }
    assert cypher(other, "MATCH (n) RETURN count(*)")["rows"] == [[0]]
    by_id = "MATCH (n) WHERE n.event_id IN $ids RETURN n"
    assert cypher(other, by_id, {"ids": list(ids.values())})["rows"] == []
    walk = "MATCH (n {event_id: $id})-[*0..3]-(m) RETURN m.event_id"
    assert cypher(other, walk, {"id": ids["W1"]})["rows"] == []
    # an unknown or invalid token reaches no tenant at all
    for token in (None, "../" + "x", "a" * 65):
        resp = srv.client(token).post("/v1/memory/cypher", json={"query": "RETURN 1"})
        assert resp.status_code == 401, resp.text


def test_long_clause_chains_are_400_never_500(ops: tuple[httpx.Client, dict[str, str]]) -> None:
    client, _ = ops
    too_many = "the query has more than 100 clauses; split it into simpler queries"
    for query in (
        "MATCH (e:Event) " + "WITH e " * 600 + "RETURN e.kind",
        "MATCH (e:Event) " + "OPTIONAL MATCH (e) " * 1000 + "RETURN e.kind",
        "MATCH (e:Event) " + "WITH e " * 100 + "RETURN count(e)",
    ):
        assert refused(client, query) == too_many
    # Up to the bound, a chain still runs.
    assert cypher(client, "MATCH (e:Event) " + "WITH e " * 98 + "RETURN count(e) > 0")["rows"] == [
        [True]
    ]

"""The Cypher engine end to end on a real EventLog in tmp_path: the seed's queries and rows,
the write refusal, null semantics, aggregation, paths, OPTIONAL MATCH, limits and index use."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from storage.cypher import READ_ONLY_MESSAGE, GraphReader, plan, run
from storage.cypher.diagnostics import WRITE_KEYWORDS
from storage.errors import CypherSyntaxError, InvalidRequest
from storage.log import layout
from storage.log.eventlog import EventLog
from storage.model import NewEvent
from tests.support.cypher_table import table
from tests.support.cypher_world import DAY, OPS, WHO, Tenant, at, open_tenant

_CONV = {"conversation": "c-1005-01"}

# The seed's support tenant: ten events, the last two carrying a door code.
SUPPORT: list[tuple[str, str, str, str, dict[str, Any], tuple[str, ...]]] = [
    ("ask", "turn", "14:01:10",
     "Customer: order 88213 shows delivered on 1 October but nothing arrived",
     {"speaker": "customer", **_CONV}, ()),
    ("order", "tool_call", "14:01:40", "get_order(88213) -> 1 item, shipped 2026-09-29",
     {"tool": "get_order"}, ()),
    ("track", "tool_call", "14:02:05", "track_parcel(88213) -> delivered, signed at number 16",
     {"tool": "track_parcel"}, ()),
    ("reply", "turn", "14:02:19", "Agent: the carrier shows it signed for at number 16",
     {"speaker": "agent", **_CONV}, ("ask", "order", "track")),
    ("objection", "turn", "14:02:50",
     "Customer: there is no number 16 on my street. I want a refund",
     {"speaker": "customer", **_CONV}, ()),
    ("case", "tool_call", "14:03:02", "open_case(88213) -> C-5117", {"tool": "open_case"}, ()),
    ("case_fact", "fact", "14:03:06", "Order 88213 disputed: case C-5117 open",
     {"topic": "case"}, ("track", "objection", "case")),
    ("thanks", "turn", "14:03:30", "Agent: a colleague will contact you about case C-5117",
     {"speaker": "agent", **_CONV}, ()),
    ("door", "turn", "14:04:30", "Customer: for the next delivery the door code is 4471",
     {"speaker": "customer", **_CONV}, ()),
    ("door_fact", "fact", "14:04:42",
     "Delivery instruction: door code 4471, leave parcels in the hall",
     {"topic": "delivery"}, ("door",)),
]  # fmt: skip


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenant]:
    """The operations tenant (OPS), shared by the tests that only read it."""
    tenant = open_tenant(tmp_path_factory.mktemp("cypher") / "ops", OPS)
    yield tenant
    tenant.log.close()


@pytest.fixture
def own_ops(tmp_path: Path) -> Iterator[Tenant]:
    """A fresh operations tenant for a test that changes it."""
    tenant = open_tenant(tmp_path / "ops", OPS)
    yield tenant
    tenant.log.close()


@pytest.fixture
def support(tmp_path: Path) -> Iterator[Tenant]:
    """The support tenant (SUPPORT)."""
    tenant = open_tenant(tmp_path / "support", SUPPORT)
    yield tenant
    tenant.log.close()


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Tenant]:
    """The seed's project tenant, cut to the cutover facts, a preference and their turns;
    Tuesday's date fact supersedes Monday's."""
    t = Tenant(EventLog.open(tmp_path / "project", embedding_dim=4))
    t.add("plan", "turn", at("09:05:00", -1), "Lena: billing moves to the new ledger on the 10th")
    t.add(
        "date1", "fact", at("09:06:00", -1),
        "Billing cutover to the new ledger is planned for Saturday 2026-10-10",
        {"topic": "cutover_date"}, ("plan",),
    )  # fmt: skip
    t.add(
        "pref", "fact", at("09:11:00", -1), "Lena wants status notes as three bullets, no tables",
        {"topic": "status_notes"}, ("plan",),
    )  # fmt: skip
    t.add("moved", "turn", at("10:12:00"), "Lena: finance closes September on 12 October, move it")
    t.add(
        "date2", "fact", 1_791_297_160_000_000,
        "Billing cutover moved to Saturday 2026-10-17: finance closes September on 12 October",
        {"topic": "cutover_date", "supersedes": "date1"}, ("moved", "date1"), ("date1",),
    )  # fmt: skip
    # a turn on the same topic, which the kind predicate must leave out
    t.add(
        "mention", "turn", at("16:00:00"), "Lena: remind me of the date", {"topic": "cutover_date"}
    )
    yield t
    t.log.close()


# ---- the seed's four queries, exactly its rows ----------------------------------------------


def test_seed_which_actions_on_whose_instruction(ops: Tenant) -> None:
    result = ops.query(WHO, {"supplier": "SUP-2207", "effect": "write", "kind": "turn"})
    assert result.columns == ["a.change", "a.tool", "i.actor", "i.role"]
    assert result.rows == [
        ["CHG-9031", "set_payment_terms", "priya.n", "ap_manager"],
        ["CHG-9038", "release_po", "daniel.o", "buyer"],
    ]


def test_seed_what_a_write_had_in_front_of_it(ops: Tenant) -> None:
    query = (
        "MATCH (a:Event)-[:SOURCE_FROM]->(s:Event) WHERE a.change = $change "
        "RETURN s.kind, s.text ORDER BY s.ts"
    )
    assert ops.rows(query, {"change": "CHG-9038"}) == [
        [
            "turn",
            "Daniel: release PO-7741 for Northfield, the quality hold was cleared this morning",
        ],
        ["tool_call", "get_po(PO-7741) -> SUP-2207, 18,400.00 EUR, on hold: incoming inspection"],
        ["tool_call", "get_inspection(PO-7741) -> lot 44 passed 2026-10-06 08:55"],
    ]


def test_seed_what_was_derived_from_the_door_code(support: Tenant) -> None:
    query = (
        "MATCH (d:Event)-[:SOURCE_FROM]->(s:Event) WHERE s.event_id = $id "
        "RETURN d.event_id, d.kind, d.text"
    )
    assert support.rows(query, {"id": support.ids["door"]}) == [
        [
            support.ids["door_fact"],
            "fact",
            "Delivery instruction: door code 4471, leave parcels in the hall",
        ]
    ]


def test_seed_newest_fact_on_a_topic(project: Tenant) -> None:
    query = (
        "MATCH (f:Event) WHERE f.kind = $kind AND f.topic = $topic "
        "RETURN f.text ORDER BY f.ts DESC LIMIT 1"
    )
    assert project.rows(query, {"kind": "fact", "topic": "cutover_date"}) == [
        ["Billing cutover moved to Saturday 2026-10-17: finance closes September on 12 October"]
    ]


def test_seed_set_is_refused_with_the_exact_message(ops: Tenant) -> None:
    query = "MATCH (a:Event) WHERE a.change = $change SET a.text = $text RETURN a"
    params = {"change": "CHG-9038", "text": "release_po(PO-7741) -> not released"}
    with pytest.raises(InvalidRequest) as err:
        ops.query(query, params)
    assert err.value.detail == READ_ONLY_MESSAGE
    assert (err.value.status, err.value.code) == (400, "invalid_request")
    assert ops.rows("MATCH (a {change: 'CHG-9038'}) RETURN a.text") == [
        ["release_po(PO-7741) -> released, change CHG-9038"]
    ]


# ---- the table of cases -----------------------------------------------------------------------


@pytest.mark.parametrize(("query", "kind", "expected"), table("rows", "fails"))
def test_casetable(ops: Tenant, query: str, kind: str, expected: str) -> None:
    if kind == "rows":
        assert ops.rows(query) == json.loads(expected)
    else:
        with pytest.raises(InvalidRequest) as err:
            ops.query(query)
        assert expected in err.value.detail


# ---- refusals and errors ----------------------------------------------------------------------

WRITES = {
    "CREATE": "CREATE (n:Event {kind: 'x'}) RETURN n",
    "MERGE": "MERGE (n:Event {kind: 'x'}) RETURN n",
    "SET": "MATCH (n) SET n.kind = 'x' RETURN n",
    "DELETE": "MATCH (n) DELETE n",
    "DETACH": "MATCH (n) DETACH DELETE n",
    "REMOVE": "MATCH (n) REMOVE n.kind RETURN n",
    "CALL": "CALL db.labels()",
    "LOAD": "LOAD CSV FROM 'file:///x.csv' AS line RETURN line",
    "FOREACH": "MATCH (n) FOREACH (x IN [1] | SET n.kind = 'x') RETURN n",
}


@pytest.mark.parametrize("keyword", WRITE_KEYWORDS)
def test_every_write_keyword_is_refused(ops: Tenant, keyword: str) -> None:
    for query in (WRITES[keyword], WRITES[keyword].lower()):
        with pytest.raises(InvalidRequest) as err:
            ops.query(query)
        assert err.value.detail == READ_ONLY_MESSAGE
    assert ops.rows("MATCH (n) RETURN count(*)") == [[12]]


def test_write_words_inside_strings_and_property_names_are_reads(ops: Tenant) -> None:
    query = "MATCH (a) WHERE a.text CONTAINS 'set_' RETURN a.set, a.change ORDER BY a.ts"
    assert ops.rows(query) == [[None, "CHG-9031"], [None, "CHG-9044"]]


def test_syntax_error_names_line_and_column(ops: Tenant) -> None:
    with pytest.raises(CypherSyntaxError) as err:
        ops.query("MATCH (a:Event)\nWHERE a.kind = 'turn'\nRETURN a.kind a.ts")
    assert (err.value.line, err.value.col) == (3, 15)
    assert "line 3, column 15" in err.value.detail
    assert err.value.status == 400


def test_missing_parameters_are_named(ops: Tenant) -> None:
    with pytest.raises(InvalidRequest) as err:
        ops.query(WHO, {"supplier": "SUP-2207"})
    assert err.value.detail == "missing parameters $effect, $kind; pass them in params"


def test_parameters_of_every_json_type(ops: Tenant) -> None:
    query = "UNWIND $xs AS x RETURN x, $m.k AS k, $n IS NULL AS n"
    params = {"xs": [1, "a", True, None, [2]], "m": {"k": 1.5}, "n": None}
    assert ops.rows(query, params) == [
        [1, 1.5, True],
        ["a", 1.5, True],
        [True, 1.5, True],
        [None, 1.5, True],
        [[2], 1.5, True],
    ]


# ---- nodes, nulls, aggregation, paths, OPTIONAL MATCH -------------------------------------------


def test_whole_node_is_the_event_object(ops: Tenant) -> None:
    [[node]] = ops.rows("MATCH (w {change: 'CHG-9044'}) RETURN w")
    assert node == {
        "event_id": ops.ids["W3"],
        "kind": "tool_call",
        "ts": at("15:03:57"),
        "text": "set_supplier_status(SUP-3310, on hold) -> ok, change CHG-9044",
        "properties": {
            "tool": "set_supplier_status",
            "supplier": "SUP-3310",
            "effect": "write",
            "change": "CHG-9044",
        },
    }
    msgspec.json.encode(ops.query("MATCH (n) RETURN n, collect(n) AS all"))


def test_null_semantics_in_where(ops: Tenant) -> None:
    # duration_ms is absent on W3 and on every turn and fact: there the comparison is null,
    # so neither it nor its negation keeps the row
    assert ops.rows("MATCH (n) WHERE n.duration_ms > 0 RETURN count(*)") == [[7]]
    assert ops.rows("MATCH (n) WHERE NOT (n.duration_ms > 0) RETURN count(*)") == [[0]]
    assert ops.rows("MATCH (n) WHERE n.duration_ms IS NULL RETURN count(*)") == [[5]]
    assert ops.rows("MATCH (n) WHERE n.duration_ms > 0 OR true RETURN count(*)") == [[12]]
    assert ops.rows("MATCH (n) WHERE n.urgent = true RETURN n.actor") == [["priya.n"]]
    assert ops.rows("MATCH (n) WHERE n.urgent <> true RETURN count(*)") == [[0]]


def test_nulls_sort_last_ascending_and_first_descending(ops: Tenant) -> None:
    asc = ops.rows("MATCH (n:Event {effect: 'write'}) RETURN n.duration_ms ORDER BY n.duration_ms")
    desc = ops.rows("MATCH (n:Event {effect: 'write'}) RETURN n.duration_ms AS d ORDER BY d DESC")
    assert asc == [[380], [410], [None]]
    assert desc == [[None], [410], [380]]


def test_aggregation_groups_by_the_other_items(ops: Tenant) -> None:
    query = (
        "MATCH (n:Event {kind: 'tool_call'}) "
        "RETURN n.supplier AS supplier, n.effect AS effect, count(*) AS calls, "
        "sum(n.duration_ms) AS ms, avg(n.duration_ms) AS mean, min(n.tool) AS first_tool "
        "ORDER BY supplier, effect"
    )
    assert ops.rows(query) == [
        ["SUP-2207", "read", 4, 765, 191.25, "get_contract"],
        ["SUP-2207", "write", 2, 790, 395.0, "release_po"],
        ["SUP-3310", "read", 1, 150, 150.0, "get_supplier"],
        ["SUP-3310", "write", 1, 0, None, "set_supplier_status"],
    ]


def test_aggregates_over_no_rows(ops: Tenant) -> None:
    query = (
        "MATCH (n {kind: 'nothing'}) RETURN count(*), count(n), collect(n), sum(n.ts), max(n.ts)"
    )
    assert ops.rows(query) == [[0, 0, [], 0, None]]
    assert ops.rows("MATCH (n {kind: 'nothing'}) RETURN n.kind, count(*)") == []


def test_count_distinct_and_collect(ops: Tenant) -> None:
    query = (
        "MATCH (n:Event) WHERE n.actor IS NOT NULL "
        "RETURN count(n.actor) AS all, count(DISTINCT n.actor) AS people, "
        "collect(DISTINCT n.role) AS roles"
    )
    assert ops.rows(query) == [[3, 2, ["ap_manager", "buyer"]]]


def test_with_pipes_groups_into_a_second_match(ops: Tenant) -> None:
    query = (
        "MATCH (w {effect: 'write'})-[:SOURCE_FROM]->(s) "
        "WITH w, count(s) AS inputs WHERE inputs > 2 "
        "MATCH (w)<-[:SOURCE_FROM]-(f:Event {kind: 'fact'}) "
        "RETURN w.change, inputs, f.topic"
    )
    assert ops.rows(query) == [["CHG-9031", 3, "payment_terms"]]


def test_variable_length_outgoing_and_incoming(ops: Tenant) -> None:
    out = (
        "MATCH (f {kind: 'fact'})-[:SOURCE_FROM*1..2]->(s) "
        "RETURN s.text STARTS WITH 'get_contract' AS contract, s.kind, count(*) AS paths "
        "ORDER BY contract, s.kind"
    )
    # F1 -> L2, F1 -> W1, then W1 -> I1, L1, L2: L2 is reached by two paths
    assert ops.rows(out) == [
        [False, "tool_call", 2],
        [False, "turn", 1],
        [True, "tool_call", 2],
    ]
    incoming = (
        "MATCH (i {actor: 'priya.n', supplier: 'SUP-2207'})<-[r:SOURCE_FROM*1..3]-(d) "
        "RETURN d.kind, size(r) AS hops ORDER BY hops"
    )
    assert ops.rows(incoming) == [["tool_call", 1], ["fact", 2]]


def test_undirected_and_exact_lengths(ops: Tenant) -> None:
    both = "MATCH (l {tool: 'get_contract'})-[:SOURCE_FROM]-(x) RETURN x.kind ORDER BY x.ts"
    assert ops.rows(both) == [["tool_call"], ["fact"]]
    two = "MATCH (f {kind: 'fact'})-[*2]->(x) RETURN x.tool ORDER BY x.ts"
    assert ops.rows(two) == [[None], ["get_supplier"], ["get_contract"]]
    zero = "MATCH (f {kind: 'fact'})-[*0..1]->(x) RETURN count(x)"
    assert ops.rows(zero) == [[3]]


def test_a_link_is_used_once_per_pattern(ops: Tenant) -> None:
    query = "MATCH (a {change: 'CHG-9044'})-[:SOURCE_FROM]-(b)-[:SOURCE_FROM]-(c) RETURN count(*)"
    assert ops.rows(query) == [[0]]  # W3's neighbours link to nothing but W3 itself


def test_supersedes_links(project: Tenant) -> None:
    query = (
        "MATCH (new)-[:SUPERSEDES]->(old) RETURN new.text STARTS WITH 'Billing cutover moved', "
        "old.event_id"
    )
    assert project.rows(query) == [[True, project.ids["date1"]]]
    current = (
        "MATCH (f {kind: 'fact', topic: $topic}) OPTIONAL MATCH (f)<-[:SUPERSEDES]-(n) "
        "WITH f, n WHERE n IS NULL RETURN f.text"
    )
    assert project.rows(current, {"topic": "cutover_date"}) == [
        ["Billing cutover moved to Saturday 2026-10-17: finance closes September on 12 October"]
    ]


def test_optional_match_gives_nulls(ops: Tenant) -> None:
    query = (
        "MATCH (i:Event {kind: 'turn'}) OPTIONAL MATCH (i)<-[:SOURCE_FROM]-(f {kind: 'fact'}) "
        "RETURN i.actor, i.supplier, f.topic ORDER BY i.ts"
    )
    assert ops.rows(query) == [
        ["priya.n", "SUP-2207", None],
        ["daniel.o", "SUP-2207", None],
        ["priya.n", "SUP-3310", None],
    ]
    query = (
        "MATCH (l {effect: 'read'}) OPTIONAL MATCH (l)<-[:SOURCE_FROM]-(f {kind: 'fact'}) "
        "RETURN l.tool, f.topic ORDER BY l.ts"
    )
    assert ops.rows(query) == [
        ["get_supplier", None],
        ["get_contract", "payment_terms"],
        ["get_po", None],
        ["get_inspection", None],
        ["get_supplier", None],
    ]


def test_comma_patterns_join_on_shared_variables(ops: Tenant) -> None:
    query = (
        "MATCH (w {change: 'CHG-9031'})-[:SOURCE_FROM]->(i {kind: 'turn'}), "
        "(other {actor: i.actor}) WHERE other <> i RETURN other.supplier"
    )
    assert ops.rows(query) == [["SUP-3310"]]


def test_deleted_events_are_gone_from_queries(own_ops: Tenant) -> None:
    own_ops.log.delete([own_ops.ids["I2"]])
    params = {"supplier": "SUP-2207", "effect": "write", "kind": "turn"}
    assert own_ops.rows(WHO, params) == [["CHG-9031", "set_payment_terms", "priya.n", "ap_manager"]]
    assert own_ops.rows("MATCH (n) RETURN count(*)") == [[11]]
    assert own_ops.rows("MATCH (w {change: 'CHG-9038'})-->(s) RETURN count(s)") == [[2]]


WRITES_OF = "MATCH (w {supplier: $s, effect: 'write'}) RETURN w.change ORDER BY w.ts"


def test_intersected_properties_leave_out_deleted_events(own_ops: Tenant) -> None:
    assert own_ops.rows(WRITES_OF, {"s": "SUP-2207"}) == [["CHG-9031"], ["CHG-9038"]]
    own_ops.log.delete([own_ops.ids["W1"]])
    assert own_ops.rows(WRITES_OF, {"s": "SUP-2207"}) == [["CHG-9038"]]
    own_ops.log.delete([own_ops.ids["W2"]])  # one side of the intersection is now empty
    assert own_ops.rows(WRITES_OF, {"s": "SUP-2207"}) == []
    assert own_ops.rows(WRITES_OF, {"s": "SUP-3310"}) == [["CHG-9044"]]


def test_intersected_properties_find_superseded_and_superseding_events(project: Tenant) -> None:
    # a superseded event is still a node; supersession is a link, not a filter
    query = (
        "MATCH (new {topic: 'cutover_date', supersedes: 'date1'})-[:SUPERSEDES]->(old) "
        "RETURN new.event_id, old.event_id"
    )
    assert project.rows(query) == [[project.ids["date2"], project.ids["date1"]]]


def test_property_lists_intersect_across_chunks_either_way_round(tmp_path: Path) -> None:
    # lists longer than the reader's CHUNK on both sides, and one side of them empty
    from storage.log import reader as log_reader

    log = EventLog.open(tmp_path / "log", embedding_dim=4)
    try:
        events = [
            NewEvent(
                kind="note",
                ts=DAY + i,
                properties_raw=msgspec.json.encode({"a": i % 5 != 0, "b": i % 3, "c": "x"}),
            )
            for i in range(3 * log_reader.CHUNK + 7)
        ]
        ids = [r.event_id for r in log.append_batch(events) if not isinstance(r, Exception)]
        with log.reader() as r:
            for pairs in (
                [("a", True), ("b", 1)],
                [("b", 1), ("a", True)],
                [("c", "x"), ("b", 2), ("a", False)],
                [("a", True), ("c", "y")],
                [("c", "y"), ("a", True)],
            ):
                want = sorted(
                    layout.id_bytes(ids[i])
                    for i in range(len(events))
                    if all(
                        {"a": i % 5 != 0, "b": i % 3, "c": "x"}[name] == value
                        and type({"a": i % 5 != 0, "b": i % 3, "c": "x"}[name]) is type(value)
                        for name, value in pairs
                    )
                )
                assert r.raw_ids_by_properties(pairs) == want, pairs
    finally:
        log.close()


def test_intersected_properties_after_a_purge(tmp_path: Path) -> None:
    from storage.cypher import Limits
    from storage.tenants.tenant import Tenant as StoreTenant

    tenant = StoreTenant.open("t1", tmp_path / "t1", embedding_dim=4)
    try:
        events = [
            NewEvent(
                kind="tool_call",
                ts=DAY + i,
                text=f"call {i}",
                properties_raw=msgspec.json.encode(
                    {"supplier": f"SUP-{i % 3}", "effect": "write" if i % 2 else "read", "n": i}
                ),
            )
            for i in range(30)
        ]
        results = tenant.submit_append(events).result(10)
        ids = [r.event_id for r in results if not isinstance(r, Exception)]
        query = "MATCH (w {supplier: 'SUP-1', effect: 'write'}) RETURN w.n ORDER BY w.n"

        def rows() -> list[Any]:
            return tenant.cypher(query, None, Limits(timeout_ms=5000, max_rows=100)).rows

        assert rows() == [[1], [7], [13], [19], [25]]
        tenant.submit_delete([ids[7], ids[8], ids[19]]).result(10)
        assert rows() == [[1], [13], [25]]
        assert tenant.purge().purged == 3
        assert rows() == [[1], [13], [25]]
    finally:
        tenant.close()


# ---- bounds -------------------------------------------------------------------------------------


def test_row_limit(ops: Tenant) -> None:
    with pytest.raises(InvalidRequest) as err:
        ops.query("MATCH (a), (b) RETURN a.ts, b.ts", max_rows=100)
    assert err.value.detail == "query produced more than 100 rows; add LIMIT"
    assert len(ops.query("MATCH (a), (b) RETURN a.ts, b.ts", max_rows=144).rows) == 144
    assert len(ops.query("MATCH (a), (b) RETURN a.ts LIMIT 100", max_rows=100).rows) == 100


@pytest.mark.timing
def test_time_limit(ops: Tenant) -> None:
    query = "MATCH (a), (b), (c), (d), (e), (f) RETURN count(*)"
    started = time.monotonic()
    with pytest.raises(InvalidRequest) as err:
        ops.query(query, timeout_ms=50)
    assert err.value.detail == (
        "query exceeded the 50 ms time limit; narrow it with an indexed predicate"
    )
    assert time.monotonic() - started < 2


def test_long_but_allowed_expressions_run(ops: Tenant) -> None:
    durations = [*range(411, 600), 120]  # only 120 is one of the tenant's
    alternatives = " OR ".join(f"n.duration_ms = {ms}" for ms in durations)
    assert ops.rows(f"MATCH (n) WHERE {alternatives} RETURN n.tool") == [["get_supplier"]]


# ---- index use: a counting proxy around the real reader ------------------------------------------


class CountingReader:
    """Forwards every call to a real LogReader and counts them by method name (not a mock:
    every answer comes from LMDB)."""

    def __init__(self, inner: GraphReader) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.scanned = 0

    def raw_record(self, raw_id: bytes) -> bytes | None:
        self.calls["get"] += 1
        return self.inner.raw_record(raw_id)

    def decode_record(self, raw: bytes) -> Any:
        self.calls["decode"] += 1
        return self.inner.decode_record(raw)

    def record_kind(self, raw: bytes) -> str:
        return self.inner.record_kind(raw)

    def _ids(self, name: str, ids: Iterable[bytes]) -> Iterator[bytes]:
        self.calls[name] += 1
        for raw_id in ids:
            self.scanned += 1
            yield raw_id

    def raw_ids_by_kind(
        self, kind: str, lo: int | None = None, hi: int | None = None
    ) -> Iterator[bytes]:
        return self._ids("ids_by_kind", self.inner.raw_ids_by_kind(kind, lo, hi))

    def raw_ids_by_property(self, name: str, value: Any) -> Iterator[bytes]:
        return self._ids("ids_by_property", self.inner.raw_ids_by_property(name, value))

    def raw_ids_by_properties(self, pairs: list[tuple[str, Any]]) -> list[bytes]:
        return list(self._ids("ids_by_properties", self.inner.raw_ids_by_properties(pairs)))

    def raw_ids_by_ts(self, lo: int | None, hi: int | None) -> Iterator[bytes]:
        name = "all_ids" if lo is None and hi is None else "ids_by_ts"
        return self._ids(name, self.inner.raw_ids_by_ts(lo, hi))

    def raw_links_out(self, raw_id: bytes, rel: str) -> list[bytes]:
        self.calls["links_out"] += 1
        return self.inner.raw_links_out(raw_id, rel)

    def raw_links_out_of_kind(self, raw_id: bytes, rel: str, kind: str) -> list[bytes]:
        self.calls["links_out"] += 1
        return self.inner.raw_links_out_of_kind(raw_id, rel, kind)

    def raw_links_in(self, raw_id: bytes, rel: str) -> list[bytes]:
        self.calls["links_in"] += 1
        return self.inner.raw_links_in(raw_id, rel)

    def count(self) -> int:
        return self.inner.count()


def counted(tenant: Tenant, query: str, params: dict[str, Any] | None = None) -> CountingReader:
    """Run query through a CountingReader and return it."""
    with tenant.log.reader() as reader:
        counting = CountingReader(reader)
        run(counting, query, params)
    return counting


def test_seed_query_uses_the_property_index_not_a_scan(ops: Tenant) -> None:
    params = {"supplier": "SUP-2207", "effect": "write", "kind": "turn"}
    reader = counted(ops, WHO, params)
    assert reader.calls["all_ids"] == reader.calls["ids_by_property"] == 0
    assert reader.calls["ids_by_properties"] == 1
    # the two SUP-2207 writes (of its nine events, of twelve), found before any event is read
    assert reader.scanned == 2
    assert "SeekByProperties(a.supplier = $supplier, a.effect = $effect)" in plan(WHO).describe()


def test_event_id_is_a_get_and_expansion_starts_there(support: Tenant) -> None:
    query = "MATCH (d)-[:SOURCE_FROM]->(s) WHERE s.event_id = $id RETURN d.kind"
    reader = counted(support, query, {"id": support.ids["door"]})
    assert reader.scanned == 0
    assert reader.calls["links_in"] == 1 and reader.calls["links_out"] == 0


KIND_OF_TARGET = (
    "MATCH (a)-[:SOURCE_FROM]->(i) WHERE a.kind = 'tool_call' AND i.kind = $k RETURN i.actor"
)
# the same, the kind read from each target's record (the planner cannot see it is a kind test)
KIND_OF_TARGET_READ = KIND_OF_TARGET.replace("i.kind =", "i.kind + '' =")


def test_a_target_failing_its_kind_test_is_never_read(ops: Tenant) -> None:
    sources = counted(ops, KIND_OF_TARGET, {"k": "turn"})
    none = counted(ops, KIND_OF_TARGET, {"k": "no such kind"})
    tool_calls = len(ops.rows("MATCH (a) WHERE a.kind = 'tool_call' RETURN a.event_id"))
    # the link lists hold their targets' kinds: only the tool calls and the three turns are read
    assert none.calls["get"] == tool_calls
    assert sources.calls["get"] == tool_calls + 3
    assert none.calls["decode"] == 0  # a.kind read without decoding a record
    assert ops.rows(KIND_OF_TARGET, {"k": "turn"}) == [["priya.n"], ["daniel.o"], ["priya.n"]]
    for kind in ("turn", "tool_call", "fact", "no such kind"):
        want = ops.rows(KIND_OF_TARGET_READ, {"k": kind})
        assert ops.rows(KIND_OF_TARGET, {"k": kind}) == want


def test_target_kinds_in_links_stay_true_after_a_delete(own_ops: Tenant) -> None:
    # deleting L1 rewrites W1's link list (I1, L2 left): the kinds must move with their targets
    own_ops.log.delete([own_ops.ids["L1"]])
    for kind in ("turn", "tool_call"):
        want = own_ops.rows(KIND_OF_TARGET_READ, {"k": kind})
        assert own_ops.rows(KIND_OF_TARGET, {"k": kind}) == want
    assert own_ops.rows(KIND_OF_TARGET, {"k": "turn"}) == [["priya.n"], ["daniel.o"], ["priya.n"]]
    query = "MATCH (w)-[:SOURCE_FROM]->(l) WHERE w.change = 'CHG-9031' AND l.kind = 'tool_call' "
    assert own_ops.rows(query + "RETURN l.tool") == [["get_contract"]]


def test_kind_and_ts_ranges_use_their_indexes(ops: Tenant) -> None:
    kind = counted(ops, "MATCH (n:Event) WHERE n.kind = 'turn' RETURN n.actor")
    assert kind.calls == Counter({"ids_by_kind": 1, "get": 3, "decode": 3})
    query = "MATCH (n) WHERE n.ts >= $lo AND n.ts < $hi RETURN n.text"
    window = counted(ops, query, {"lo": at("11:00:00"), "hi": at("12:00:00")})
    assert window.calls["ids_by_ts"] == 1 and window.scanned == 4
    assert ops.rows(query, {"lo": at("11:40:27"), "hi": at("11:40:30")}) == [
        ["get_inspection(PO-7741) -> lot 44 passed 2026-10-06 08:55"]
    ]


def test_a_query_without_index_scans(ops: Tenant) -> None:
    reader = counted(ops, "MATCH (n) WHERE n.text CONTAINS 'PO-7741' RETURN count(*)")
    assert reader.calls["all_ids"] == 1 and reader.scanned == 12

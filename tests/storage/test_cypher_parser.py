"""The Cypher front half without data: grammar, parser, AST, planner, and the expression
evaluator with its null logic, checked in isolation."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.cypher import READ_ONLY_MESSAGE, plan
from storage.cypher import ast as A
from storage.cypher.diagnostics import WRITE_KEYWORDS
from storage.cypher.expressions import compile_expr
from storage.cypher.functions import AGGREGATES, FUNCTIONS
from storage.cypher.operators import ProjectStep, render
from storage.cypher.parser import MAX_HOPS, parse
from storage.cypher.planner import plan as plan_ast
from storage.cypher.values import compare, equals, group_key, order_key
from storage.errors import CypherSyntaxError, InvalidRequest
from tests.support.cypher_table import table

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "cypher.md"


# ---- the table: refusals, syntax errors, planning errors, index choice ------------------------


@pytest.mark.parametrize(("query", "kind", "expected"), table("refused"))
def test_refused(query: str, kind: str, expected: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        plan_ast(parse(query))
    assert err.value.detail == READ_ONLY_MESSAGE
    assert not isinstance(err.value, CypherSyntaxError)


@pytest.mark.parametrize(("query", "kind", "expected"), table("syntax"))
def test_syntax(query: str, kind: str, expected: str) -> None:
    position, _, message = expected.partition(" ")
    line, col = (int(n) for n in position.split(":"))
    with pytest.raises(CypherSyntaxError) as err:
        plan_ast(parse(query))
    assert (err.value.line, err.value.col) == (line, col)
    assert message in err.value.detail
    assert f"(line {line}, column {col})" in err.value.detail
    assert err.value.detail.endswith("^")  # the offending line, then a caret under the column


@pytest.mark.parametrize(("query", "kind", "expected"), table("invalid"))
def test_invalid(query: str, kind: str, expected: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        plan_ast(parse(query))
    assert expected in err.value.detail
    assert not isinstance(err.value, CypherSyntaxError)


@pytest.mark.parametrize(("query", "kind", "expected"), table("plan"))
def test_plan(query: str, kind: str, expected: str) -> None:
    assert expected in plan(query).describe()


@pytest.mark.parametrize(("query", "kind", "expected"), table("rows", "fails", "plan"))
def test_expressions_round_trip_through_render(query: str, kind: str, expected: str) -> None:
    """render() (used by describe) writes Cypher that parses back to the same tree."""
    try:
        tree = parse(query)
    except InvalidRequest:
        return
    for clause in tree.clauses:
        projection = getattr(clause, "projection", None)
        for item in projection.items if projection else ():
            again = parse(f"RETURN {render(item.expr)} AS x").clauses[0]
            assert isinstance(again, A.Return)
            assert again.projection.items[0].expr == item.expr


# ---- the parser's output ----------------------------------------------------------------------

WHO = """MATCH (a:Event)-[:SOURCE_FROM]->(i:Event)
WHERE a.supplier = $supplier AND a.effect = $effect AND i.kind = $kind
RETURN a.change, a.tool, i.actor, i.role
ORDER BY a.ts"""


def _eq(var: str, key: str, param: str) -> A.Binary:
    return A.Binary("=", A.Property(A.Variable(var), key), A.Parameter(param))


def test_seed_query_tree() -> None:
    prop = lambda v, k: A.Property(A.Variable(v), k)  # noqa: E731
    assert parse(WHO) == A.Query(
        (
            A.Match(
                patterns=(
                    A.PatternPath(
                        nodes=(A.NodePattern("a", ("Event",)), A.NodePattern("i", ("Event",))),
                        rels=(A.RelPattern("out", types=("SOURCE_FROM",)),),
                    ),
                ),
                where=A.Binary(
                    "AND",
                    A.Binary("AND", _eq("a", "supplier", "supplier"), _eq("a", "effect", "effect")),
                    _eq("i", "kind", "kind"),
                ),
            ),
            A.Return(
                A.Projection(
                    items=tuple(
                        A.ProjectionItem(prop(v, k), f"{v}.{k}")
                        for v, k in (("a", "change"), ("a", "tool"), ("i", "actor"), ("i", "role"))
                    ),
                    order_by=(A.SortItem(prop("a", "ts")),),
                )
            ),
        )
    )


def test_tree_nodes_are_frozen_and_hashable() -> None:
    tree = parse(WHO)
    with pytest.raises(AttributeError):
        tree.clauses = ()  # type: ignore[misc]
    assert hash(tree) == hash(parse(WHO))


def _plain(value: Any) -> None:
    """Fail on anything but Structs, tuples and exact builtin scalars (lark's Token is a str)."""
    if isinstance(value, msgspec.Struct):
        for field in value.__struct_fields__:
            _plain(getattr(value, field))
    elif isinstance(value, tuple):
        for item in value:
            _plain(item)
    else:
        assert type(value) in (str, int, float, bool, type(None)), repr(value)


def test_plans_hold_no_parser_objects() -> None:
    query = (
        "MATCH (a {kind: 'x'})-[r:SOURCE_FROM*1..2]-(b) WHERE a.ts > $t "
        "WITH a, count(b) AS n ORDER BY n DESC UNWIND [1, 2.5, 'x', null, true] AS v "
        "RETURN DISTINCT a.text AS t, v, {k: n}['k'], [n][0..1] SKIP 1 LIMIT $l"
    )
    _plain(parse(query))
    _plain(plan(query))


def test_column_names_are_aliases_or_the_text_as_written() -> None:
    query = "UNWIND [1] AS x RETURN x, x.k, count(*), count(DISTINCT x) AS n, 1+2, toLower('A')"
    assert plan(query).columns == ("x", "x.k", "count(*)", "n", "1+2", "toLower('A')")
    assert plan("WITH 1 AS b, 2 AS a RETURN *").columns == ("a", "b")


def test_keywords_are_case_insensitive_and_reserved_only_where_they_can_appear() -> None:
    lower = parse("match (n) where n.kind = 'x' return distinct n.order as limit order by limit")
    assert lower.clauses[1] == A.Return(
        A.Projection(
            items=(A.ProjectionItem(A.Property(A.Variable("n"), "order"), "limit", aliased=True),),
            distinct=True,
            order_by=(A.SortItem(A.Variable("limit")),),
        )
    )
    assert plan("MATCH (returns) RETURN returns.x").columns == ("returns.x",)
    assert plan("RETURN 1 AS `a column`").columns == ("a column",)


def test_parameters_and_plan_cache() -> None:
    assert plan(WHO).parameters == ("effect", "kind", "supplier")
    assert plan(WHO) is plan(WHO)


def test_seed_plan_starts_from_the_supplier_and_effect_lists_intersected() -> None:
    assert plan(WHO).describe() == "\n".join(
        [
            "Match",
            "  SeekByProperties(a.supplier = $supplier, a.effect = $effect)",
            "  Filter(a.supplier = $supplier)",
            "  Filter(a.effect = $effect)",
            "  Expand((a)-[_r1:SOURCE_FROM]->(i))",
            "  Filter(i.kind = $kind)",
            "Return a.change, a.tool, i.actor, i.role ORDER BY a.ts",
        ]
    )


def test_expansion_starts_from_the_most_selective_node() -> None:
    query = (
        "MATCH (t {kind: 'turn'})<-[:SOURCE_FROM]-(w)<-[:SOURCE_FROM]-(f {event_id: $id}) RETURN t"
    )
    starts = plan(query).starts()
    assert [type(s).__name__ for s in starts] == ["SeekById"]
    described = plan(query).describe()
    assert described.index("Expand((f)-[") < described.index("Expand((w)-[")


def test_aggregates_get_slots_and_grouping_keys() -> None:
    step = plan("MATCH (n) RETURN n.kind AS k, count(*) + 1 AS c, collect(n.ts) AS ts").steps[-1]
    assert isinstance(step, ProjectStep)
    assert step.grouping == ("k",)
    assert [render(call) for _, call in step.aggregates] == ["count(*)", "collect(n.ts)"]


def test_write_keywords_refused_in_any_position_or_case() -> None:
    for word in WRITE_KEYWORDS:
        for query in (f"{word} (n)", f"MATCH (n) {word.lower()} n RETURN n"):
            with pytest.raises(InvalidRequest) as err:
                parse(query)
            assert err.value.detail == READ_ONLY_MESSAGE


# ---- the evaluator in isolation --------------------------------------------------------------


def evaluate(text: str, row: dict[str, Any] | None = None, **params: Any) -> Any:
    """The value of one expression, parsed from `RETURN text`, on row."""
    clause = parse(f"RETURN {text}").clauses[0]
    assert isinstance(clause, A.Return)
    return compile_expr(clause.projection.items[0].expr, params)(row or {})


TRUTH = [True, False, None]


def _kleene_and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _kleene_or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


@pytest.mark.parametrize("a", TRUTH)
@pytest.mark.parametrize("b", TRUTH)
def test_three_valued_logic(a: bool | None, b: bool | None) -> None:
    row = {"a": a, "b": b}
    assert evaluate("a AND b", row) is _kleene_and(a, b)
    assert evaluate("a OR b", row) is _kleene_or(a, b)
    assert evaluate("a XOR b", row) is (None if a is None or b is None else a != b)
    assert evaluate("NOT a", row) is (None if a is None else not a)
    assert evaluate("a = b", row) is (None if a is None or b is None else a == b)


def test_short_circuit_skips_the_error_on_the_right() -> None:
    assert evaluate("false AND 1 / 0 = 1") is False
    assert evaluate("true OR 1 / 0 = 1") is True


def test_property_access() -> None:
    from storage.cypher.graph import Node
    from storage.log import layout
    from storage.log.reader import LogReader
    from storage.model import StoredEvent

    event = StoredEvent(
        event_id="e1", seq=1, kind="fact", ts=5, text=None, filterable={"topic": "t", "n": 1}
    )
    row = {"f": Node(b"\x01" * 16, layout.encode_event(event), LogReader)}
    assert evaluate("[f.event_id, f.kind, f.ts, f.text, f.topic, f.n, f.other]", row) == [
        "e1", "fact", 5, None, "t", 1, None
    ]  # fmt: skip
    assert evaluate("f['topic']", row) == "t"
    assert evaluate("f = f", row) is True


def test_parameters_are_values() -> None:
    assert evaluate("$xs[1] + $m.k", xs=[1, 2], m={"k": 40}) == 42


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=False),
    st.text(max_size=3),
)


@given(scalars, scalars)
def test_equality_is_symmetric_and_grouping_agrees_with_it(a: Any, b: Any) -> None:
    assert equals(a, b) is equals(b, a)
    if equals(a, b) is True:
        assert group_key(a) == group_key(b)
    if group_key(a) == group_key(b) and a is not None and not _nan(a):
        assert equals(a, b) is True


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


@given(scalars, scalars)
def test_sort_order_agrees_with_comparison(a: Any, b: Any) -> None:
    c = compare(a, b)
    if c in (-1, 0, 1):
        assert (order_key(a) > order_key(b)) - (order_key(a) < order_key(b)) == c
    if b is None and a is not None:
        assert order_key(a) < order_key(b)  # null sorts after everything ascending


@given(st.lists(scalars, max_size=6))
def test_order_key_is_a_total_order(values: list[Any]) -> None:
    ordered = sorted(values, key=order_key)
    keys = [order_key(v) for v in ordered]
    assert keys == sorted(keys)


# ---- the docs say what the engine does --------------------------------------------------------


def test_docs_name_every_function_write_keyword_and_limit() -> None:
    text = DOCS.read_text()
    for name in [f.name for f in FUNCTIONS.values()] + list(AGGREGATES):
        assert f"`{name}(" in text, name
    for word in WRITE_KEYWORDS:
        assert word in text, word
    assert READ_ONLY_MESSAGE in text
    assert f"*1..{MAX_HOPS}" in text
    for op in ("SeekById", "SeekByKind", "SeekByProperty", "SeekByTs", "ScanAll"):
        assert op in text, op


def test_deep_nesting_is_a_sentence_not_a_crash() -> None:
    with pytest.raises(InvalidRequest) as err:
        parse("RETURN " + " + ".join(["1"] * 3000))
    assert "nests expressions more than 200 deep" in err.value.detail
    assert parse("RETURN " + "(" * 1000 + "1" + ")" * 1000)  # parentheses add no depth

"""Fuzzing the Cypher front door: random strings, token soups and mutated valid queries (tokens
and characters inserted, deleted, swapped) go through the parser and through `run` on a real
log. Each must either answer rows that JSON can carry or fail with InvalidRequest (400
invalid_request); a syntax error names a line and column inside the query. Nothing else may
escape: no lark, Python or LMDB exception, no stack trace or file path in a detail."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.cypher import plan, run
from storage.cypher.parser import parse
from storage.errors import CypherSyntaxError, InvalidRequest
from tests.support.budget import size
from tests.support.cypher_world import OPS, WHO, Tenant, open_tenant

CASES = Path(__file__).resolve().parents[1] / "support" / "cypher_cases.txt"
TIMEOUT_MS = 250
MAX_ROWS = 500

SEED_QUERIES = [
    WHO,
    "MATCH (a:Event)-[:SOURCE_FROM]->(s:Event) WHERE a.change = $change "
    "RETURN s.kind, s.text ORDER BY s.ts",
    "MATCH (d:Event)-[:SOURCE_FROM]->(s:Event) WHERE s.event_id = $id "
    "RETURN d.event_id, d.kind, d.text",
    "MATCH (f:Event) WHERE f.kind = $kind AND f.topic = $topic "
    "RETURN f.text ORDER BY f.ts DESC LIMIT 1",
    "MATCH (a:Event) WHERE a.change = $change SET a.text = $text RETURN a",
    "MATCH (s {event_id: $id})<-[r:SOURCE_FROM*1..3]-(d) RETURN d.event_id, size(r) AS hops "
    "ORDER BY hops",
    "MATCH (f:Event {kind: 'fact'}) OPTIONAL MATCH (f)<-[:SUPERSEDES]-(n) WITH f, n "
    "WHERE n IS NULL RETURN f.text",
    "MATCH (w:Event {effect: 'write'})-[:SOURCE_FROM]->(i:Event {kind: 'turn'})\n"
    "RETURN w.supplier AS supplier, collect(DISTINCT i.actor) AS asked_by, count(*) AS writes\n"
    "ORDER BY writes DESC",
    "MATCH (n) WHERE n.ts >= $since AND n.ts < $until RETURN n.kind, count(*)",
    "UNWIND $xs AS x WITH x WHERE x IS NOT NULL RETURN x, [x, 'a'][1..] SKIP 1 LIMIT 2",
]


def corpus() -> list[str]:
    """Every query of the case table (valid or not) and the seed's and the docs' queries."""
    queries = list(SEED_QUERIES)
    for line in CASES.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            queries.append(line.rpartition(" => ")[0].strip())
    return [q for q in queries if q]


CORPUS = corpus()

# strings, $params, names and numbers, two-character operators, then any single character
TOKEN = re.compile(
    r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\$?\w+|<-|->|<=|>=|<>|\.\.|\s+|.""", re.S
)
VOCAB = [
    "MATCH", "OPTIONAL", "WHERE", "WITH", "UNWIND", "RETURN", "DISTINCT", "ORDER", "BY", "ASC",
    "DESC", "SKIP", "LIMIT", "AS", "AND", "OR", "XOR", "NOT", "IN", "STARTS", "ENDS", "CONTAINS",
    "IS", "NULL", "TRUE", "FALSE", "COUNT", "COLLECT", "SIZE", "CREATE", "SET", "DELETE", "MERGE",
    "CALL", "LOAD", "CSV", "FOREACH", "DETACH", "REMOVE",
    "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", "*", "+", "-", "/", "%", "^", "=", "<>",
    "<", ">", "<=", ">=", "->", "<-", "--", "..", "$", "$x", "$id", "n", "a.ts", "r",
    "'a'", '"b"', "'", '"', "`", "0", "1", "-1", "1.5", "1e309", "9223372036854775808",
    "*1..5", "*0..9", "*..", "//", "/*", "*/", "\\", "\\u12", "\0", "é", "\u2028", "\n", " ",
]  # fmt: skip


def params_for(queries: list[str]) -> dict[str, Any]:
    """A value for every $name the corpus uses, cycling through the JSON types."""
    values: list[Any] = ["SUP-2207", 1, None, [1, "a", None], {"k": 1}, True, 2.5, "turn"]
    names = sorted({name for q in queries for name in re.findall(r"\$(\w+)", q)} | {"x", "id"})
    return {name: values[i % len(values)] for i, name in enumerate(names)}


PARAMS = params_for(CORPUS)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A corpus query with one to four token or character edits."""
    tokens = TOKEN.findall(draw(st.sampled_from(CORPUS)))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        edit = draw(st.sampled_from(["drop", "repeat", "swap", "insert", "char", "cut"]))
        i = draw(st.integers(min_value=0, max_value=max(len(tokens) - 1, 0)))
        j = draw(st.integers(min_value=0, max_value=max(len(tokens) - 1, 0)))
        if not tokens or edit == "insert":
            tokens.insert(i, draw(st.sampled_from(VOCAB)))
        elif edit == "drop":
            del tokens[i]
        elif edit == "repeat":
            tokens.insert(i, tokens[i])
        elif edit == "swap":
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif edit == "cut":
            tokens = tokens[:i]
        else:  # replace, insert or delete one character inside a token
            text = tokens[i]
            k = draw(st.integers(min_value=0, max_value=len(text)))
            char = draw(st.characters(codec="utf-8") | st.sampled_from("'\"`\\$.()[]{}*-<>"))
            how = draw(st.sampled_from(["replace", "insert", "delete"]))
            keep = k + (how != "insert")
            tokens[i] = text[:k] + ("" if how == "delete" else char) + text[keep:]
    return "".join(tokens)


token_soup = st.lists(st.sampled_from(VOCAB), max_size=25).map(" ".join)
random_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=120)


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenant]:
    """The operations tenant of test_cypher_engine.py, so mutated queries find data."""
    tenant = open_tenant(tmp_path_factory.mktemp("fuzz") / "ops", OPS)
    yield tenant
    tenant.log.close()


def _clean(detail: str, query: str) -> None:
    """A detail is a sentence: no trace, no path, no Python internals (unless the query had
    those very characters, which a syntax error quotes)."""
    assert isinstance(detail, str) and detail.strip()
    for marker in ("Traceback", 'File "', ".py", "/work/", "lark.", "Error(", "0x"):
        assert marker not in detail or marker in query, detail


def check(tenant: Tenant, query: str) -> None:
    """The one property: rows JSON can carry, or InvalidRequest with a good detail."""
    try:
        parse(query)
        plan(query)
    except CypherSyntaxError as err:
        check_position(err, query)
    except InvalidRequest as err:
        _clean(err.detail, query)
    try:
        with tenant.log.reader() as reader:
            result = run(reader, query, PARAMS, timeout_ms=TIMEOUT_MS, max_rows=MAX_ROWS)
    except CypherSyntaxError as err:
        check_position(err, query)
    except InvalidRequest as err:
        assert (err.status, err.code) == (400, "invalid_request")
        _clean(err.detail, query)
    else:
        assert all(isinstance(c, str) for c in result.columns)
        assert len(result.rows) <= MAX_ROWS
        assert all(len(row) == len(result.columns) for row in result.rows)
        msgspec.json.encode(result)  # what the route sends


def check_position(err: CypherSyntaxError, query: str) -> None:
    """Line and column point into the query (the column may sit one past a line's end)."""
    assert (err.status, err.code) == (400, "invalid_request")
    lines = query.split("\n")
    assert 1 <= err.line <= len(lines), (err.line, query)
    assert 1 <= err.col <= len(lines[err.line - 1]) + 1, (err.col, query)
    assert f"(line {err.line}, column {err.col})" in err.detail
    _clean(err.detail, query)


FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.long
@settings(FUZZ, max_examples=size(600, 150))
@given(query=mutated())
def test_mutated_queries(ops: Tenant, query: str) -> None:
    check(ops, query)


@pytest.mark.long
@settings(FUZZ, max_examples=size(250, 60))
@given(query=token_soup)
def test_token_soup(ops: Tenant, query: str) -> None:
    check(ops, query)


@pytest.mark.long
@settings(FUZZ, max_examples=size(150, 40))
@given(query=random_text)
def test_random_strings(ops: Tenant, query: str) -> None:
    check(ops, query)


@pytest.mark.long
@settings(FUZZ, max_examples=size(150, 40))
@given(query=random_text)
def test_random_strings_after_a_valid_prefix(ops: Tenant, query: str) -> None:
    check(ops, "MATCH (n) WHERE " + query)
    check(ops, "RETURN " + query)


ADVERSARIAL = {
    "deep parentheses": "RETURN " + "(" * 5000 + "1" + ")" * 5000,
    "unclosed parentheses": "RETURN " + "(" * 5000,
    "deep lists": "RETURN " + "[" * 3000 + "]" * 3000,
    "deep maps": "RETURN " + "{a: " * 2000 + "1" + "}" * 2000,
    "long sum": "RETURN " + " + ".join(["1"] * 5000),
    "many NOTs": "RETURN " + "NOT " * 3000 + "true",
    "many minus signs": "RETURN " + "-" * 5000 + "1",
    "long chain": "RETURN " + " < ".join(["1"] * 3000),
    "many patterns": "MATCH " + ", ".join(f"(n{i})" for i in range(300)) + " RETURN count(*)",
    "long path": "MATCH (a)" + "-->()" * 500 + " RETURN a",
    "long property chain": "RETURN $x" + ".a" * 5000,
    "many items": "RETURN " + ", ".join(f"{i} AS c{i}" for i in range(3000)),
    "NUL bytes": "MATCH (n) WHERE n.kind = '\0' RETURN n\0",
    "lone surrogate escape": "RETURN '\\uD800'",
    "huge hop count": "MATCH (a)-[*1..99999999999999999999]->(b) RETURN a",
    "huge integer": "RETURN 99999999999999999999999999999 * 99999999999999999999",
    "huge float": "RETURN 1e999 - 1e999, -1e999",
    "huge skip": "MATCH (n) RETURN n SKIP 99999999999999999999 LIMIT 1",
    "only a comment": "// MATCH (n) RETURN n",
    "unclosed comment": "MATCH (n) /* RETURN n",
    "empty": "",
    "whitespace": " \t\n\r ",
    "carriage returns": "MATCH (n)\rWHERE n.x = 1\r\nRETURN n.x +",
    "line separator": "MATCH (n)\u2028WHERE\u2028RETURN",
    "cartesian product": "MATCH (a), (b), (c), (d), (e), (f), (g) RETURN count(*)",
    "unwind a product": "UNWIND $xs AS a UNWIND $xs AS b MATCH (n), (m) RETURN a, b, n, m",
    "write after return": "MATCH (n) RETURN n DELETE n",
    "write in a string and a real one": "MATCH (n {kind: 'CREATE'}) CREATE (m) RETURN m",
}


@pytest.mark.parametrize("query", list(ADVERSARIAL.values()), ids=list(ADVERSARIAL))
def test_adversarial_inputs(ops: Tenant, query: str) -> None:
    check(ops, query)

"""ORDER BY keys taken as the values themselves while they are integers or strings of one type
per position (storage/cypher/projection.py, _sort), and turned into order_key's tuples at the
first row that breaks that: the rows must come out in openCypher's order either way, ties in
input order, over more rows than one sorted run (SORT_RUN) so held runs are converted too."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storage.cypher import run
from storage.cypher.bounds import NUMBER_BYTES, row_bytes
from storage.cypher.projection import SORT_RUN
from storage.log.eventlog import EventLog
from storage.model import NewEvent

# openCypher's ascending order of types, as a plain rank (not the engine's keys)
RANK = {list: 3, str: 5, bool: 6, int: 7, float: 7, type(None): 9}


def expected_key(value: Any) -> Any:
    """Where value sorts, written out independently of storage/cypher."""
    if isinstance(value, list):
        return (RANK[list], [expected_key(v) for v in value])
    return (RANK[type(value)],) if value is None else (RANK[type(value)], value)


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EventLog]:
    opened = EventLog.open(tmp_path_factory.mktemp("sortkeys") / "log", embedding_dim=4)
    yield opened
    opened.close()


def rows(log: EventLog, query: str, params: dict[str, Any]) -> list[list[Any]]:
    with log.reader() as reader:
        return run(reader, query, params, timeout_ms=60_000).rows


def halves(values: list[Any]) -> dict[str, Any]:
    """Params holding values and their positions, each in two lists (a parameter list holds at
    most 2000 elements)."""
    middle, positions = len(values) // 2, list(range(len(values)))
    return {
        "a": values[:middle],
        "b": values[middle:],
        "i": positions[:middle],
        "j": positions[middle:],
    }


# each value with its position; ORDER BY a column (v) or an expression over the row (l[i])
BY_COLUMN = "WITH $a + $b AS l UNWIND $i + $j AS i RETURN l[i] AS v, i ORDER BY v"
BY_ROW = "WITH $a + $b AS l UNWIND $i + $j AS i RETURN l[i] AS v, i ORDER BY l[i]"


def sorted_rows(values: list[Any], descending: bool = False) -> list[list[Any]]:
    """[value, position] rows in the order the query must give (stable, DESC flips the key)."""
    # reverse=True keeps ties in input order, as ORDER BY ... DESC does
    order = sorted(range(len(values)), key=lambda i: expected_key(values[i]), reverse=descending)
    return [[values[i], i] for i in order]


ODD_ONES: list[Any] = [None, "x", 2.5, True, [1, 2], -7, "", float(3), False, [0]]


@pytest.mark.parametrize("at", [0, SORT_RUN + 5, 2 * SORT_RUN + 3])
@pytest.mark.parametrize("odd", ODD_ONES)
def test_a_key_of_another_type_at_any_row_keeps_the_order(log: EventLog, at: int, odd: Any) -> None:
    rng = random.Random(at)
    values: list[Any] = [rng.randrange(60) for _ in range(2 * SORT_RUN + 8)]
    values.insert(at, odd)
    assert rows(log, BY_COLUMN, halves(values)) == sorted_rows(values)
    assert rows(log, BY_ROW + " DESC", halves(values)) == sorted_rows(values, descending=True)


def test_strings_then_integers_sort_strings_first(log: EventLog) -> None:
    values: list[Any] = [f"s{n % 37:02d}" for n in range(SORT_RUN + 10)] + list(range(50, 0, -1))
    got = rows(log, BY_ROW, halves(values))
    assert got == sorted_rows(values)
    assert isinstance(got[0][0], str) and got[-1][0] == 50


def test_two_keys_each_of_its_own_type_and_a_limit(log: EventLog) -> None:
    rng = random.Random(3)
    words = [rng.choice(["ant", "bee", "cat"]) for _ in range(3000)]
    numbers = [rng.randrange(10) for _ in range(3000)]
    query = (
        "WITH $w AS ws, $n AS ns UNWIND $i AS i WITH i, ws[i] AS w, ns[i] AS n "
        "RETURN w, n, i ORDER BY w DESC, n LIMIT 700"
    )
    positions = list(range(2000))
    got = rows(log, query, {"w": words[:2000], "n": numbers[:2000], "i": positions})
    want = sorted(range(2000), key=lambda i: numbers[i])
    want.sort(key=lambda i: words[i], reverse=True)
    assert got == [[words[i], numbers[i], i] for i in want[:700]]
    # a null in the second key, after the first run, turns every held key into a tagged one
    numbers_with_null: list[Any] = numbers[:2000]
    numbers_with_null[1500] = None
    got = rows(log, query, {"w": words[:2000], "n": numbers_with_null, "i": positions})
    want = sorted(range(2000), key=lambda i: expected_key(numbers_with_null[i]))
    want.sort(key=lambda i: words[i], reverse=True)
    assert got == [[words[i], numbers_with_null[i], i] for i in want[:700]]


def test_booleans_are_not_integers_in_a_key(log: EventLog) -> None:
    values: list[Any] = [1, True, 0, False, 2]
    want = [[False, 3], [True, 1], [0, 2], [1, 0], [2, 4]]
    assert rows(log, BY_COLUMN, halves(values)) == rows(log, BY_ROW, halves(values)) == want


def test_integer_keys_of_nodes_and_node_keys(tmp_path: Path) -> None:
    nodes_log = EventLog.open(tmp_path / "nodes", embedding_dim=4)
    try:
        for n in range(5):
            nodes_log.append_batch([NewEvent(kind="turn", ts=100 - n, text=f"t{n}")])
        with nodes_log.reader() as reader:
            by_ts = run(reader, "MATCH (n) RETURN n.text ORDER BY n.ts", {}).rows
            by_node = run(reader, "MATCH (n) RETURN n.text ORDER BY n DESC", {}).rows
    finally:
        nodes_log.close()
    assert by_ts == by_node == [["t4"], ["t3"], ["t2"], ["t1"], ["t0"]]


def test_row_bytes_is_what_getsizeof_says() -> None:
    for row in ({}, {"a": "x"}, {"a": "é" * 9, "b": "猫", "c": "😀" * 3, "d": 1, "e": None}):
        strings = sum(sys.getsizeof(v) for v in row.values() if type(v) is str)
        others = NUMBER_BYTES * sum(type(v) is not str for v in row.values())
        assert row_bytes(row) == sys.getsizeof(row) + strings + others

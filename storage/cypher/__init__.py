"""Read-only Cypher over one tenant's events: parse -> plan -> execute.

`run(reader, query, params)` is the entry point the HTTP route and the MCP tool call.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import msgspec

from storage.cypher.bounds import MAX_QUERY_CHARS, MAX_VALUE_DEPTH, UNMETERED, Limits, Meter
from storage.cypher.diagnostics import READ_ONLY_MESSAGE
from storage.cypher.executor import Context, execute
from storage.cypher.graph import GraphReader
from storage.cypher.operators import Plan
from storage.cypher.params import check_params
from storage.cypher.parser import parse
from storage.cypher.planner import plan as plan_ast
from storage.errors import InvalidRequest

TOO_COMPLEX = "the query is too complex to run (too deeply chained); split it into simpler parts"

__all__ = [
    "MAX_QUERY_CHARS",
    "MAX_VALUE_DEPTH",
    "READ_ONLY_MESSAGE",
    "CypherResult",
    "GraphReader",
    "Limits",
    "PlanCache",
    "plan",
    "run",
    "warm",
]


class CypherResult(msgspec.Struct):
    """The answer to a query: column names and rows of JSON-ready values (with
    run(encoded=True), each row a msgspec.Raw of its JSON, which encodes and decodes alike)."""

    columns: list[str]
    rows: list[Any]


class PlanCache:
    """Plans by query text (plans depend on the text only, never on params or data); a query
    not seen yet is parsed and planned under the caller's meter, so parsing is timed too.
    Bounded in entries and in characters of query text: a plan holds about 50 bytes per
    character of its query, and every tenant's queries share the cache."""

    def __init__(self, size: int, chars: int) -> None:
        self.size = size
        self.chars = chars
        self._plans: OrderedDict[str, Plan] = OrderedDict()
        self._held = 0  # characters of the cached queries
        self._lock = threading.Lock()

    def get(self, query: str, meter: Meter) -> Plan:
        """The plan for query text, from the cache or made now."""
        with self._lock:
            found = self._plans.get(query)
            if found is not None:
                self._plans.move_to_end(query)
                return found
        planned = plan_ast(parse(query, meter))
        with self._lock:
            if query not in self._plans:
                self._plans[query] = planned
                self._held += len(query)
            while len(self._plans) > self.size or self._held > self.chars:
                self._held -= len(self._plans.popitem(last=False)[0])
        return planned

    def __call__(self, query: str) -> Plan:
        """The plan for query text, with no time limit."""
        return self.get(query, UNMETERED)

    def cache_clear(self) -> None:
        """Forget every plan."""
        with self._lock:
            self._plans.clear()
            self._held = 0


plan = PlanCache(256, 500_000)


def warm() -> None:
    """Build the parser now (lark takes 0.2-0.8 s, once per process), not in a first query."""
    plan("RETURN 1")


def run(
    reader: GraphReader,
    query: str,
    params: dict[str, Any] | None,
    *,
    timeout_ms: int = 5000,
    max_rows: int = 10000,
    max_bytes: int = Limits().max_bytes,
    max_string: int = Limits().max_string,
    max_list: int = Limits().max_list,
    max_result_bytes: int = Limits().max_result_bytes,
    encoded: bool = False,
    started: float | None = None,
) -> CypherResult:
    """Run a read-only query against reader; InvalidRequest (400) for any fault of the query,
    and for any bound it passes (time from the start of parsing, bytes, string and list sizes,
    64-bit integers, the size of the answer). The clock runs from `started` (time.monotonic()
    when the caller took the request, so a wait for a thread counts; now by default)."""
    limits = Limits(
        timeout_ms=timeout_ms,
        max_rows=max_rows,
        max_bytes=max_bytes,
        max_string=max_string,
        max_list=max_list,
        max_result_bytes=max_result_bytes,
    )
    meter = Meter(limits, started=started)
    try:
        planned = plan.get(query, meter)  # the clock started before parsing: parsing is timed
    except RecursionError:  # a shape no bound of the parser foresaw: still the query's fault
        raise InvalidRequest(TOO_COMPLEX) from None
    given = params or {}
    missing = [f"${name}" for name in planned.parameters if name not in given]
    if missing:
        noun, it = ("parameter", "it") if len(missing) == 1 else ("parameters", "them")
        raise InvalidRequest(f"missing {noun} {', '.join(missing)}; pass {it} in params")
    failure: InvalidRequest | None = None
    try:
        check_params(given, meter)
        rows = execute(planned, Context(reader, given, meter), encoded=encoded)
        return CypherResult(columns=list(planned.columns), rows=rows)
    except InvalidRequest as err:
        # The traceback holds the pipeline's frames and they the values the query built; the
        # exception then sits in a cycle with its caller's future until a collection. Without
        # it, a refused query's memory goes now, before give_back.
        failure = err.with_traceback(None)
    except RecursionError:
        failure = InvalidRequest(TOO_COMPLEX)
    finally:
        meter.give_back()
    raise failure

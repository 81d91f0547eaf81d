"""Read-only Cypher over one tenant's events: parse -> plan -> execute.

`run(reader, query, params)` is the entry point the HTTP route and the MCP tool call.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import msgspec

from storage.cypher.diagnostics import READ_ONLY_MESSAGE
from storage.cypher.executor import Context, execute
from storage.cypher.graph import GraphReader
from storage.cypher.operators import Plan
from storage.cypher.parser import parse
from storage.cypher.planner import plan as plan_ast
from storage.errors import InvalidRequest

__all__ = ["READ_ONLY_MESSAGE", "CypherResult", "GraphReader", "plan", "run", "warm"]


class CypherResult(msgspec.Struct):
    """The answer to a query: column names and rows of JSON-ready values."""

    columns: list[str]
    rows: list[list[Any]]


@lru_cache(maxsize=256)
def plan(query: str) -> Plan:
    """The plan for query text (cached: plans depend on the text only, never on params or data)."""
    return plan_ast(parse(query))


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
) -> CypherResult:
    """Run a read-only query against reader; InvalidRequest (400) for any fault of the query."""
    planned = plan(query)  # before the clock starts: the time limit is for running the query
    ctx = Context(reader, params or {}, timeout_ms)
    missing = [f"${name}" for name in planned.parameters if name not in ctx.params]
    if missing:
        noun, it = ("parameter", "it") if len(missing) == 1 else ("parameters", "them")
        raise InvalidRequest(f"missing {noun} {', '.join(missing)}; pass {it} in params")
    rows = execute(planned, ctx, max_rows)
    return CypherResult(columns=list(planned.columns), rows=rows)

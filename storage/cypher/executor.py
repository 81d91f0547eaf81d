"""Plan execution: an iterator pipeline over binding rows (dicts of variable -> value)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgspec

from storage.cypher import ast
from storage.cypher.bounds import LIST_BYTES, SLOT_BYTES, Meter
from storage.cypher.expressions import Fn, Row, compile_expr, truth
from storage.cypher.graph import NODE_BYTES, GraphReader, Node, Relationship
from storage.cypher.operators import (
    Argument,
    Expand,
    Filter,
    MatchStep,
    Plan,
    ProjectStep,
    ScanAll,
    SeekById,
    SeekByKind,
    SeekByProperties,
    SeekByProperty,
    SeekByTs,
    UnwindStep,
)
from storage.cypher.projection import project
from storage.cypher.values import is_number, to_json, type_name
from storage.errors import InvalidRequest
from storage.ids import id_bytes

# Nodes and link lists a query keeps once read, so a node reached twice is decoded once. Past
# this many (or this many bytes of nodes), new ones are read but not kept: a scan of 100,000
# events would otherwise hold them all (113 MB measured) until the query ends.
CACHE_ENTRIES = 10_000
CACHE_NODE_BYTES = 16 << 20


class Context:
    """What every operator shares: the reader, parameters, the meter and per-query caches."""

    def __init__(self, reader: GraphReader, params: dict[str, Any], meter: Meter) -> None:
        self.reader = reader
        self.params = params
        self.meter = meter
        self.tick = meter.tick
        self._nodes: dict[bytes, Node | None] = {}
        self._node_bytes = 0
        self._links: dict[tuple[bytes, str, bool], list[bytes]] = {}
        self._compiled: dict[Any, Fn] = {}

    def compile(self, expr: ast.Expr) -> Fn:
        """Expr compiled once per query (AST nodes are hashable values)."""
        fn = self._compiled.get(expr)
        if fn is None:
            fn = self._compiled[expr] = compile_expr(expr, self.params, self.meter)
        return fn

    def node(self, raw_id: bytes) -> Node | None:
        """The live event with this raw id, read once per query."""
        nodes = self._nodes
        if raw_id in nodes:
            return nodes[raw_id]
        raw = self.reader.raw_record(raw_id)
        node = None if raw is None else Node(raw_id, raw, self.reader)
        if len(nodes) < CACHE_ENTRIES and self._node_bytes < CACHE_NODE_BYTES:
            nodes[raw_id] = node
            # its bytes and, once a property is read, about as much again decoded
            self._node_bytes += 0 if raw is None else NODE_BYTES + 2 * len(raw)
        return node

    def links(self, raw_id: bytes, rel: str, outgoing: bool) -> list[bytes]:
        """raw_links_out or raw_links_in, read once per query."""
        key = (raw_id, rel, outgoing)
        found = self._links.get(key)
        if found is None:
            read = self.reader.raw_links_out if outgoing else self.reader.raw_links_in
            found = read(raw_id, rel)
            if len(self._links) < CACHE_ENTRIES:
                self._links[key] = found
        return found


def execute(plan: Plan, ctx: Context, *, encoded: bool = False) -> list[Any]:
    """The result rows of plan, rendered for JSON (encoded: each row as JSON bytes already, so
    encoding the answer is done here, row by row under the meter, and the caller's encoder
    only copies bytes); InvalidRequest past a bound of ctx.meter."""
    meter = ctx.meter
    max_rows = meter.limits.max_rows
    rows: Iterator[Row] = iter([{}])
    for step in plan.steps:
        rows = _STEPS[type(step)](step, rows, ctx)
    out: list[Any] = []
    width = LIST_BYTES + SLOT_BYTES * len(plan.columns)
    for row in rows:
        meter.tick()
        if len(out) >= max_rows:
            raise InvalidRequest(f"query produced more than {max_rows} rows; add LIMIT")
        meter.row_values = 0
        meter.render(width, len(plan.columns))
        rendered = [to_json(row[column], meter) for column in plan.columns]
        out.append(msgspec.Raw(msgspec.json.encode(rendered)) if encoded else rendered)
    return out


# ---- steps ----------------------------------------------------------------------------------


def _match(step: MatchStep, rows: Iterator[Row], ctx: Context) -> Iterator[Row]:
    if not step.optional:
        return _run_ops(step.ops, rows, ctx)
    return _optional(step, rows, ctx)


def _optional(step: MatchStep, rows: Iterator[Row], ctx: Context) -> Iterator[Row]:
    nulls = dict.fromkeys(step.introduced)
    for row in rows:
        ctx.tick()
        matched = False
        for out in _run_ops(step.ops, iter([row]), ctx):
            matched = True
            yield out
        if not matched:
            yield {**row, **nulls}


def _run_ops(ops: Iterable[Any], rows: Iterator[Row], ctx: Context) -> Iterator[Row]:
    pending: list[Any] = list(ops)
    while pending:
        op = pending.pop(0)
        fused = _FUSED.get(type(op))
        if fused is None:
            rows = _OPS[type(op)](op, rows, ctx)
            continue
        # the filters right after a seek or an expansion are tested where its rows are made,
        # in the same order: one generator less per row, and a failing row is never yielded
        checks = []
        while pending and type(pending[0]) is Filter:
            checks.append(ctx.compile(pending.pop(0).predicate))
        rows = fused(op, rows, ctx, _all_true(checks))
    return rows


def _all_true(checks: list[Fn]) -> Callable[[Row], bool] | None:
    """One test of a row against each predicate in order (WHERE's three-valued truth), or None
    for no predicate."""
    if not checks:
        return None
    if len(checks) == 1:
        (only,) = checks
        return lambda row: truth(only(row), "WHERE") is True
    return lambda row: all(truth(check(row), "WHERE") is True for check in checks)


def _unwind(step: UnwindStep, rows: Iterator[Row], ctx: Context) -> Iterator[Row]:
    fn = ctx.compile(step.expr)
    for row in rows:
        ctx.tick()
        value = fn(row)
        for item in value if isinstance(value, list) else ([] if value is None else [value]):
            ctx.tick()
            yield {**row, step.alias: item}


def _project(step: ProjectStep, rows: Iterator[Row], ctx: Context) -> Iterator[Row]:
    return project(step, rows, ctx.compile, ctx.meter)


_STEPS: dict[type, Callable[[Any, Iterator[Row], Context], Iterator[Row]]] = {
    MatchStep: _match,
    UnwindStep: _unwind,
    ProjectStep: _project,
}


# ---- starts: seeks, scans and nodes bound earlier ---------------------------------------------


def _argument(op: Argument, rows: Iterator[Row], ctx: Context) -> Iterator[Row]:
    for row in rows:
        ctx.tick()
        value = row.get(op.var)
        if value is None:
            continue  # a null from OPTIONAL MATCH matches nothing
        if not isinstance(value, Node):
            raise InvalidRequest(f"variable {op.var!r} holds {type_name(value)}, not a node")
        yield row


def _seek(ids: Callable[[Any, Row, Context], Iterable[bytes]]) -> Callable[..., Iterator[Row]]:
    """An operator binding op.var to each live event whose raw id ids() yields for the row."""

    def run(
        op: Any, rows: Iterator[Row], ctx: Context, check: Callable[[Row], bool] | None = None
    ) -> Iterator[Row]:
        var, tick, read = op.var, ctx.tick, ctx.node
        for row in rows:
            tick()
            for raw_id in ids(op, row, ctx):
                tick()
                node = read(raw_id)
                if node is not None:
                    out = {**row, var: node}
                    if check is None or check(out):
                        yield out

    return run


def _values(op: Any, row: Row, ctx: Context) -> list[Any]:
    """The value(s) a seek looks up: one, or each distinct element of an IN list."""
    value = ctx.compile(op.value)(row)
    if not op.many:
        return [value]
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"IN needs a list on its right, got {type_name(value)}")
    return value


def _distinct_ids(groups: Iterable[Iterable[bytes]]) -> Iterator[bytes]:
    seen: set[bytes] = set()
    for group in groups:
        for event_id in group:
            if event_id not in seen:
                seen.add(event_id)
                yield event_id


def _ids_by_id(op: SeekById, row: Row, ctx: Context) -> Iterable[bytes]:
    return _distinct_ids(_raw_id(v) for v in _values(op, row, ctx) if isinstance(v, str))


def _raw_id(event_id: str) -> list[bytes]:
    """The raw id of an id's text (any form uuid.UUID reads), none for text that is no id."""
    try:
        return [id_bytes(event_id)]
    except (ValueError, TypeError, AttributeError):
        return []


def _ids_by_kind(op: SeekByKind, row: Row, ctx: Context) -> Iterable[bytes]:
    kinds = [v for v in _values(op, row, ctx) if isinstance(v, str)]
    if not (op.lower or op.upper):
        return _distinct_ids(ctx.reader.raw_ids_by_kind(k) for k in kinds)
    bounds = _ts_bounds(op, row, ctx)
    if bounds is None:
        return ()
    return _distinct_ids(ctx.reader.raw_ids_by_kind(k, *bounds) for k in kinds)


def _ids_by_property(op: SeekByProperty, row: Row, ctx: Context) -> Iterable[bytes]:
    values = [_seekable(v) for v in _values(op, row, ctx)]
    return _distinct_ids(ctx.reader.raw_ids_by_property(op.key, v) for v in values if v is not None)


def _ids_by_properties(op: SeekByProperties, row: Row, ctx: Context) -> Iterable[bytes]:
    values = [_seekable(ctx.compile(value)(row)) for value in op.values]
    if any(v is None for v in values):
        return ()  # a null (or a list, a map, NaN) equals no property: nothing matches
    return ctx.reader.raw_ids_by_properties(list(zip(op.keys, values, strict=True)))


def _seekable(value: Any) -> Any:
    """Value as the property index holds it, or None if no filterable property can equal it:
    only a boolean, a number or a string can (every integer of a query is within 64 bits)."""
    if isinstance(value, bool | str):
        return value
    if not is_number(value):
        return None
    return None if math.isnan(value) else value


# what the (ts, id) index can hold: a signed 64-bit integer
TS_MIN, TS_MAX = -(2**63), 2**63 - 1


def _ids_by_ts(op: SeekByTs, row: Row, ctx: Context) -> Iterable[bytes]:
    bounds = _ts_bounds(op, row, ctx)
    return () if bounds is None else ctx.reader.raw_ids_by_ts(*bounds)


def _ts_bounds(op: SeekByTs | SeekByKind, row: Row, ctx: Context) -> tuple[Any, Any] | None:
    """(lo, hi) with lo <= ts < hi for the index (None: unbounded), or None if nothing fits."""
    lows = [_ts_low(ctx.compile(b.value)(row), b.inclusive) for b in op.lower]
    highs = [_ts_high(ctx.compile(b.value)(row), b.inclusive) for b in op.upper]
    if None in lows or None in highs:
        return None  # a bound that is null or not a number compares as null: nothing matches
    lo = max(lows, default=None)  # type: ignore[type-var]
    hi = min(highs, default=None)  # type: ignore[type-var]
    if lo is not None and hi is not None and lo >= hi:
        return None
    if (lo is not None and lo > TS_MAX) or (hi is not None and hi <= TS_MIN):
        return None  # beyond every time an event can have
    lo = None if lo is None or lo <= TS_MIN else lo
    hi = None if hi is None or hi > TS_MAX else hi
    return lo, hi


def _ts_low(value: Any, inclusive: bool) -> int | None:
    """The smallest integer ts satisfying ts >= value (or > value)."""
    if not is_number(value) or math.isnan(value):
        return None
    if math.isinf(value):
        return None if value > 0 else -(2**63)
    return int(math.ceil(value) if inclusive else math.floor(value) + 1)


def _ts_high(value: Any, inclusive: bool) -> int | None:
    """One past the largest integer ts satisfying ts <= value (or < value)."""
    if not is_number(value) or math.isnan(value):
        return None
    if math.isinf(value):
        return None if value < 0 else 2**63
    return int(math.floor(value) + 1 if inclusive else math.ceil(value))


def _scan_all(op: ScanAll, row: Row, ctx: Context) -> Iterable[bytes]:
    return ctx.reader.raw_ids_by_ts(None, None)


# ---- expansion and filters --------------------------------------------------------------------


def _expand(
    op: Expand, rows: Iterator[Row], ctx: Context, check: Callable[[Row], bool] | None = None
) -> Iterator[Row]:
    if check is not None:
        yield from filter(check, _expand(op, rows, ctx))
        return
    for row in rows:
        ctx.tick()
        source = row.get(op.source)
        if source is None:
            continue
        if not isinstance(source, Node):
            raise InvalidRequest(f"variable {op.source!r} holds {type_name(source)}, not a node")
        used = _links_in_use(row, op.unique_against)
        target = row.get(op.target) if op.into else None
        if op.into and not isinstance(target, Node):
            continue
        if not op.variable_length:
            yield from _one_hop(op, row, source.raw_id, used, target, ctx)
            continue
        for end_id, path in _paths(op, source.raw_id, used, ctx):
            value: Any = _path_value(op, path)
            if target is not None:
                if end_id == target.raw_id:
                    yield {**row, op.rel: value}
                continue
            node = ctx.node(end_id)
            if node is not None:
                yield {**row, op.target: node, op.rel: value}


def _one_hop(
    op: Expand, row: Row, start: bytes, used: set[Relationship], target: Node | None, ctx: Context
) -> Iterator[Row]:
    """_expand's rows for a single link (what _paths gives for one hop, without its queue)."""
    if target is None and not used and op.direction == "out" and len(op.types) == 1:
        # the common case: the link list walked as it is, without _steps' generator
        rel, tick, read = op.types[0], ctx.tick, ctx.node
        for end_id in ctx.links(start, rel, True):
            tick()
            node = read(end_id)
            if node is not None:
                yield {**row, op.target: node, op.rel: Relationship(rel, start, end_id)}
        return
    for link, end_id in _steps(op, start, ctx):
        ctx.tick()
        if used and link in used:
            continue
        if target is not None:
            if end_id == target.raw_id and ctx.node(end_id) is not None:
                yield {**row, op.rel: link}
            continue
        node = ctx.node(end_id)
        if node is not None:
            yield {**row, op.target: node, op.rel: link}


def _path_value(op: Expand, path: tuple[Relationship, ...]) -> Any:
    """What the relationship variable holds: the link, or the path's links left to right."""
    if not op.variable_length:
        return path[0]
    return list(reversed(path)) if op.reversed_path else list(path)


def _links_in_use(row: Row, names: tuple[str, ...]) -> set[Relationship]:
    """Links bound earlier in the same MATCH: openCypher matches each link once per pattern."""
    used: set[Relationship] = set()
    for name in names:
        value = row.get(name)
        if isinstance(value, Relationship):
            used.add(value)
        elif isinstance(value, list):
            used.update(value)
    return used


def _paths(
    op: Expand, start: bytes, used: set[Relationship], ctx: Context
) -> Iterator[tuple[bytes, tuple[Relationship, ...]]]:
    """(end id, links) for every path of min..max hops, shortest first, no link twice."""
    queue: deque[tuple[bytes, tuple[Relationship, ...]]] = deque([(start, ())])
    while queue:
        at, path = queue.popleft()
        if len(path) >= op.min_hops:
            yield at, path
        if len(path) == op.max_hops:
            continue
        for link, nxt in _steps(op, at, ctx):
            ctx.tick()
            if link in used or link in path or ctx.node(nxt) is None:
                continue
            queue.append((nxt, (*path, link)))


def _steps(op: Expand, at: bytes, ctx: Context) -> Iterator[tuple[Relationship, bytes]]:
    for rel in op.types:
        if op.direction != "in":
            for target in ctx.links(at, rel, True):
                yield Relationship(rel, at, target), target
        if op.direction != "out":
            for origin in ctx.links(at, rel, False):
                if op.direction == "in" or origin != at:  # a self-link is one link, not two
                    yield Relationship(rel, origin, at), origin


def _filter(op: Filter, rows: Iterator[Row], ctx: Context) -> Iterator[Row]:
    predicate = ctx.compile(op.predicate)
    for row in rows:
        ctx.tick()
        if truth(predicate(row), "WHERE") is True:
            yield row


# (op, rows, ctx, check=None): the check a fused filter makes on each row it yields.
_FUSED: dict[type, Callable[..., Iterator[Row]]] = {
    ScanAll: _seek(_scan_all),
    SeekById: _seek(_ids_by_id),
    SeekByKind: _seek(_ids_by_kind),
    SeekByProperty: _seek(_ids_by_property),
    SeekByProperties: _seek(_ids_by_properties),
    SeekByTs: _seek(_ids_by_ts),
    Expand: _expand,
}
# Every fused operator also runs unfused (no check): one table, not two copies of it.
_OPS: dict[type, Callable[[Any, Iterator[Row], Context], Iterator[Row]]] = {
    Argument: _argument,
    **_FUSED,
    Filter: _filter,
}

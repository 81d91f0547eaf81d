"""Plan execution: an iterator pipeline over binding rows (dicts of variable -> value)."""

from __future__ import annotations

import math
import operator
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
from storage.cypher.projection import project, sorted_columns, sorted_values
from storage.cypher.scope import variables
from storage.cypher.values import is_number, to_json, type_name
from storage.errors import InvalidRequest
from storage.ids import id_bytes, id_str

# Nodes and link lists a query keeps once read, so a node reached twice is decoded once. Past
# this many (or this many bytes of nodes), new ones are read but not kept: a scan of 100,000
# events would otherwise hold them all (113 MB measured) until the query ends.
CACHE_ENTRIES = 10_000
CACHE_NODE_BYTES = 16 << 20


_UNREAD: Any = object()  # what the node cache holds for an id not read yet


class Context:
    """What every operator shares: the reader, parameters, the meter and per-query caches."""

    def __init__(self, reader: GraphReader, params: dict[str, Any], meter: Meter) -> None:
        self.reader = reader
        self.params = params
        self.meter = meter
        self.tick = meter.tick
        self._nodes: dict[bytes, Node | None] = {}
        self._node_bytes = 0
        self._links: dict[tuple[bytes, str, bool], tuple[bytes, ...]] = {}
        self._links_of_kind: dict[tuple[bytes, str, str], tuple[bytes, ...]] = {}
        self._compiled: dict[Any, Fn] = {}

    def compile(self, expr: ast.Expr) -> Fn:
        """Expr compiled once per query (AST nodes are hashable values)."""
        fn = self._compiled.get(expr)
        if fn is None:
            fn = self._compiled[expr] = compile_expr(expr, self.params, self.meter)
        return fn

    def node(self, raw_id: bytes) -> Node | None:
        """The live event with this raw id, read once per query (kept while the cache has
        room)."""
        nodes = self._nodes
        node: Node | None = nodes.get(raw_id, _UNREAD)
        if node is not _UNREAD:
            return node
        raw = self.reader.raw_record(raw_id)
        node = None if raw is None else Node(raw_id, raw, self.reader)
        if len(nodes) < CACHE_ENTRIES and self._node_bytes < CACHE_NODE_BYTES:
            nodes[raw_id] = node
            # its bytes and, once a property is read, about as much again decoded
            self._node_bytes += 0 if raw is None else NODE_BYTES + 2 * len(raw)
        return node

    # Link lists are kept as tuples: the collector stops tracking a tuple of ids, never a list,
    # and a query keeps one per node it expands.

    def links_of_kind(self, raw_id: bytes, rel: str, kind: str) -> tuple[bytes, ...]:
        """raw_links_out_of_kind, read once per query."""
        key = (raw_id, rel, kind)
        found = self._links_of_kind.get(key)
        if found is None:
            found = tuple(self.reader.raw_links_out_of_kind(raw_id, rel, kind))
            if len(self._links_of_kind) < CACHE_ENTRIES:
                self._links_of_kind[key] = found
        return found

    def links(self, raw_id: bytes, rel: str, outgoing: bool) -> tuple[bytes, ...]:
        """raw_links_out or raw_links_in, read once per query."""
        key = (raw_id, rel, outgoing)
        found = self._links.get(key)
        if found is None:
            read = self.reader.raw_links_out if outgoing else self.reader.raw_links_in
            found = tuple(read(raw_id, rel))
            if len(self._links) < CACHE_ENTRIES:
                self._links[key] = found
        return found


def execute(
    plan: Plan, ctx: Context, *, encoded: bool = False, read: set[str] | None = None
) -> list[Any]:
    """The result rows of plan, rendered for JSON (encoded: each row as JSON bytes already, so
    encoding the answer is done here, row by row under the meter, and the caller's encoder
    only copies bytes); InvalidRequest past a bound of ctx.meter. `read` gets the raw ids of
    the events whose nodes (or links) the rows reaching the final RETURN were built from."""
    meter = ctx.meter
    max_rows = meter.limits.max_rows
    rows: Iterator[Row] = iter([{}])
    last = plan.steps[-1]
    # a sorted RETURN hands over its rows as the answer's lists, not as maps to pick from
    sorted_last = last if type(last) is ProjectStep and sorted_columns(last) else None
    for i, step in enumerate(plan.steps if sorted_last is None else plan.steps[:-1]):
        if read is not None and i == len(plan.steps) - 1:
            rows = _noting(rows, read)  # what the final RETURN is built from
        rows = _STEPS[type(step)](step, rows, ctx)
    if read is not None and sorted_last is not None:
        rows = _noting(rows, read)
    answer: Iterator[Any] = (
        rows if sorted_last is None else sorted_values(sorted_last, rows, ctx.compile, meter)
    )
    out: list[Any] = []
    columns, tick, render = plan.columns, meter.tick, meter.render
    width = LIST_BYTES + SLOT_BYTES * len(columns)
    # a row's values in column order by one C call (itemgetter gives a tuple for two or more)
    pick = operator.itemgetter(*columns) if len(columns) > 1 else None
    for row in answer:
        tick()
        if len(out) >= max_rows:
            raise InvalidRequest(f"query produced more than {max_rows} rows; add LIMIT")
        meter.row_values = 0
        if sorted_last is not None:
            rendered = row
        else:
            rendered = [row[column] for column in columns] if pick is None else list(pick(row))
        # a row of strings, integers, booleans and nulls (most answers) is charged what
        # to_json would charge it, in one call instead of one per value
        nbytes, values = width, len(columns)
        for value in rendered:
            kind = type(value)
            if kind is str:
                nbytes += SLOT_BYTES + len(value)
                values += 1
            elif kind not in _PLAIN:
                render(width, len(columns))
                rendered = [to_json(value, meter) for value in rendered]
                break
        else:
            render(nbytes, values)
        out.append(msgspec.Raw(msgspec.json.encode(rendered)) if encoded else rendered)
    return out


def _noting(rows: Iterator[Row], read: set[str]) -> Iterator[Row]:
    """The rows as they are, the events their values hold noted in `read`."""
    for row in rows:
        for value in row.values():
            _note(value, read)
        yield row


def _note(value: Any, read: set[str]) -> None:
    """Note the events a value holds. Each list or map is walked once, without recursion: a
    value may share one list many times over (WITH [l, l] AS l, thirty times, is 2^30 leaves
    but 31 lists), which the encoder refuses by its bounds only after this walk."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is Node:
            read.add(id_str(item.raw_id))
        elif kind is Relationship:
            read.add(id_str(item.start_raw))
            read.add(id_str(item.end_raw))
        elif (kind is list or kind is tuple or kind is dict) and id(item) not in seen:
            seen.add(id(item))
            stack.extend(item.values() if kind is dict else item)


# values to_json gives back as they are, charging nothing
_PLAIN = frozenset({int, bool, type(None)})


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
        preds = []
        while pending and type(pending[0]) is Filter:
            preds.append(pending.pop(0).predicate)
        rows = fused(op, rows, ctx, tuple(preds))
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
    """An operator binding op.var to each live event whose raw id ids() yields for the row,
    kept if it passes the filters fused with it (preds)."""

    def run(
        op: Any, rows: Iterator[Row], ctx: Context, preds: tuple[ast.Expr, ...] = ()
    ) -> Iterator[Row]:
        var, tick, read = op.var, ctx.tick, ctx.node
        check = _all_true([ctx.compile(p) for p in preds if not _sought(op, p, ctx)])
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


def _sought(op: Any, pred: ast.Expr, ctx: Context) -> bool:
    """Whether every event the property seek op yields passes pred already: `var.key = value`
    with a string or boolean value the seek looked up, which the property index holds exactly
    (a number may not: the index keys it as a float64, which two integers can share)."""
    if type(op) is SeekByProperties:
        pairs = zip(op.keys, op.values, strict=True)
    elif type(op) is SeekByProperty and not op.many:
        pairs = zip((op.key,), (op.value,), strict=True)
    else:
        return False
    if not (
        type(pred) is ast.Binary
        and pred.op == "="
        and type(pred.left) is ast.Property
        and pred.left.subject == ast.Variable(op.var)
        and type(pred.right) in (ast.Literal, ast.Parameter)
        and (pred.left.key, pred.right) in set(pairs)
    ):
        return False
    return type(ctx.compile(pred.right)({})) in (str, bool)


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
    op: Expand, rows: Iterator[Row], ctx: Context, preds: tuple[ast.Expr, ...] = ()
) -> Iterator[Row]:
    if _walks_one_list(op):
        yield from _one_list(op, rows, ctx, preds)
        return
    if preds:
        check = _all_true([ctx.compile(p) for p in preds])
        yield from filter(check, _expand(op, rows, ctx))
        return
    for row in rows:
        ctx.tick()
        source = _source(op, row)
        if source is None:
            continue
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


def _source(op: Expand, row: Row) -> Node | None:
    """The node an expansion starts from (None: a null from OPTIONAL MATCH, which matches
    nothing); InvalidRequest if the variable holds something else."""
    source = row.get(op.source)
    if source is None or type(source) is Node:
        return source
    raise InvalidRequest(f"variable {op.source!r} holds {type_name(source)}, not a node")


def _walks_one_list(op: Expand) -> bool:
    """Whether each row's expansion is one link list read as it is: one hop out under one
    type, to a new variable, with no earlier link of the pattern to avoid."""
    return (
        not op.variable_length
        and not op.into
        and op.direction == "out"
        and len(op.types) == 1
        and not op.unique_against
    )


def _one_list(
    op: Expand, rows: Iterator[Row], ctx: Context, preds: tuple[ast.Expr, ...]
) -> Iterator[Row]:
    """_expand's rows when _walks_one_list: a kind that the filters ask of the target is told
    by the link list, so a target of another kind is never read (most targets of a busy source
    fail such a filter: bench/RESULTS.md, "Cypher at 100,000 events"); the other filters that
    read the target alone are tested on it before its row is built."""
    target_var, rel, tick, read = op.target, op.types[0], ctx.tick, ctx.node
    kind, first, rest = _target_filters(op.target, preds, ctx)
    for row in rows:
        tick()
        source = row.get(op.source)
        if type(source) is not Node:
            source = _source(op, row)  # None (OPTIONAL MATCH's null) or a refusal
            if source is None:
                continue
        start = source.raw_id
        ends = ctx.links(start, rel, True) if kind is None else ctx.links_of_kind(start, rel, kind)
        for end_id in ends:
            tick()
            node = read(end_id)
            if node is None or (first is not None and not first({target_var: node})):
                continue
            out = {**row, target_var: node, op.rel: Relationship(rel, start, end_id)}
            if rest is None or rest(out):
                yield out


def _target_filters(
    target: str, preds: tuple[ast.Expr, ...], ctx: Context
) -> tuple[str | None, Callable[[Row], bool] | None, Callable[[Row], bool] | None]:
    """The filters of an expansion split, keeping their order: (a kind that the leading
    filters ask of the target, the other leading ones that read the target alone, the rest)."""
    lead = 0
    while lead < len(preds) and variables(preds[lead]) <= {target}:
        lead += 1
    kind = None
    first = list(preds[:lead])
    for i, pred in enumerate(first):
        wanted = _kind_equals(target, pred, ctx)
        if wanted is not None:
            kind = wanted
            del first[i]
            break
    checks = [ctx.compile(p) for p in first], [ctx.compile(p) for p in preds[lead:]]
    return kind, _all_true(checks[0]), _all_true(checks[1])


def _kind_equals(var: str, pred: ast.Expr, ctx: Context) -> str | None:
    """The kind pred asks of var (`var.kind = 'text'`, the text a literal or a parameter), or
    None for any other predicate."""
    if not (
        type(pred) is ast.Binary
        and pred.op == "="
        and pred.left == ast.Property(ast.Variable(var), "kind")
        and type(pred.right) in (ast.Literal, ast.Parameter)
    ):
        return None
    value = ctx.compile(pred.right)({})
    return value if type(value) is str else None


def _one_hop(
    op: Expand, row: Row, start: bytes, used: set[Relationship], target: Node | None, ctx: Context
) -> Iterator[Row]:
    """_expand's rows for a single link (what _paths gives for one hop, without its queue)."""
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

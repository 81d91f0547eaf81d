"""MATCH planning: start each connected pattern at its most selective node, then expand."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from storage.cypher import ast
from storage.cypher.graph import REL_TYPES
from storage.cypher.operators import (
    HIDDEN,
    Argument,
    Expand,
    Filter,
    MatchOp,
    MatchStep,
    ScanAll,
    SeekById,
    SeekByKind,
    SeekByProperties,
    SeekByProperty,
    SeekByTs,
    StartOp,
    TsBound,
)
from storage.cypher.scope import (
    NODE,
    PATH,
    REL,
    VALUE,
    Scope,
    aggregate_calls,
    check_expr,
    variables,
)
from storage.errors import InvalidRequest

# How selective each start is assumed to be, lower first: an id names one event, a filterable
# property value usually a handful (and several, their lists intersected, fewer), a kind or a
# time range many; a kind within a time range (one walk of the (kind, ts, id) index) beats either
# alone. Bound means "already known".
(
    RANK_BOUND,
    RANK_ID,
    RANK_PROPERTIES,
    RANK_PROPERTY,
    RANK_KIND_TS_EQUAL,
    RANK_TS_EQUAL,
    RANK_KIND_TS_RANGE,
    RANK_KIND,
    RANK_TS_RANGE,
    RANK_SCAN,
) = range(10)

_FLIP = {"out": "in", "in": "out", "both": "both"}
_MIRROR = {"=": "=", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
_NOT_INDEXED = {"text"}  # a core property with no index: filtered, never sought


class Names:
    """Hands out the planner's hidden variable names."""

    def __init__(self) -> None:
        self.count = 0

    def fresh(self, prefix: str) -> str:
        """A new hidden name."""
        self.count += 1
        return f"{HIDDEN}{prefix}{self.count}"


class _Edge(msgspec.Struct, frozen=True):
    left: str
    right: str
    name: str
    rel: ast.RelPattern


def plan_match(clause: ast.Match, scope: Scope, names: Names) -> tuple[MatchStep, Scope]:
    """The step for one MATCH or OPTIONAL MATCH, and the scope after it."""
    inner = dict(scope)
    nodes, edges, conjuncts = _elements(clause, inner, names)
    if clause.where is not None:
        conjuncts.extend(_split_and(clause.where))
    for conjunct in conjuncts:
        check_expr(conjunct, inner, "WHERE")
    ops = _order_ops(nodes, edges, conjuncts, scope)
    introduced = tuple(name for name in inner if name not in scope)
    return MatchStep(tuple(ops), clause.optional, introduced), inner


def _elements(
    clause: ast.Match, scope: Scope, names: Names
) -> tuple[list[str], list[_Edge], list[ast.Expr]]:
    """Name every node and link (anonymous ones get hidden names) and turn property maps into
    equality predicates, so `(f {topic: $t})` plans exactly like `WHERE f.topic = $t`."""
    nodes: list[str] = []
    edges: list[_Edge] = []
    conjuncts: list[ast.Expr] = []
    for path in clause.patterns:
        path_nodes = [_node(node, scope, names, conjuncts) for node in path.nodes]
        nodes.extend(n for n in path_nodes if n not in nodes)
        for i, rel in enumerate(path.rels):
            name = rel.var or names.fresh("r")
            if any(e.name == name for e in edges):
                raise InvalidRequest(
                    f"variable {name!r} names two links in one MATCH; each needs its own name"
                )
            if name in scope:
                raise InvalidRequest(
                    f"variable {name!r} is already bound; a link variable cannot be matched again"
                )
            scope[name] = PATH if rel.variable_length else REL
            edges.append(_Edge(path_nodes[i], path_nodes[i + 1], name, rel))
    return nodes, edges, conjuncts


def _node(node: ast.NodePattern, scope: Scope, names: Names, conjuncts: list[ast.Expr]) -> str:
    name = node.var or names.fresh("n")
    kind = scope.setdefault(name, NODE)
    if kind not in (NODE, VALUE):
        raise InvalidRequest(f"variable {name!r} is a {kind}, not a node")
    for key, value in node.properties.entries if node.properties else ():
        conjuncts.append(ast.Binary("=", ast.Property(ast.Variable(name), key), value))
    return name


def _split_and(expr: ast.Expr) -> list[ast.Expr]:
    if isinstance(expr, ast.Binary) and expr.op == "AND":
        return _split_and(expr.left) + _split_and(expr.right)
    return [expr]


def _order_ops(
    nodes: list[str], edges: list[_Edge], conjuncts: list[ast.Expr], outer: Scope
) -> list[MatchOp]:
    """Seeks, expansions and filters in order; each filter as soon as its variables are bound."""
    bound = set(outer)
    ops: list[MatchOp] = [Argument(n) for n in nodes if n in outer]
    pending = list(conjuncts)
    rels: list[str] = []

    def place_filters() -> None:
        for conjunct in [c for c in pending if variables(c) <= bound]:
            ops.append(Filter(conjunct))
            pending.remove(conjunct)

    place_filters()
    remaining = list(edges)
    while remaining or any(n not in bound for n in nodes):
        edge = _next_edge(remaining, bound)
        if edge is not None:
            remaining.remove(edge)
            op = _expand(edge, bound, tuple(rels))
            rels.append(edge.name)
            bound.update((edge.name, op.target))
            ops.append(op)
        else:
            seek = _best_seek([n for n in nodes if n not in bound], pending, bound)
            bound.add(seek.var)
            ops.append(seek)
        place_filters()
    return ops


def _next_edge(edges: list[_Edge], bound: set[str]) -> _Edge | None:
    """A link between two bound nodes first (a cheap check), else one leaving a bound node."""
    closing = [e for e in edges if e.left in bound and e.right in bound]
    leaving = [e for e in edges if e.left in bound or e.right in bound]
    return next(iter(closing or leaving), None)


def _expand(edge: _Edge, bound: set[str], earlier: tuple[str, ...]) -> Expand:
    rel = edge.rel
    forward = edge.left in bound
    source, target = (edge.left, edge.right) if forward else (edge.right, edge.left)
    return Expand(
        source=source,
        rel=edge.name,
        target=target,
        types=rel.types or REL_TYPES,
        direction=rel.direction if forward else _FLIP[rel.direction],
        min_hops=rel.min_hops,
        max_hops=rel.max_hops or 1,
        variable_length=rel.variable_length,
        into=target in bound,
        unique_against=earlier,
        reversed_path=not forward,
    )


def _best_seek(candidates: list[str], conjuncts: list[ast.Expr], bound: set[str]) -> StartOp:
    """The start with the lowest rank over all unbound nodes; the first node wins ties."""
    options = [_seek_for(var, conjuncts, bound) for var in candidates]
    return min(options, key=lambda option: option[0])[1]


def _seek_for(var: str, conjuncts: list[ast.Expr], bound: set[str]) -> tuple[int, StartOp]:
    best: tuple[int, StartOp] = (RANK_SCAN, ScanAll(var))
    lower: list[TsBound] = []
    upper: list[TsBound] = []
    equal_ts = False
    kind: SeekByKind | None = None
    equal: list[tuple[str, ast.Expr]] = []  # `var.key = value` on filterable properties
    for key, op, value in _indexable(var, conjuncts, bound):
        if key == "ts":
            equal_ts = equal_ts or op == "="
            lower.extend([TsBound(value, op != ">")] if op in ("=", ">", ">=") else [])
            upper.extend([TsBound(value, op != "<")] if op in ("=", "<", "<=") else [])
        elif op in ("=", "IN") and key not in _NOT_INDEXED:
            rank, make = _EQUALITY_SEEKS.get(key, (RANK_PROPERTY, _property_seek(key)))
            seek = make(var, value, op == "IN")
            kind = seek if kind is None and isinstance(seek, SeekByKind) else kind
            best = min(best, (rank, seek), key=lambda o: o[0])
            if isinstance(seek, SeekByProperty) and op == "=" and (key, value) not in equal:
                equal.append((key, value))
    if len(equal) > 1:
        keys, values = zip(*equal, strict=True)
        best = min(best, (RANK_PROPERTIES, SeekByProperties(var, keys, values)), key=lambda o: o[0])
    if lower or upper:
        ranked: list[tuple[int, StartOp]] = [
            (
                RANK_TS_EQUAL if equal_ts else RANK_TS_RANGE,
                SeekByTs(var, tuple(lower), tuple(upper)),
            )
        ]
        if kind is not None:
            within = msgspec.structs.replace(kind, lower=tuple(lower), upper=tuple(upper))
            ranked.append((RANK_KIND_TS_EQUAL if equal_ts else RANK_KIND_TS_RANGE, within))
        best = min([best, *ranked], key=lambda o: o[0])
    return best


def _indexable(
    var: str, conjuncts: list[ast.Expr], bound: set[str]
) -> list[tuple[str, str, ast.Expr]]:
    """(property, operator, value) for each conjunct `var.property op value` (either way round)
    whose value is known before var is: literals, parameters, variables bound earlier."""
    found = []
    for c in conjuncts:
        if not isinstance(c, ast.Binary) or (c.op not in _MIRROR and c.op != "IN"):
            continue
        sides = [(c.left, c.op, c.right)]
        if c.op in _MIRROR:  # `x IN v.p` is membership in the property, not a seek
            sides.append((c.right, _MIRROR[c.op], c.left))
        for prop, op, value in sides:
            if (
                isinstance(prop, ast.Property)
                and prop.subject == ast.Variable(var)
                and variables(value) <= bound
                and not aggregate_calls(value)
            ):
                found.append((prop.key, op, value))
    return found


def _property_seek(key: str) -> Callable[[str, ast.Expr, bool], StartOp]:
    return lambda var, value, many: SeekByProperty(var, key, value, many)


_EQUALITY_SEEKS: dict[str, tuple[int, Callable[[str, ast.Expr, bool], StartOp]]] = {
    "event_id": (RANK_ID, lambda var, value, many: SeekById(var, value, many)),
    "kind": (RANK_KIND, lambda var, value, many: SeekByKind(var, value, many)),
}

"""The Cypher syntax tree: frozen, hashable nodes the parser builds and the planner reads."""

from __future__ import annotations

from typing import Any

import msgspec

# Frozen Structs compare and hash by value, which the planner relies on: an ORDER BY key
# equal to a projected expression is recognised by plain ==.


class Literal(msgspec.Struct, frozen=True):
    """A constant: null, a boolean, a number or a string; build it with literal()."""

    value: Any
    # Python has 1 == 1.0 == True; the type name keeps those literals apart when trees
    # are compared or hashed (plan caches, ORDER BY matching, aggregate slots).
    type: str


def literal(value: Any) -> Literal:
    """The Literal node for value."""
    return Literal(value, type(value).__name__)


class Parameter(msgspec.Struct, frozen=True):
    """A `$name` placeholder filled from the request's params."""

    name: str


class Variable(msgspec.Struct, frozen=True):
    """A reference to a bound variable."""

    name: str


class Property(msgspec.Struct, frozen=True):
    """`subject.key`."""

    subject: Expr
    key: str


class Index(msgspec.Struct, frozen=True):
    """`subject[index]` on a list or a map."""

    subject: Expr
    index: Expr


class Slice(msgspec.Struct, frozen=True):
    """`subject[start..end]` on a list."""

    subject: Expr
    start: Expr | None
    end: Expr | None


class ListExpr(msgspec.Struct, frozen=True):
    """`[a, b, ...]`."""

    items: tuple[Expr, ...]


class MapExpr(msgspec.Struct, frozen=True):
    """`{key: value, ...}`, entries in the order written."""

    entries: tuple[tuple[str, Expr], ...]


class Unary(msgspec.Struct, frozen=True):
    """A prefix operator: `-`, `+` or `NOT`."""

    op: str
    operand: Expr


class Binary(msgspec.Struct, frozen=True):
    """An infix operator: arithmetic, comparison, boolean, `IN` or a string predicate."""

    op: str
    left: Expr
    right: Expr


class IsNull(msgspec.Struct, frozen=True):
    """`operand IS NULL`, or `IS NOT NULL` when negated."""

    operand: Expr
    negated: bool = False


class FunctionCall(msgspec.Struct, frozen=True):
    """`name(args)`; name is lower-cased, `count(*)` has star set and no args."""

    name: str
    args: tuple[Expr, ...] = ()
    distinct: bool = False
    star: bool = False


Expr = (
    Literal
    | Parameter
    | Variable
    | Property
    | Index
    | Slice
    | ListExpr
    | MapExpr
    | Unary
    | Binary
    | IsNull
    | FunctionCall
)


# ---- patterns ---------------------------------------------------------------------------


class NodePattern(msgspec.Struct, frozen=True):
    """`(var:Label {props})`; every part optional."""

    var: str | None = None
    labels: tuple[str, ...] = ()
    properties: MapExpr | None = None


class RelPattern(msgspec.Struct, frozen=True):
    """`-[var:TYPE*min..max]->`; direction is "out", "in" or "both"; no types means any."""

    direction: str
    var: str | None = None
    types: tuple[str, ...] = ()
    variable_length: bool = False
    min_hops: int = 1
    max_hops: int | None = 1


class PatternPath(msgspec.Struct, frozen=True):
    """One comma-separated pattern: nodes[0] rels[0] nodes[1] ... rels[n-1] nodes[n]."""

    nodes: tuple[NodePattern, ...]
    rels: tuple[RelPattern, ...] = ()


# ---- clauses ----------------------------------------------------------------------------


class ProjectionItem(msgspec.Struct, frozen=True):
    """One RETURN or WITH item; name is the alias, or the expression as written."""

    expr: Expr
    name: str
    aliased: bool = False


class SortItem(msgspec.Struct, frozen=True):
    """One ORDER BY key."""

    expr: Expr
    descending: bool = False


class Projection(msgspec.Struct, frozen=True):
    """The body shared by WITH and RETURN."""

    items: tuple[ProjectionItem, ...]
    star: bool = False
    distinct: bool = False
    order_by: tuple[SortItem, ...] = ()
    skip: Expr | None = None
    limit: Expr | None = None


class Match(msgspec.Struct, frozen=True):
    """`[OPTIONAL] MATCH pattern, ... [WHERE predicate]`."""

    patterns: tuple[PatternPath, ...]
    where: Expr | None = None
    optional: bool = False


class Unwind(msgspec.Struct, frozen=True):
    """`UNWIND expr AS alias`."""

    expr: Expr
    alias: str


class With(msgspec.Struct, frozen=True):
    """`WITH projection [WHERE predicate]`."""

    projection: Projection
    where: Expr | None = None


class Return(msgspec.Struct, frozen=True):
    """`RETURN projection`: the last clause of every query."""

    projection: Projection


Clause = Match | Unwind | With | Return


class Query(msgspec.Struct, frozen=True):
    """A whole query: reading clauses followed by one RETURN."""

    clauses: tuple[Clause, ...]


def children(expr: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of expr."""
    found: tuple[Expr, ...] = _CHILDREN[type(expr)](expr)
    return found


def _map_values(expr: Any) -> tuple[Expr, ...]:
    return tuple(value for _, value in expr.entries)


def _slice_parts(expr: Any) -> tuple[Expr, ...]:
    return tuple(part for part in (expr.subject, expr.start, expr.end) if part is not None)


# Each node type declares its children here, so walks need no isinstance chains.
_CHILDREN: dict[type, Any] = {
    Literal: lambda e: (),
    Parameter: lambda e: (),
    Variable: lambda e: (),
    Property: lambda e: (e.subject,),
    Index: lambda e: (e.subject, e.index),
    Slice: _slice_parts,
    ListExpr: lambda e: e.items,
    MapExpr: _map_values,
    Unary: lambda e: (e.operand,),
    Binary: lambda e: (e.left, e.right),
    IsNull: lambda e: (e.operand,),
    FunctionCall: lambda e: e.args,
}


def walk(expr: Expr) -> Any:
    """Every node of expr, depth first, expr itself first."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def replace(expr: Expr, fn: Any) -> Expr:
    """A copy of expr where fn(node) replaces each node for which it returns non-None (top down)."""
    new: Expr | None = fn(expr)
    if new is not None:
        return new
    rebuilt: Expr = _REBUILD[type(expr)](expr, lambda e: replace(e, fn))
    return rebuilt


def _rebuild_slice(e: Slice, f: Any) -> Expr:
    return Slice(
        f(e.subject), None if e.start is None else f(e.start), None if e.end is None else f(e.end)
    )


_REBUILD: dict[type, Any] = {
    Literal: lambda e, f: e,
    Parameter: lambda e, f: e,
    Variable: lambda e, f: e,
    Property: lambda e, f: Property(f(e.subject), e.key),
    Index: lambda e, f: Index(f(e.subject), f(e.index)),
    Slice: _rebuild_slice,
    ListExpr: lambda e, f: ListExpr(tuple(f(i) for i in e.items)),
    MapExpr: lambda e, f: MapExpr(tuple((k, f(v)) for k, v in e.entries)),
    Unary: lambda e, f: Unary(e.op, f(e.operand)),
    Binary: lambda e, f: Binary(e.op, f(e.left), f(e.right)),
    IsNull: lambda e, f: IsNull(f(e.operand), e.negated),
    FunctionCall: lambda e, f: FunctionCall(
        e.name, tuple(f(a) for a in e.args), e.distinct, e.star
    ),
}

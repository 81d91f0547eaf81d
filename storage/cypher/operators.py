"""Plan operators: what the planner decides and the executor runs, as frozen, printable values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from storage.cypher import ast

# Variables the planner invents (anonymous nodes and links, aggregate slots) start with a NUL,
# which no name in a query can contain, so they never collide with the user's and never show.
HIDDEN = "\0"


def is_hidden(name: str) -> bool:
    """Whether name is a planner-made variable."""
    return name.startswith(HIDDEN)


# ---- MATCH operators: each turns one binding row into zero or more ------------------------


class Argument(msgspec.Struct, frozen=True):
    """A node bound by an earlier clause: the row goes on if it holds a node (not null)."""

    var: str


class ScanAll(msgspec.Struct, frozen=True):
    """Every live event: the fallback when no predicate has an index."""

    var: str


class SeekById(msgspec.Struct, frozen=True):
    """`var.event_id = value` (or IN a list when many): direct gets."""

    var: str
    value: ast.Expr
    many: bool = False


class TsBound(msgspec.Struct, frozen=True):
    """One side of a ts range."""

    value: ast.Expr
    inclusive: bool


class SeekByKind(msgspec.Struct, frozen=True):
    """`var.kind = value` (or IN a list): the (kind, ts, id) index, within a ts range if any."""

    var: str
    value: ast.Expr
    many: bool = False
    lower: tuple[TsBound, ...] = ()
    upper: tuple[TsBound, ...] = ()


class SeekByProperty(msgspec.Struct, frozen=True):
    """`var.key = value` (or IN a list) on a filterable property: the property index."""

    var: str
    key: str
    value: ast.Expr
    many: bool = False


class SeekByProperties(msgspec.Struct, frozen=True):
    """`var.k1 = v1 AND var.k2 = v2 …` on filterable properties: the property index's lists of
    the values intersected, before any event is read."""

    var: str
    keys: tuple[str, ...]
    values: tuple[ast.Expr, ...]


class SeekByTs(msgspec.Struct, frozen=True):
    """A range on `var.ts`: the (ts, id) index; every lower and every upper bound applies."""

    var: str
    lower: tuple[TsBound, ...] = ()
    upper: tuple[TsBound, ...] = ()


class Expand(msgspec.Struct, frozen=True):
    """Follow links from source to target (into: target already bound, only check the link)."""

    source: str
    rel: str
    target: str
    types: tuple[str, ...]
    direction: str  # "out": source links to target; "in": target links to source; "both"
    min_hops: int = 1
    max_hops: int = 1
    variable_length: bool = False
    into: bool = False
    unique_against: tuple[str, ...] = ()  # links bound earlier in this MATCH: not reused
    # the pattern is walked from its right end: a path variable still lists its links left to
    # right, as openCypher binds them, so the executor reverses what it walked
    reversed_path: bool = False


class Filter(msgspec.Struct, frozen=True):
    """Keep the rows where predicate is true (false and null drop the row)."""

    predicate: ast.Expr


StartOp = ScanAll | SeekById | SeekByKind | SeekByProperty | SeekByProperties | SeekByTs
MatchOp = Argument | StartOp | Expand | Filter
SEEKS = (SeekById, SeekByKind, SeekByProperty, SeekByProperties, SeekByTs)


# ---- steps: one per clause ----------------------------------------------------------------


class MatchStep(msgspec.Struct, frozen=True):
    """A MATCH: operators run in order on each row; optional rows get nulls when none match."""

    ops: tuple[MatchOp, ...]
    optional: bool = False
    introduced: tuple[str, ...] = ()


class UnwindStep(msgspec.Struct, frozen=True):
    """One row per element of a list."""

    expr: ast.Expr
    alias: str


class ProjectStep(msgspec.Struct, frozen=True):
    """WITH or RETURN: project (grouping when aggregates is non-empty), dedupe, sort, page."""

    items: tuple[tuple[str, ast.Expr], ...]
    aggregates: tuple[tuple[str, ast.FunctionCall], ...] = ()
    grouping: tuple[str, ...] = ()
    star: tuple[str, ...] = ()  # variables carried by `*`
    distinct: bool = False
    order_by: tuple[ast.SortItem, ...] = ()
    skip: ast.Expr | None = None
    limit: ast.Expr | None = None
    where: ast.Expr | None = None
    final: bool = False


Step = MatchStep | UnwindStep | ProjectStep


class Plan(msgspec.Struct, frozen=True):
    """A planned query: its steps, result columns and the parameters it needs."""

    steps: tuple[Step, ...]
    columns: tuple[str, ...]
    parameters: tuple[str, ...] = ()

    def describe(self) -> str:
        """The plan as indented text, one operator per line (what EXPLAIN would print)."""
        lines: list[str] = []
        for step in self.steps:
            lines.extend(_DESCRIBE_STEP[type(step)](step))
        return "\n".join(lines)

    def starts(self) -> list[MatchOp]:
        """Every start operator (seek, scan or bound argument) in plan order."""
        return [
            op
            for step in self.steps
            if isinstance(step, MatchStep)
            for op in step.ops
            if isinstance(op, (*SEEKS, ScanAll, Argument))
        ]


# ---- text -----------------------------------------------------------------------------------


def render(expr: ast.Expr) -> str:
    """Expr as Cypher text."""
    return _RENDER[type(expr)](expr)


def _name(name: str) -> str:
    return "_" + name[1:] if is_hidden(name) else name


def _operand(expr: ast.Expr) -> str:
    text = render(expr)
    return f"({text})" if isinstance(expr, ast.Binary) else text


def _render_literal(expr: ast.Literal) -> str:
    value = expr.value
    if value is None:
        return "null"
    if type(value) is bool:
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


def _render_call(expr: ast.FunctionCall) -> str:
    if expr.star:
        return f"{expr.name}(*)"
    inner = ", ".join(render(a) for a in expr.args)
    return f"{expr.name}({'DISTINCT ' if expr.distinct else ''}{inner})"


def _render_slice(expr: ast.Slice) -> str:
    start = "" if expr.start is None else render(expr.start)
    end = "" if expr.end is None else render(expr.end)
    return f"{_operand(expr.subject)}[{start}..{end}]"


_RENDER: dict[type, Callable[[Any], str]] = {
    ast.Literal: _render_literal,
    ast.Parameter: lambda e: f"${e.name}",
    ast.Variable: lambda e: _name(e.name),
    ast.Property: lambda e: f"{_operand(e.subject)}.{e.key}",
    ast.Index: lambda e: f"{_operand(e.subject)}[{render(e.index)}]",
    ast.Slice: _render_slice,
    ast.ListExpr: lambda e: "[" + ", ".join(render(i) for i in e.items) + "]",
    ast.MapExpr: lambda e: "{" + ", ".join(f"{k}: {render(v)}" for k, v in e.entries) + "}",
    ast.Unary: lambda e: f"{e.op}{' ' if e.op == 'NOT' else ''}{_operand(e.operand)}",
    ast.Binary: lambda e: f"{_operand(e.left)} {e.op} {_operand(e.right)}",
    ast.IsNull: lambda e: f"{_operand(e.operand)} IS {'NOT ' if e.negated else ''}NULL",
    ast.FunctionCall: _render_call,
}


def _seek_value(op: Any) -> str:
    return f"{' IN ' if op.many else ' = '}{render(op.value)}"


def _ts_range(op: SeekByTs | SeekByKind) -> str:
    lows = [f"{render(b.value)} {'<=' if b.inclusive else '<'} " for b in op.lower]
    highs = [f" {'<=' if b.inclusive else '<'} {render(b.value)}" for b in op.upper]
    return f"{''.join(lows)}{_name(op.var)}.ts{''.join(highs)}"


def _kind_seek(op: SeekByKind) -> str:
    within = f", {_ts_range(op)}" if op.lower or op.upper else ""
    return f"SeekByKind({_name(op.var)}.kind{_seek_value(op)}{within})"


def _expand(op: Expand) -> str:
    types = "|".join(op.types)
    hops = f"*{op.min_hops}..{op.max_hops}" if op.variable_length else ""
    body = f"[{_name(op.rel)}{':' if types else ''}{types}{hops}]"
    left, right = (
        ("<-", "-") if op.direction == "in" else ("-", "->" if op.direction == "out" else "-")
    )
    into = "Into" if op.into else ""
    return f"Expand{into}(({_name(op.source)}){left}{body}{right}({_name(op.target)}))"


_DESCRIBE_OP: dict[type, Callable[[Any], str]] = {
    Argument: lambda op: f"Argument({_name(op.var)})",
    ScanAll: lambda op: f"ScanAll({_name(op.var)})",
    SeekById: lambda op: f"SeekById({_name(op.var)}.event_id{_seek_value(op)})",
    SeekByKind: _kind_seek,
    SeekByProperty: lambda op: f"SeekByProperty({_name(op.var)}.{op.key}{_seek_value(op)})",
    SeekByProperties: lambda op: (
        "SeekByProperties("
        + ", ".join(
            f"{_name(op.var)}.{k} = {render(v)}" for k, v in zip(op.keys, op.values, strict=True)
        )
        + ")"
    ),
    SeekByTs: lambda op: f"SeekByTs({_ts_range(op)})",
    Expand: _expand,
    Filter: lambda op: f"Filter({render(op.predicate)})",
}


def _describe_match(step: MatchStep) -> list[str]:
    head = "OptionalMatch" if step.optional else "Match"
    return [head] + ["  " + _DESCRIBE_OP[type(op)](op) for op in step.ops]


def _describe_project(step: ProjectStep) -> list[str]:
    items = [_name(s) for s in step.star] + [
        name if render(expr) == name else f"{render(expr)} AS {name}" for name, expr in step.items
    ]
    line = ("Return " if step.final else "With ") + ("DISTINCT " if step.distinct else "")
    line += ", ".join(items)
    for name, call in step.aggregates:
        line += f" [{_name(name)} = {render(call)}]"
    if step.order_by:
        keys = [render(s.expr) + (" DESC" if s.descending else "") for s in step.order_by]
        line += " ORDER BY " + ", ".join(keys)
    if step.skip is not None:
        line += f" SKIP {render(step.skip)}"
    if step.limit is not None:
        line += f" LIMIT {render(step.limit)}"
    if step.where is not None:
        line += f" WHERE {render(step.where)}"
    return [line]


_DESCRIBE_STEP: dict[type, Callable[[Any], list[str]]] = {
    MatchStep: _describe_match,
    UnwindStep: lambda s: [f"Unwind {render(s.expr)} AS {s.alias}"],
    ProjectStep: _describe_project,
}

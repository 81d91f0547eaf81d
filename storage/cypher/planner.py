"""AST to plan: one step per clause, with the scope checks that make bad queries clear errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from storage.cypher import ast
from storage.cypher.operators import HIDDEN, Plan, ProjectStep, Step, UnwindStep, is_hidden
from storage.cypher.patterns import Names, plan_match
from storage.cypher.scope import (
    VALUE,
    Scope,
    aggregate_calls,
    bind,
    check_constant,
    check_expr,
    check_item,
    parameters,
    variables,
)
from storage.errors import InvalidRequest


def plan(query: ast.Query) -> Plan:
    """The plan for a parsed query; InvalidRequest for unknown variables, misplaced aggregates."""
    planner = _Planner()
    for clause in query.clauses:
        planner.steps.append(_CLAUSES[type(clause)](planner, clause))
    final = planner.steps[-1]
    assert isinstance(final, ProjectStep) and final.final  # the grammar puts RETURN last
    columns = final.star + tuple(name for name, _ in final.items)
    return Plan(tuple(planner.steps), columns, tuple(sorted(_query_parameters(query))))


class _Planner:
    def __init__(self) -> None:
        self.scope: Scope = {}
        self.steps: list[Step] = []
        self.names = Names()

    def match(self, clause: ast.Match) -> Step:
        step, self.scope = plan_match(clause, self.scope, self.names)
        return step

    def unwind(self, clause: ast.Unwind) -> Step:
        check_expr(clause.expr, self.scope, "UNWIND")
        bind(self.scope, clause.alias, VALUE, "UNWIND … AS")
        return UnwindStep(clause.expr, clause.alias)

    def with_(self, clause: ast.With) -> Step:
        step, self.scope = _projection(clause.projection, self.scope, final=False)
        if clause.where is not None:
            check_expr(clause.where, self.scope, "WHERE")
            step = msgspec.structs.replace(step, where=clause.where)
        return step

    def return_(self, clause: ast.Return) -> Step:
        step, self.scope = _projection(clause.projection, self.scope, final=True)
        return step


_CLAUSES: dict[type, Callable[[_Planner, Any], Step]] = {
    ast.Match: _Planner.match,
    ast.Unwind: _Planner.unwind,
    ast.With: _Planner.with_,
    ast.Return: _Planner.return_,
}


def _projection(proj: ast.Projection, scope: Scope, *, final: bool) -> tuple[ProjectStep, Scope]:
    """A WITH or RETURN: items checked, aggregates given slots, ORDER BY keys resolved."""
    clause = "RETURN" if final else "WITH"
    star = tuple(sorted(name for name in scope if not is_hidden(name))) if proj.star else ()
    if proj.star and not star:
        raise InvalidRequest(f"{clause} * has no variables to carry; name what to {clause}")
    _check_names(proj, star, clause, final)
    for item in proj.items:
        check_item(item.expr, scope, clause)

    slots: dict[ast.FunctionCall, str] = {}
    for item in proj.items:
        for call in aggregate_calls(item.expr):
            slots.setdefault(call, f"{HIDDEN}agg{len(slots) + 1}")

    def fill(node: ast.Expr) -> ast.Expr | None:
        return ast.Variable(slots[node]) if node in slots else None

    items = tuple((item.name, ast.replace(item.expr, fill)) for item in proj.items)
    grouping = tuple(item.name for item in proj.items if not aggregate_calls(item.expr))
    order_by = _order_keys(proj, scope, star, slots, clause)
    for name, expr in (("SKIP", proj.skip), ("LIMIT", proj.limit)):
        if expr is not None:
            check_constant(expr, name)

    step = ProjectStep(
        items=items,
        aggregates=tuple((name, call) for call, name in slots.items()),
        grouping=grouping,
        star=star,
        distinct=proj.distinct,
        order_by=order_by,
        skip=proj.skip,
        limit=proj.limit,
        final=final,
    )
    after = {name: scope[name] for name in star}
    for item in proj.items:
        source = item.expr.name if isinstance(item.expr, ast.Variable) else None
        after[item.name] = scope.get(source, VALUE) if source is not None else VALUE
    return step, after


def _check_names(proj: ast.Projection, star: tuple[str, ...], clause: str, final: bool) -> None:
    seen = set(star)
    for item in proj.items:
        if not final and not item.aliased and not isinstance(item.expr, ast.Variable):
            raise InvalidRequest(f"WITH {item.name} needs a name: write WITH {item.name} AS name")
        if item.name in seen:
            raise InvalidRequest(
                f"{clause} has two columns named {item.name!r}; give one an alias with AS"
            )
        seen.add(item.name)


def _order_keys(
    proj: ast.Projection,
    scope: Scope,
    star: tuple[str, ...],
    slots: dict[ast.FunctionCall, str],
    clause: str,
) -> tuple[ast.SortItem, ...]:
    """ORDER BY keys with each projected expression replaced by its column, so `ORDER BY
    count(*)` after `RETURN count(*)` sorts by that column rather than aggregating again."""
    columns = {item.expr: item.name for item in reversed(proj.items)}

    def to_column(node: ast.Expr) -> ast.Expr | None:
        if node in columns:
            return ast.Variable(columns[node])
        return ast.Variable(slots[node]) if node in slots else None

    grouped = bool(slots) or proj.distinct
    visible = set(star) | {item.name for item in proj.items}
    allowed = visible | set(slots.values()) if grouped else visible | set(scope)
    keys = []
    for sort in proj.order_by:
        expr = ast.replace(sort.expr, to_column)
        calls = aggregate_calls(expr)
        if calls:
            raise InvalidRequest(f"{calls[0].name}() in ORDER BY must also be a {clause} item")
        hidden = sorted(n for n in variables(expr) - allowed if n in scope)
        if grouped and hidden:
            raise InvalidRequest(
                f"ORDER BY after DISTINCT or an aggregate can only use what {clause} returns; "
                f"{hidden[0]!r} is not returned"
            )
        check_expr(expr, allowed, "ORDER BY")
        keys.append(ast.SortItem(expr, sort.descending))
    return tuple(keys)


def _query_parameters(query: ast.Query) -> set[str]:
    found: set[str] = set()
    for clause in query.clauses:
        for expr in _CLAUSE_EXPRS[type(clause)](clause):
            found |= parameters(expr)
    return found


def _match_exprs(clause: ast.Match) -> list[ast.Expr]:
    maps = [n.properties for p in clause.patterns for n in p.nodes if n.properties is not None]
    return [*maps, *([clause.where] if clause.where is not None else [])]


def _projection_exprs(proj: ast.Projection) -> list[ast.Expr]:
    exprs = [item.expr for item in proj.items] + [s.expr for s in proj.order_by]
    return exprs + [e for e in (proj.skip, proj.limit) if e is not None]


_CLAUSE_EXPRS: dict[type, Callable[[Any], list[ast.Expr]]] = {
    ast.Match: _match_exprs,
    ast.Unwind: lambda c: [c.expr],
    ast.With: lambda c: _projection_exprs(c.projection) + ([c.where] if c.where else []),
    ast.Return: lambda c: _projection_exprs(c.projection),
}

"""WITH and RETURN execution: projection or grouping, DISTINCT, ORDER BY, SKIP, LIMIT, WHERE."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from storage.cypher import ast
from storage.cypher.expressions import Fn, Row, truth
from storage.cypher.functions import AGGREGATES, Aggregate, Distinct
from storage.cypher.operators import ProjectStep
from storage.cypher.values import group_key, order_key, type_name
from storage.errors import InvalidRequest

Compile = Callable[[ast.Expr], Fn]
Tick = Callable[[], None]
# (the row ORDER BY sees, the projected row): ORDER BY may read variables the projection drops
Pair = tuple[Row, Row]


def project(step: ProjectStep, rows: Iterator[Row], compile: Compile, tick: Tick) -> Iterator[Row]:
    """The rows after one WITH or RETURN."""
    pairs = _group(step, rows, compile, tick) if step.aggregates else _plain(step, rows, compile)
    if step.distinct:
        pairs = _distinct(pairs)
    if step.order_by:
        pairs = _sort(step, pairs, compile, tick)
    pairs = _page(step, pairs, compile)
    out: Iterator[Row] = (projected for _, projected in pairs)
    if step.where is not None:
        out = _where(step.where, out, compile, tick)
    return out


def _plain(step: ProjectStep, rows: Iterator[Row], compile: Compile) -> Iterator[Pair]:
    items = [(name, compile(expr)) for name, expr in step.items]
    for row in rows:
        projected = {name: row.get(name) for name in step.star}
        projected.update((name, fn(row)) for name, fn in items)
        yield row, projected


class _Group:
    """One group: the first row seen (to evaluate grouping keys) and its accumulators."""

    def __init__(self, row: Row, accumulators: list[Aggregate]) -> None:
        self.row = row
        self.accumulators = accumulators


def _group(step: ProjectStep, rows: Iterator[Row], compile: Compile, tick: Tick) -> Iterator[Pair]:
    """openCypher aggregation: the non-aggregate items (and `*` variables) are the grouping key."""
    keyed = {name: expr for name, expr in step.items}
    key_fns = [compile(ast.Variable(n)) for n in step.star]
    key_fns += [compile(keyed[name]) for name in step.grouping]
    args = [None if call.star else compile(call.args[0]) for _, call in step.aggregates]
    groups: dict[Any, _Group] = {}
    for row in rows:
        tick()
        key = tuple(group_key(fn(row)) for fn in key_fns)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(row, [_start(call) for _, call in step.aggregates])
        for arg, acc in zip(args, group.accumulators, strict=True):
            value = True if arg is None else arg(row)  # count(*) counts rows, nulls included
            if value is not None:
                acc.add(value)
    if not groups and not key_fns:
        # no rows and nothing to group by: one row of empty aggregates (count 0, collect [])
        groups[()] = _Group({}, [_start(call) for _, call in step.aggregates])
    items = [(name, compile(expr)) for name, expr in step.items]
    for group in groups.values():
        results = {
            name: acc.result()
            for (name, _), acc in zip(step.aggregates, group.accumulators, strict=True)
        }
        env = {**group.row, **results}
        projected = {name: group.row.get(name) for name in step.star}
        projected.update((name, fn(env)) for name, fn in items)
        yield {**projected, **results}, projected


def _start(call: ast.FunctionCall) -> Aggregate:
    acc = AGGREGATES[call.name].make()
    return Distinct(acc) if call.distinct else acc


def _distinct(pairs: Iterator[Pair]) -> Iterator[Pair]:
    seen: set[Any] = set()
    for env, projected in pairs:
        key = tuple(group_key(v) for v in projected.values())
        if key not in seen:
            seen.add(key)
            yield env, projected


def _sort(step: ProjectStep, pairs: Iterator[Pair], compile: Compile, tick: Tick) -> Iterator[Pair]:
    fns = [compile(item.expr) for item in step.order_by]
    keyed = []
    for env, projected in pairs:
        tick()
        view = {**env, **projected}
        keyed.append(([order_key(fn(view)) for fn in fns], (env, projected)))
    # one stable sort per key, least significant first: DESC flips one key, not the others
    for i in reversed(range(len(fns))):
        keyed.sort(key=lambda entry: entry[0][i], reverse=step.order_by[i].descending)
    tick()
    return iter([pair for _, pair in keyed])


def _page(step: ProjectStep, pairs: Iterator[Pair], compile: Compile) -> Iterator[Pair]:
    skip = _count(step.skip, "SKIP", compile)
    limit = _count(step.limit, "LIMIT", compile)
    if skip is None and limit is None:
        return pairs
    # islice takes no more than sys.maxsize; a larger SKIP or LIMIT means "all" just the same
    start = min(skip or 0, sys.maxsize)
    return islice(pairs, start, None if limit is None else min(start + limit, sys.maxsize))


def _count(expr: ast.Expr | None, clause: str, compile: Compile) -> int | None:
    if expr is None:
        return None
    value = compile(expr)({})
    if type(value) is not int or value < 0:
        got = repr(value) if type(value) is int else type_name(value)
        raise InvalidRequest(f"{clause} needs a non-negative integer, got {got}")
    return value


def _where(predicate: ast.Expr, rows: Iterator[Row], compile: Compile, tick: Tick) -> Iterator[Row]:
    fn = compile(predicate)
    for row in rows:
        tick()
        if truth(fn(row), "WHERE") is True:
            yield row

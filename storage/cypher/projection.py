"""WITH and RETURN execution: projection or grouping, DISTINCT, ORDER BY, SKIP, LIMIT, WHERE."""

from __future__ import annotations

import heapq
import operator
import sys
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any, Final

from storage.cypher import ast
from storage.cypher.bounds import SET_ENTRY_BYTES, Meter, held_bytes, row_bytes, values_bytes
from storage.cypher.expressions import Fn, Row, truth
from storage.cypher.functions import AGGREGATES, Aggregate, Distinct
from storage.cypher.operators import ProjectStep
from storage.cypher.scope import variables
from storage.cypher.values import group_key, order_key, type_name
from storage.errors import InvalidRequest

Compile = Callable[[ast.Expr], Fn]
# (the row ORDER BY sees, the projected row): ORDER BY may read variables the projection drops
Pair = tuple[Row, Row]
# Rows sorted by one C call: a sort of this many keys holds the interpreter for about a
# millisecond; longer inputs are sorted in runs of this size and merged.
SORT_RUN = 1024
# Runs holding this many rows in all are merged by one sort (it merges sorted runs in linear
# time: about what a run's sort costs); more go through heapq.merge, which yields between rows.
MERGE_BY_SORT = 4 * SORT_RUN


def sorted_columns(step: ProjectStep) -> bool:
    """Whether a final RETURN can give its rows as lists of its columns' values straight from
    its sort (sorted_values): ORDER BY on the rows before projection, nothing else between."""
    return (
        step.final
        and bool(step.order_by)
        and not (step.aggregates or step.distinct or step.star or step.where is not None)
        and not _reads_columns(step)
    )


def sorted_values(
    step: ProjectStep, rows: Iterator[Row], compile: Compile, meter: Meter
) -> Iterator[list[Any]]:
    """What project gives for a step that sorted_columns accepts, each row as the list of its
    columns' values (the answer's row) instead of a map of them; the same rows, the same
    charges."""
    start, stop = _page_bounds(step, compile)
    pairs = _sort(step, rows, compile, meter, keep=stop, project=True, as_values=True)
    if start or stop is not None:
        pairs = islice(pairs, start, stop)
    return (values for _, values in pairs)


def _reads_columns(step: ProjectStep) -> bool:
    """Whether ORDER BY names a column (which shadows a variable of the same name)."""
    read = {name for item in step.order_by for name in variables(item.expr)}
    return bool(read & ({name for name, _ in step.items} | set(step.star)))


def project(
    step: ProjectStep, rows: Iterator[Row], compile: Compile, meter: Meter
) -> Iterator[Row]:
    """The rows after one WITH or RETURN."""
    start, stop = _page_bounds(step, compile)
    if step.order_by and not (step.aggregates or step.distinct or step.star):
        # the sort projects each row as it takes it: no generator and no pair between them
        pairs = _sort(step, rows, compile, meter, keep=stop, project=True)
    else:
        if step.aggregates:
            pairs = _group(step, rows, compile, meter)
        else:
            pairs = _plain(step, rows, compile, meter)
        if step.distinct:
            pairs = _distinct(pairs, meter)
        if step.order_by:
            pairs = _sort(step, pairs, compile, meter, keep=stop)
    if start or stop is not None:
        pairs = islice(pairs, start, stop)
    out: Iterator[Row] = (projected for _, projected in pairs)
    if step.where is not None:
        out = _where(step.where, out, compile, meter)
    return out


def _plain(
    step: ProjectStep, rows: Iterator[Row], compile: Compile, meter: Meter
) -> Iterator[Pair]:
    items = [(name, compile(expr)) for name, expr in step.items]
    star, tick = step.star, meter.tick
    if not star:
        for row in rows:
            tick()
            yield row, {name: fn(row) for name, fn in items}
        return
    for row in rows:
        tick()
        projected = {name: row.get(name) for name in star}
        projected.update((name, fn(row)) for name, fn in items)
        yield row, projected


class _Group:
    """One group: the first row seen (to evaluate grouping keys) and its accumulators."""

    def __init__(self, row: Row, accumulators: list[Aggregate]) -> None:
        self.row = row
        self.accumulators = accumulators


def _group(
    step: ProjectStep, rows: Iterator[Row], compile: Compile, meter: Meter
) -> Iterator[Pair]:
    """OpenCypher aggregation: the non-aggregate items (and `*` variables) are the grouping key."""
    keyed = {name: expr for name, expr in step.items}
    key_fns = [compile(ast.Variable(n)) for n in step.star]
    key_fns += [compile(keyed[name]) for name in step.grouping]
    args = [None if call.star else compile(call.args[0]) for _, call in step.aggregates]
    groups: dict[Any, _Group] = {}
    for row in rows:
        meter.tick()
        key = tuple(group_key(fn(row), meter) for fn in key_fns)
        group = groups.get(key)
        if group is None:
            meter.charge(SET_ENTRY_BYTES + row_bytes(row))  # the group holds its row
            accumulators = [_start(call, meter) for _, call in step.aggregates]
            group = groups[key] = _Group(row, accumulators)
        for arg, acc in zip(args, group.accumulators, strict=True):
            value = True if arg is None else arg(row)  # count(*) counts rows, nulls included
            if value is not None:
                acc.add(value)
    if not groups and not key_fns:
        # no rows and nothing to group by: one row of empty aggregates (count 0, collect [])
        groups[()] = _Group({}, [_start(call, meter) for _, call in step.aggregates])
    items = [(name, compile(expr)) for name, expr in step.items]
    for group in groups.values():
        meter.tick()
        results = {
            name: acc.result()
            for (name, _), acc in zip(step.aggregates, group.accumulators, strict=True)
        }
        env = {**group.row, **results}
        projected = {name: group.row.get(name) for name in step.star}
        projected.update((name, fn(env)) for name, fn in items)
        yield {**projected, **results}, projected


def _start(call: ast.FunctionCall, meter: Meter) -> Aggregate:
    acc = AGGREGATES[call.name].make(meter)
    return Distinct(acc, meter) if call.distinct else acc


def _distinct(pairs: Iterator[Pair], meter: Meter) -> Iterator[Pair]:
    seen: set[Any] = set()
    for env, projected in pairs:
        meter.tick()
        key = tuple(group_key(v, meter) for v in projected.values())
        if key not in seen:
            meter.charge(SET_ENTRY_BYTES + sum(held_bytes(v) for v in projected.values()))
            seen.add(key)
            yield env, projected


# A row waiting in ORDER BY: (its sort keys, the row before projection, the projected row, the
# bytes charged for it). A plain tuple, not a NamedTuple, and the keys a tuple: the collector
# stops tracking a plain tuple of untracked values (numbers, strings, rows of nodes), never a
# NamedTuple, and a sort holds one per row.
_Sorted = tuple[tuple[Any, ...], Row, Any, int]  # the projected row: a map, or its values
_KEYS: Final = 0
_ENV: Final = 1
_PROJECTED: Final = 2
_COST: Final = 3


class _Descending:
    """A sort key compared the other way round, to merge runs sorted with reverse=True."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __lt__(self, other: _Descending) -> bool:
        return bool(other.key < self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and bool(self.key == other.key)

    __hash__ = None  # type: ignore[assignment]


def _sort(
    step: ProjectStep,
    pairs: Iterator[Any],
    compile: Compile,
    meter: Meter,
    keep: int | None,
    project: bool = False,
    as_values: bool = False,
) -> Iterator[tuple[Row, Any]]:
    """The pairs in ORDER BY order, stable. Sorted in runs of SORT_RUN and merged, so no one
    step holds the interpreter long; with a LIMIT, only the rows the page can reach are kept
    (and their bytes given back as others push them out). With project, pairs are the rows
    before projection, each projected here as _plain would (its pairs, without _plain); with
    as_values too, each projected as the list of its values in column order (sorted_values),
    charged what the map of them would be."""
    fns = [compile(item.expr) for item in step.order_by]
    items = [(name, compile(expr)) for name, expr in step.items] if project else None
    values_of = [fn for _, fn in items] if items is not None and as_values else None
    # the map a row would be projected into: its size is its keys' (the same for every row)
    map_bytes = sys.getsizeof({name: None for name, _ in step.items})
    descending = [item.descending for item in step.order_by]
    # the keys read the row before projection alone unless they name a column (which shadows
    # a variable of the same name): then no merged row is built for each
    merged = _reads_columns(step)
    extra = 2 * SET_ENTRY_BYTES * (1 + len(fns))
    runs: list[list[_Sorted]] = []
    held, buffer = 0, list[_Sorted]()
    # While every row's keys are integers or strings, each position of one type in all rows
    # (ts, a name), the keys are the values themselves: they sort as their order_key tuples
    # would, and without building one per value. The first row that breaks this turns every
    # key held into order_key's (in the same order) and the rest are built as before.
    shape: tuple[type, ...] | None = ()  # (): no row yet; None: order_key's tuples
    projected: Any
    for pair in pairs:
        meter.tick()
        if values_of is not None:  # never merged (sorted_columns)
            env, projected = pair, [fn(pair) for fn in values_of]
            view, cost = env, row_bytes(env) + map_bytes + values_bytes(projected) + extra
        else:
            if items is None:
                env, projected = pair
            else:
                env, projected = pair, {name: fn(pair) for name, fn in items}
            if merged:
                view = {**env, **projected}
                cost = row_bytes(view) + extra
            else:
                view, cost = env, row_bytes(env) + row_bytes(projected) + extra
        if shape is None:
            keys = tuple([order_key(fn(view), meter) for fn in fns])
        else:
            keys = tuple([fn(view) for fn in fns])
            if tuple(map(type, keys)) != shape:
                if shape or not all(type(k) in _SELF_KEYED for k in keys):
                    runs, buffer = _tagged(runs, meter), _tagged([buffer], meter)[0]
                    keys, shape = tuple([order_key(k, meter) for k in keys]), None
                else:
                    shape = tuple(map(type, keys))
        meter.charge(cost)
        buffer.append((keys, env, projected, cost))
        if len(buffer) == SORT_RUN:
            runs.append(_sorted(buffer, descending))
            held, buffer = held + SORT_RUN, []
            if keep is not None and held >= 2 * keep + SORT_RUN:
                kept = list(islice(_merge(runs, descending, meter), keep))
                meter.release(
                    sum(e[_COST] for run in runs for e in run) - sum(e[_COST] for e in kept)
                )
                runs, held = [kept], len(kept)
    if buffer:
        runs.append(_sorted(buffer, descending))
    for entry in _merge(runs, descending, meter):
        yield entry[_ENV], entry[_PROJECTED]


# values that are their own sort key among values of their type (bool is not int here)
_SELF_KEYED = frozenset({int, str})


def _tagged(runs: list[list[_Sorted]], meter: Meter) -> list[list[_Sorted]]:
    """Runs whose keys are the values themselves with order_key's tuples instead: the same
    order, so sorted runs stay sorted."""
    return [
        [
            (tuple([order_key(k, meter) for k in keys]), env, projected, cost)
            for keys, env, projected, cost in run
        ]
        for run in runs
    ]


_keys = operator.itemgetter(_KEYS)  # an entry's sort keys, read in C by sort and merge


def _sorted(run: list[_Sorted], descending: list[bool]) -> list[_Sorted]:
    if not any(descending):  # the keys compared as one list: one stable sort
        run.sort(key=_keys)
        return run
    # one stable sort per key, least significant first: DESC flips one key, not the others
    for i in reversed(range(len(descending))):
        run.sort(key=lambda entry: entry[_KEYS][i], reverse=descending[i])
    return run


def _merge(runs: list[list[_Sorted]], descending: list[bool], meter: Meter) -> Iterator[_Sorted]:
    """The sorted runs as one order; heapq.merge takes equal keys from earlier runs first,
    so the sort stays stable."""
    if len(runs) == 1:
        yield from runs[0]
        return
    if sum(map(len, runs)) <= MERGE_BY_SORT:
        # a few runs: one more stable sort of them end to end merges them in C (it finds the
        # runs already in order), where heapq.merge takes a Python step per row
        meter.tick()
        yield from _sorted([entry for run in runs for entry in run], descending)
        return

    def key(entry: _Sorted) -> tuple[Any, ...]:
        return tuple(
            _Descending(k) if d else k for k, d in zip(entry[_KEYS], descending, strict=True)
        )

    merged = heapq.merge(*runs, key=key if any(descending) else _keys)
    for n, entry in enumerate(merged):
        if not n % SORT_RUN:
            meter.tick()
        yield entry


def _page_bounds(step: ProjectStep, compile: Compile) -> tuple[int, int | None]:
    """(first, one past the last) row of SKIP and LIMIT."""
    skip = _count(step.skip, "SKIP", compile)
    limit = _count(step.limit, "LIMIT", compile)
    # islice takes no more than sys.maxsize; a larger SKIP or LIMIT means "all" just the same
    start = min(skip or 0, sys.maxsize)
    return start, None if limit is None else min(start + limit, sys.maxsize)


def _count(expr: ast.Expr | None, clause: str, compile: Compile) -> int | None:
    if expr is None:
        return None
    value = compile(expr)({})
    if type(value) is not int or value < 0:
        got = repr(value) if type(value) is int else type_name(value)
        raise InvalidRequest(f"{clause} needs a non-negative integer, got {got}")
    return value


def _where(
    predicate: ast.Expr, rows: Iterator[Row], compile: Compile, meter: Meter
) -> Iterator[Row]:
    fn = compile(predicate)
    for row in rows:
        meter.tick()
        if truth(fn(row), "WHERE") is True:
            yield row

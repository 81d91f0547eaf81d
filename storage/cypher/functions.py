"""The functions a query may call: lookup tables of scalar functions and aggregates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from storage.cypher.bounds import SET_ENTRY_BYTES, SLOT_BYTES, Meter, checked, held_bytes
from storage.cypher.values import group_key, is_number, order_key, type_name
from storage.errors import InvalidRequest


class ScalarFunction(msgspec.Struct, frozen=True):
    """A function of one row: fn takes the evaluated arguments."""

    name: str
    min_args: int
    max_args: int | None  # None: any number from min_args up
    fn: Callable[..., Any]
    builds_string: bool = False  # its result is a new string, held to the query's bounds


class Aggregate:
    """Folds the values of one group into a result; nulls are skipped before add()."""

    def add(self, value: Any) -> None:
        """Take one non-null value."""
        raise NotImplementedError

    def result(self) -> Any:
        """The aggregate of the values taken so far."""
        raise NotImplementedError


class AggregateFunction(msgspec.Struct, frozen=True):
    """An aggregating function: make(meter) starts one accumulator per group."""

    name: str
    make: Callable[[Meter], Aggregate]


def _string_fn(name: str, fn: Callable[[str], Any]) -> Callable[[Any], Any]:
    def apply(value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, str):
            raise InvalidRequest(f"{name}() expects a string, got {type_name(value)}")
        return fn(value)

    return apply


def _size(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, str | list):
        raise InvalidRequest(f"size() expects a list or a string, got {type_name(value)}")
    return len(value)


def _coalesce(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


FUNCTIONS: dict[str, ScalarFunction] = {
    f.name.lower(): f
    for f in (
        ScalarFunction("size", 1, 1, _size),
        ScalarFunction("coalesce", 1, None, _coalesce),
        ScalarFunction("toLower", 1, 1, _string_fn("toLower", str.lower), builds_string=True),
        ScalarFunction("toUpper", 1, 1, _string_fn("toUpper", str.upper), builds_string=True),
    )
}


class _Count(Aggregate):
    def __init__(self, meter: Meter) -> None:
        self.n = 0

    def add(self, value: Any) -> None:
        self.n += 1

    def result(self) -> Any:
        return self.n


class _Collect(Aggregate):
    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.items: list[Any] = []

    def add(self, value: Any) -> None:
        self.meter.list_length(len(self.items) + 1)
        self.meter.charge(SLOT_BYTES + held_bytes(value))  # held until the end
        self.items.append(value)

    def result(self) -> Any:
        return self.items


class _Extreme(Aggregate):
    """min or max under the same global order ORDER BY uses."""

    def __init__(self, meter: Meter, sign: int) -> None:
        self.meter = meter
        self.sign = sign
        self.best: Any = None
        self.best_key: Any = None

    def add(self, value: Any) -> None:
        key = order_key(value, self.meter)
        if self.best_key is None or (key > self.best_key if self.sign > 0 else key < self.best_key):
            self.best, self.best_key = value, key

    def result(self) -> Any:
        return self.best


class _Sum(Aggregate):
    name = "sum"

    def __init__(self, meter: Meter) -> None:
        self.total: int | float = 0
        self.n = 0

    def add(self, value: Any) -> None:
        if not is_number(value):
            raise InvalidRequest(f"{self.name}() expects numbers, got {type_name(value)}")
        total = self.total + value
        if type(total) is int:
            total = self._checked(total, value)
        self.total = total
        self.n += 1

    def _checked(self, total: int, value: int) -> int:
        return checked(total, self.total, "+", value)

    def result(self) -> Any:
        return self.total


class _Avg(_Sum):
    name = "avg"

    def _checked(self, total: int, value: int) -> int:
        # the running total of an average is never shown, and the average is a float: it may
        # pass 64 bits (by a few bits per doubling of the row count, so it stays cheap)
        return total

    def result(self) -> Any:
        return self.total / self.n if self.n else None


class Distinct(Aggregate):
    """Passes each distinct value (by equivalence) once to the wrapped aggregate."""

    def __init__(self, inner: Aggregate, meter: Meter) -> None:
        self.inner = inner
        self.meter = meter
        self.seen: set[Any] = set()

    def add(self, value: Any) -> None:
        """Pass value on unless an equivalent one was passed before."""
        key = group_key(value, self.meter)
        if key not in self.seen:
            self.meter.charge(SET_ENTRY_BYTES + held_bytes(value))
            self.seen.add(key)
            self.inner.add(value)

    def result(self) -> Any:
        """The wrapped aggregate's result."""
        return self.inner.result()


AGGREGATES: dict[str, AggregateFunction] = {
    f.name: f
    for f in (
        AggregateFunction("count", _Count),
        AggregateFunction("collect", _Collect),
        AggregateFunction("min", lambda meter: _Extreme(meter, -1)),
        AggregateFunction("max", lambda meter: _Extreme(meter, 1)),
        AggregateFunction("sum", _Sum),
        AggregateFunction("avg", _Avg),
    )
}


def known_names() -> str:
    """Every function name, for the unknown-function message."""
    names = [f.name for f in FUNCTIONS.values()] + list(AGGREGATES)
    return ", ".join(sorted(names, key=str.lower))


def check_call(name: str, nargs: int, *, distinct: bool, star: bool) -> str:
    """The lower-case name of a valid call; otherwise InvalidRequest naming the problem."""
    key = name.lower()
    if star:
        if key != "count":
            raise InvalidRequest(f"only count(*) takes *, not {name}(*)")
        return key
    if key in AGGREGATES:
        if nargs != 1:
            raise InvalidRequest(f"{name}() takes 1 argument, got {nargs}")
        return key
    fn = FUNCTIONS.get(key)
    if fn is None:
        raise InvalidRequest(f"unknown function {name}(); the functions are {known_names()}")
    if distinct:
        raise InvalidRequest(f"DISTINCT only applies inside an aggregate, not {name}()")
    if nargs < fn.min_args or (fn.max_args is not None and nargs > fn.max_args):
        raise InvalidRequest(f"{fn.name}() takes {_arity(fn)}, got {nargs}")
    return key


def _arity(fn: ScalarFunction) -> str:
    if fn.max_args is None:
        return f"at least {fn.min_args} argument" + ("s" if fn.min_args != 1 else "")
    return f"{fn.min_args} argument" + ("s" if fn.min_args != 1 else "")

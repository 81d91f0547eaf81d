"""Expression evaluation: AST expressions compiled to closures over a binding row, with
openCypher's null semantics (three-valued logic, null in -> null out)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from storage.cypher import ast
from storage.cypher.bounds import (
    INT_MIN,
    LIST_BYTES,
    SLOT_BYTES,
    UNMETERED,
    Meter,
    checked,
    strings_bytes,
)
from storage.cypher.functions import FUNCTIONS
from storage.cypher.graph import CORE_PROPERTIES, Node, Relationship
from storage.cypher.values import UNORDERED, compare, equals, is_number, type_name
from storage.errors import InvalidRequest

Row = dict[str, Any]
Fn = Callable[[Row], Any]


def compile_expr(expr: ast.Expr, params: dict[str, Any], meter: Meter = UNMETERED) -> Fn:
    """A function computing expr on a row; params are the query's (already checked) parameters,
    and what the function builds is held to meter's bounds."""
    return _COMPILERS[type(expr)](expr, params, meter)


def truth(value: Any, context: str) -> bool | None:
    """Value as WHERE, AND, OR, XOR or NOT read it; InvalidRequest unless it is a bool or null."""
    if value is None or type(value) is bool:
        return value
    raise InvalidRequest(f"{context} needs a boolean, got {type_name(value)}")


# ---- properties ---------------------------------------------------------------------------

_CORE = frozenset(CORE_PROPERTIES)


def node_property(node: Node, key: str) -> Any:
    """A node property: event_id, kind, ts, text, else a filterable property, else null."""
    if key == "kind":
        return node.kind
    record = node.record
    return getattr(record, key) if key in _CORE else record.filterable.get(key)


def read_property(subject: Any, key: str) -> Any:
    """`subject.key` for a node, a map, a relationship (no properties) or null."""
    if type(subject) is Node:
        return node_property(subject, key)
    if isinstance(subject, dict):
        return subject.get(key)
    if subject is None or isinstance(subject, Relationship):
        return None
    raise InvalidRequest(f"cannot read property {key!r} of {type_name(subject)}")


# ---- operators ----------------------------------------------------------------------------

# A binary operator built from its operands' functions and the query's meter.
Build = Callable[[Fn, Fn, Meter], Fn]
Op = Callable[[Any, Any, Meter], Any]


def _and(left: Fn, right: Fn, meter: Meter) -> Fn:
    def run(row: Row) -> Any:
        a = truth(left(row), "AND")
        if a is False:
            return False
        b = truth(right(row), "AND")
        if b is False:
            return False
        return None if a is None or b is None else True

    return run


def _or(left: Fn, right: Fn, meter: Meter) -> Fn:
    def run(row: Row) -> Any:
        a = truth(left(row), "OR")
        if a is True:
            return True
        b = truth(right(row), "OR")
        if b is True:
            return True
        return None if a is None or b is None else False

    return run


def _xor(left: Fn, right: Fn, meter: Meter) -> Fn:
    def run(row: Row) -> Any:
        a, b = truth(left(row), "XOR"), truth(right(row), "XOR")
        return None if a is None or b is None else a != b

    return run


def _strict(op: Op) -> Build:
    """A binary operator where a null on either side gives null."""

    def build(left: Fn, right: Fn, meter: Meter) -> Fn:
        def run(row: Row) -> Any:
            a, b = left(row), right(row)
            return None if a is None or b is None else op(a, b, meter)

        return run

    return build


def _ordering(test: Callable[[int], bool]) -> Op:
    def op(a: Any, b: Any, meter: Meter) -> Any:
        c = compare(a, b, meter)
        if c is None:
            return None
        return False if c == UNORDERED else test(c)

    return op


def _not_equals(a: Any, b: Any, meter: Meter) -> Any:
    same = equals(a, b, meter)
    return None if same is None else not same


# A haystack longer than this is searched in slices, looking at the clock between them.
_IN_SLICE = 4096


def _in(left: Fn, right: Fn, meter: Meter) -> Fn:
    def run(row: Row) -> Any:
        needle, haystack = left(row), right(row)
        if haystack is None:
            return None
        if not isinstance(haystack, list):
            raise InvalidRequest(f"IN needs a list on its right, got {type_name(haystack)}")
        if len(haystack) <= _IN_SLICE:
            return _contains(needle, haystack, meter)
        unknown = False
        for start in range(0, len(haystack), _IN_SLICE):
            meter.tick()
            found = _contains(needle, haystack[start : start + _IN_SLICE], meter)
            if found:
                return True
            unknown = unknown or found is None
        return None if unknown else False

    return run


def _contains(needle: Any, haystack: list[Any], meter: Meter) -> bool | None:
    unknown = False
    for item in haystack:
        same = equals(needle, item, meter)
        if same:
            return True
        unknown = unknown or same is None
    return None if unknown else False


def _string_test(test: Callable[[str, str], bool]) -> Op:
    def op(a: Any, b: Any, meter: Meter) -> Any:
        return test(a, b) if isinstance(a, str) and isinstance(b, str) else None

    return op


def _numeric(symbol: str, fn: Callable[[Any, Any], Any]) -> Op:
    """An arithmetic operator on numbers; an integer result must stay within 64 bits."""

    def op(a: Any, b: Any, meter: Meter) -> Any:
        if not (is_number(a) and is_number(b)):
            raise InvalidRequest(f"cannot apply {symbol} to {type_name(a)} and {type_name(b)}")
        result = fn(a, b)
        return checked(result, a, symbol, b) if type(result) is int else result

    return op


_plus_numbers = _numeric("+", lambda x, y: x + y)


def _add(a: Any, b: Any, meter: Meter) -> Any:
    # the size of a joined list or string is known before it is built: refused before it is
    if isinstance(a, list):
        meter.list_length(len(a) + (len(b) if isinstance(b, list) else 1))
        if isinstance(b, list):
            return meter.list(a + b)
        meter.charge(strings_bytes((b,)))
        return meter.list([*a, b])
    if isinstance(b, list):
        meter.list_length(len(b) + 1)
        meter.charge(strings_bytes((a,)))
        return meter.list([a, *b])
    if isinstance(a, str) and (isinstance(b, str) or is_number(b)):
        tail = b if isinstance(b, str) else str(b)
        meter.string_length(len(a) + len(tail))
        return meter.string(a + tail)
    if isinstance(b, str) and is_number(a):
        head = str(a)
        meter.string_length(len(head) + len(b))
        return meter.string(head + b)
    return _plus_numbers(a, b, meter)


def _divide(a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int:
        if b == 0:
            raise InvalidRequest("division by zero")
        q = abs(a) // abs(b)  # integer division truncates toward zero, as in openCypher
        return q if (a >= 0) == (b > 0) else -q
    if b == 0:
        return (
            math.nan
            if a == 0 or math.isnan(a)
            else math.copysign(math.inf, a) * math.copysign(1, b)
        )
    return a / b


def _modulo(a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int:
        if b == 0:
            raise InvalidRequest("division by zero")
        r = abs(a) % abs(b)  # the remainder takes the dividend's sign
        return r if a >= 0 else -r
    return math.nan if b == 0 else math.fmod(a, b)


def _power(a: Any, b: Any) -> Any:
    try:
        return math.pow(a, b)  # always a float, as in openCypher: no integer can grow here
    except OverflowError:
        return math.inf
    except ValueError:
        return math.nan


_BINARY: dict[str, Build] = {
    "AND": _and,
    "OR": _or,
    "XOR": _xor,
    "IN": _in,
    "=": _strict(equals),
    "<>": _strict(_not_equals),
    "<": _strict(_ordering(lambda c: c < 0)),
    "<=": _strict(_ordering(lambda c: c <= 0)),
    ">": _strict(_ordering(lambda c: c > 0)),
    ">=": _strict(_ordering(lambda c: c >= 0)),
    "STARTS WITH": _strict(_string_test(str.startswith)),
    "ENDS WITH": _strict(_string_test(str.endswith)),
    "CONTAINS": _strict(_string_test(lambda a, b: b in a)),
    "+": _strict(_add),
    "-": _strict(_numeric("-", lambda a, b: a - b)),
    "*": _strict(_numeric("*", lambda a, b: a * b)),
    "/": _strict(_numeric("/", _divide)),
    "%": _strict(_numeric("%", _modulo)),
    "^": _strict(_numeric("^", _power)),
}


def _negate(value: Any) -> Any:
    if not is_number(value):
        raise InvalidRequest(f"cannot negate {type_name(value)}")
    if value == INT_MIN and type(value) is int:
        raise InvalidRequest(f"integer overflow: -({value}) is outside the 64-bit integer range")
    return -value


def _plus(value: Any) -> Any:
    if not is_number(value):
        raise InvalidRequest(f"cannot apply unary + to {type_name(value)}")
    return value


def _not(value: Any) -> Any:
    b = truth(value, "NOT")
    return None if b is None else not b


_UNARY: dict[str, Callable[[Any], Any]] = {"NOT": _not, "-": _negate, "+": _plus}


# ---- subscripts -----------------------------------------------------------------------------


def _subscript(subject: Any, index: Any) -> Any:
    if subject is None or index is None:
        return None
    if isinstance(subject, list) and type(index) is int:
        return subject[index] if -len(subject) <= index < len(subject) else None
    if isinstance(subject, dict | Node) and isinstance(index, str):
        return read_property(subject, index)
    raise InvalidRequest(f"cannot index {type_name(subject)} with {type_name(index)}")


def _slice(subject: Any, start: Any, end: Any, meter: Meter) -> Any:
    if subject is None:
        return None
    if not isinstance(subject, list):
        raise InvalidRequest(f"cannot slice {type_name(subject)}")
    for bound in (start, end):
        if bound is not None and type(bound) is not int:
            raise InvalidRequest(f"list slice bounds must be integers, got {type_name(bound)}")
    return meter.list(subject[start:end])


# ---- compilers, one per node type -----------------------------------------------------------


def _literal(expr: ast.Literal, params: dict[str, Any], meter: Meter) -> Fn:
    value = expr.value
    return lambda row: value


def _parameter(expr: ast.Parameter, params: dict[str, Any], meter: Meter) -> Fn:
    value = params[expr.name]
    return lambda row: value


def _variable(expr: ast.Variable, params: dict[str, Any], meter: Meter) -> Fn:
    name = expr.name
    return lambda row: row.get(name)


def _property(expr: ast.Property, params: dict[str, Any], meter: Meter) -> Fn:
    key = expr.key
    if isinstance(expr.subject, ast.Variable):
        # `n.key`, most of what a query reads: one call per row, not three
        name, core = expr.subject.name, key in _CORE
        if key == "kind":  # read without decoding the rest of the record (graph.py, Node)

            def kind(row: Row) -> Any:
                value = row.get(name)
                return value.kind if type(value) is Node else read_property(value, key)

            return kind

        if core:

            def field(row: Row) -> Any:
                value = row.get(name)
                if type(value) is Node:
                    record = value._record  # the property's call, inline: one per row read
                    return getattr(record if record is not None else value.decode(), key)
                return read_property(value, key)

            return field

        def run(row: Row) -> Any:
            value = row.get(name)
            if type(value) is Node:
                record = value._record
                return (record if record is not None else value.decode()).filterable.get(key)
            return read_property(value, key)

        return run
    subject = compile_expr(expr.subject, params, meter)
    return lambda row: read_property(subject(row), key)


def _index(expr: ast.Index, params: dict[str, Any], meter: Meter) -> Fn:
    subject = compile_expr(expr.subject, params, meter)
    index = compile_expr(expr.index, params, meter)
    return lambda row: _subscript(subject(row), index(row))


def _slice_expr(expr: ast.Slice, params: dict[str, Any], meter: Meter) -> Fn:
    subject = compile_expr(expr.subject, params, meter)
    start = compile_expr(expr.start, params, meter) if expr.start is not None else _none
    end = compile_expr(expr.end, params, meter) if expr.end is not None else _none
    bounded = (expr.start is not None, expr.end is not None)

    def run(row: Row) -> Any:
        lo, hi = start(row), end(row)
        if (bounded[0] and lo is None) or (bounded[1] and hi is None):
            return None  # an explicit null bound makes the whole slice null
        return _slice(subject(row), lo, hi, meter)

    return run


def _none(row: Row) -> None:
    return None


def _list(expr: ast.ListExpr, params: dict[str, Any], meter: Meter) -> Fn:
    literals = [item.value for item in expr.items if isinstance(item, ast.Literal)]
    if len(literals) == len(expr.items):
        # built once per query, not once per row: no value is ever changed in place
        value = meter.list(literals)
        return lambda row: value
    items = [compile_expr(item, params, meter) for item in expr.items]

    def run(row: Row) -> Any:
        value = meter.list([item(row) for item in items])
        meter.charge(strings_bytes(value))
        return value

    return run


def _map(expr: ast.MapExpr, params: dict[str, Any], meter: Meter) -> Fn:
    entries = [(key, compile_expr(value, params, meter)) for key, value in expr.entries]
    cost = LIST_BYTES + 3 * SLOT_BYTES * len(entries)

    def run(row: Row) -> Any:
        value = {key: value(row) for key, value in entries}
        meter.charge(cost + strings_bytes(value.values()))
        return value

    return run


def _unary(expr: ast.Unary, params: dict[str, Any], meter: Meter) -> Fn:
    operand, op = compile_expr(expr.operand, params, meter), _UNARY[expr.op]
    if expr.op == "NOT":
        return lambda row: op(operand(row))
    return lambda row: (lambda v: None if v is None else op(v))(operand(row))


def _binary(expr: ast.Binary, params: dict[str, Any], meter: Meter) -> Fn:
    left = compile_expr(expr.left, params, meter)
    if expr.op == "=" and isinstance(expr.right, ast.Literal | ast.Parameter):
        constant = compile_expr(expr.right, params, meter)({})
        if type(constant) is str:
            return _equals_string(left, constant)
    return _BINARY[expr.op](left, compile_expr(expr.right, params, meter), meter)


def _equals_string(left: Fn, constant: str) -> Fn:
    """`x = 'text'` (what most filters are) as equals would give it, in one call per row."""

    def run(row: Row) -> Any:
        value = left(row)
        if value is None:
            return None
        return value == constant if type(value) is str else False

    return run


def _is_null(expr: ast.IsNull, params: dict[str, Any], meter: Meter) -> Fn:
    operand = compile_expr(expr.operand, params, meter)
    if expr.negated:
        return lambda row: operand(row) is not None
    return lambda row: operand(row) is None


def _call(expr: ast.FunctionCall, params: dict[str, Any], meter: Meter) -> Fn:
    fn = FUNCTIONS.get(expr.name)
    if fn is None:  # aggregates are replaced by the planner before anything is compiled
        raise AssertionError(f"{expr.name}() reached the evaluator unplanned")
    args = [compile_expr(arg, params, meter) for arg in expr.args]
    impl = fn.fn
    if fn.builds_string:

        def built(row: Row) -> Any:
            value = impl(*[arg(row) for arg in args])
            return value if value is None else meter.string(value)

        return built
    return lambda row: impl(*[arg(row) for arg in args])


_COMPILERS: dict[type, Callable[[Any, dict[str, Any], Meter], Fn]] = {
    ast.Literal: _literal,
    ast.Parameter: _parameter,
    ast.Variable: _variable,
    ast.Property: _property,
    ast.Index: _index,
    ast.Slice: _slice_expr,
    ast.ListExpr: _list,
    ast.MapExpr: _map,
    ast.Unary: _unary,
    ast.Binary: _binary,
    ast.IsNull: _is_null,
    ast.FunctionCall: _call,
}

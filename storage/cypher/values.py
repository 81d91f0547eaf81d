"""Cypher values: equality, comparison, sort order, grouping keys and JSON rendering."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from storage.cypher.bounds import (
    LIST_BYTES,
    MAX_VALUE_DEPTH,
    SLOT_BYTES,
    TOO_DEEP,
    UNMETERED,
    Meter,
    node_bytes,
    node_json,
)
from storage.cypher.graph import Node, Relationship
from storage.errors import InvalidRequest

# compare() answers this when either side is NaN: every ordering comparison is then false.
UNORDERED = 2


def is_number(value: Any) -> bool:
    """Whether value is a Cypher number (bool is not, although Python says it is an int)."""
    return type(value) in (int, float)


def type_name(value: Any) -> str:
    """The Cypher type of value, for error messages."""
    return _TYPE_NAMES.get(type(value), type(value).__name__)


_TYPE_NAMES: dict[type, str] = {
    type(None): "null",
    bool: "a boolean",
    int: "an integer",
    float: "a float",
    str: "a string",
    list: "a list",
    dict: "a map",
    Node: "a node",
    Relationship: "a relationship",
}


def equals(a: Any, b: Any, meter: Meter = UNMETERED, depth: int = 0) -> bool | None:
    """`a = b` under three-valued logic: None when the answer depends on a null."""
    if a is None or b is None:
        return None
    if is_number(a) and is_number(b):
        return bool(a == b)
    if type(a) is not type(b):
        return False
    same = _EQUALS.get(type(a))
    return bool(a == b) if same is None else same(a, b, meter, depth)


def _enter(meter: Meter, depth: int, elements: int) -> int:
    """The depth one list or map further in; refused past MAX_VALUE_DEPTH, and the walk
    accounted so a long one looks at the clock."""
    if depth >= MAX_VALUE_DEPTH:
        raise InvalidRequest(TOO_DEEP)
    meter.walk(elements, start=not depth)
    return depth + 1


def _all_equal(pairs: Any, meter: Meter, depth: int) -> bool | None:
    unknown = False
    for x, y in pairs:
        same = equals(x, y, meter, depth)
        if same is False:
            return False
        unknown = unknown or same is None
    return None if unknown else True


def _list_equals(a: list[Any], b: list[Any], meter: Meter, depth: int) -> bool | None:
    if len(a) != len(b):
        return False
    return _all_equal(zip(a, b, strict=True), meter, _enter(meter, depth, len(a)))


def _map_equals(a: dict[str, Any], b: dict[str, Any], meter: Meter, depth: int) -> bool | None:
    if a.keys() != b.keys():
        return False
    return _all_equal(((a[k], b[k]) for k in a), meter, _enter(meter, depth, len(a)))


_EQUALS: dict[type, Callable[[Any, Any, Meter, int], bool | None]] = {
    list: _list_equals,
    dict: _map_equals,
    Node: lambda a, b, meter, depth: a.raw_id == b.raw_id,
}


def compare(a: Any, b: Any, meter: Meter = UNMETERED, depth: int = 0) -> int | None:
    """-1, 0 or 1 for comparable values, UNORDERED when NaN is involved, None otherwise."""
    if a is None or b is None:
        return None
    if is_number(a) and is_number(b):
        if math.isnan(a) or math.isnan(b):
            return UNORDERED
        return int((a > b) - (a < b))
    if type(a) is not type(b) or type(a) not in _COMPARABLE:
        return None
    if type(a) is list:
        return _compare_lists(a, b, meter, depth)
    return int((a > b) - (a < b))


_COMPARABLE = (str, bool, list)


def _compare_lists(a: list[Any], b: list[Any], meter: Meter, depth: int) -> int | None:
    inner = _enter(meter, depth, min(len(a), len(b)))
    for x, y in zip(a, b, strict=False):
        c = compare(x, y, meter, inner)
        if c != 0:
            return c
    return (len(a) > len(b)) - (len(a) < len(b))


# Keys are flat tuples, one per list or map (a tag, then the elements' keys), and a scalar's
# group key is the scalar itself where that is unambiguous: sorting and grouping many rows
# then allocates few objects for the garbage collector to walk.


def order_key(value: Any, meter: Meter = UNMETERED, depth: int = 0) -> tuple[Any, ...]:
    """A sort key giving openCypher's global order: maps, nodes, relationships, lists, strings,
    booleans, numbers (NaN last), then null."""
    if is_number(value):
        return (7, 1, 0) if math.isnan(value) else (7, 0, value)
    return _ORDER_KEYS[type(value)](value, meter, depth)


def _map_order(value: dict[str, Any], meter: Meter, depth: int) -> tuple[Any, ...]:
    inner = _built_key(meter, depth, len(value))
    return (0, *sorted((k, order_key(x, meter, inner)) for k, x in value.items()))


def _list_order(value: list[Any], meter: Meter, depth: int) -> tuple[Any, ...]:
    # (3, k1, k2, ...) orders as (3, (k1, k2, ...)) would: element by element, then shorter first
    inner = _built_key(meter, depth, len(value))
    return (3, *[order_key(x, meter, inner) for x in value])


def _built_key(meter: Meter, depth: int, elements: int) -> int:
    """_enter for a walk that builds a key of this many elements, which the query holds."""
    meter.charge(LIST_BYTES + SLOT_BYTES * elements)
    return _enter(meter, depth, elements)


_ORDER_KEYS: dict[type, Callable[[Any, Meter, int], tuple[Any, ...]]] = {
    dict: _map_order,
    Node: lambda v, meter, depth: (1, v.seq),
    # raw ids sort as their text does (lowercase hex, dashes in fixed places)
    Relationship: lambda v, meter, depth: (2, v.start_raw, v.type, v.end_raw),
    list: _list_order,
    str: lambda v, meter, depth: (5, v),
    bool: lambda v, meter, depth: (6, v),
    type(None): lambda v, meter, depth: (9,),
}

_NULL_KEY, _NAN_KEY, _TRUE_KEY, _FALSE_KEY = ("null",), ("nan",), ("b", True), ("b", False)


def group_key(value: Any, meter: Meter = UNMETERED, depth: int = 0) -> Any:
    """A hashable key under which equivalent values (grouping, DISTINCT) coincide; null == null."""
    if is_number(value):
        return _NAN_KEY if math.isnan(value) else value  # 1 and 1.0 hash and compare alike
    return _GROUP_KEYS[type(value)](value, meter, depth)


def _list_group(value: list[Any], meter: Meter, depth: int) -> Any:
    inner = _built_key(meter, depth, len(value))
    return ("l", *[group_key(x, meter, inner) for x in value])


def _map_group(value: dict[str, Any], meter: Meter, depth: int) -> Any:
    inner = _built_key(meter, depth, len(value))
    return ("m", *sorted((k, group_key(x, meter, inner)) for k, x in value.items()))


# A string is its own key (no other key is a string); booleans are tagged, as True == 1.
_GROUP_KEYS: dict[type, Callable[[Any, Meter, int], Any]] = {
    type(None): lambda v, meter, depth: _NULL_KEY,
    bool: lambda v, meter, depth: _TRUE_KEY if v else _FALSE_KEY,
    str: lambda v, meter, depth: v,
    list: _list_group,
    dict: _map_group,
    Node: lambda v, meter, depth: ("node", v.raw_id),
    Relationship: lambda v, meter, depth: ("rel", v.start_raw, v.type, v.end_raw),
}


def to_json(value: Any, meter: Meter = UNMETERED, depth: int = 0) -> Any:
    """Value as it goes into a result row: nodes as event objects, everything JSON-ready.
    What it renders is charged to meter: the result is memory the query holds."""
    render = _RENDER.get(type(value))
    return value if render is None else render(value, meter, depth)


def _render_node(value: Node, meter: Meter, depth: int) -> Any:
    meter.render(*node_json(value))
    meter.charge(node_bytes(value))  # the object is built beside the node
    return value.event().to_object()


def _render_string(value: str, meter: Meter, depth: int) -> str:
    meter.render(SLOT_BYTES + len(value))  # about what the answer's JSON will carry
    return value


def _render_list(value: list[Any], meter: Meter, depth: int) -> list[Any]:
    meter.render(LIST_BYTES + SLOT_BYTES * len(value), len(value))
    inner = _enter(meter, depth, len(value))
    return [to_json(x, meter, inner) for x in value]


def _render_map(value: dict[str, Any], meter: Meter, depth: int) -> dict[str, Any]:
    meter.render(LIST_BYTES + 3 * SLOT_BYTES * len(value), len(value))
    inner = _enter(meter, depth, len(value))
    return {k: to_json(x, meter, inner) for k, x in value.items()}


_RENDER: dict[type, Callable[[Any, Meter, int], Any]] = {
    Node: _render_node,
    Relationship: lambda v, meter, depth: v.to_object(),
    str: _render_string,
    list: _render_list,
    dict: _render_map,
    float: lambda v, meter, depth: None if math.isnan(v) or math.isinf(v) else v,  # not JSON
}

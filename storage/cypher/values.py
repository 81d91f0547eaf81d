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
)
from storage.cypher.graph import Relationship
from storage.errors import InvalidRequest
from storage.model import StoredEvent

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
    StoredEvent: "a node",
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
    meter.walk(elements)
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
    StoredEvent: lambda a, b, meter, depth: a.event_id == b.event_id,
}


def compare(a: Any, b: Any, meter: Meter = UNMETERED, depth: int = 0) -> int | None:
    """-1, 0 or 1 for comparable values, UNORDERED when NaN is involved, None otherwise."""
    if a is None or b is None:
        return None
    if is_number(a) and is_number(b):
        if math.isnan(a) or math.isnan(b):
            return UNORDERED
        return (a > b) - (a < b)
    if type(a) is not type(b) or type(a) not in _COMPARABLE:
        return None
    if type(a) is list:
        return _compare_lists(a, b, meter, depth)
    return (a > b) - (a < b)


_COMPARABLE = (str, bool, list)


def _compare_lists(a: list[Any], b: list[Any], meter: Meter, depth: int) -> int | None:
    inner = _enter(meter, depth, min(len(a), len(b)))
    for x, y in zip(a, b, strict=False):
        c = compare(x, y, meter, inner)
        if c != 0:
            return c
    return (len(a) > len(b)) - (len(a) < len(b))


def order_key(value: Any, meter: Meter = UNMETERED, depth: int = 0) -> tuple[Any, ...]:
    """A sort key giving openCypher's global order: maps, nodes, relationships, lists, strings,
    booleans, numbers (NaN last), then null."""
    if is_number(value):
        return (7, (1, 0) if math.isnan(value) else (0, value))
    return _ORDER_KEYS[type(value)](value, meter, depth)


def _map_order(value: dict[str, Any], meter: Meter, depth: int) -> tuple[Any, ...]:
    inner = _built_key(meter, depth, len(value))
    return (0, tuple(sorted((k, order_key(x, meter, inner)) for k, x in value.items())))


def _list_order(value: list[Any], meter: Meter, depth: int) -> tuple[Any, ...]:
    inner = _built_key(meter, depth, len(value))
    return (3, tuple(order_key(x, meter, inner) for x in value))


def _built_key(meter: Meter, depth: int, elements: int) -> int:
    """_enter for a walk that builds a key of this many elements, which the query holds."""
    meter.charge(LIST_BYTES + 4 * SLOT_BYTES * elements)
    return _enter(meter, depth, elements)


_ORDER_KEYS: dict[type, Callable[[Any, Meter, int], tuple[Any, ...]]] = {
    dict: _map_order,
    StoredEvent: lambda v, meter, depth: (1, v.seq),
    Relationship: lambda v, meter, depth: (2, v.start, v.type, v.end),
    list: _list_order,
    str: lambda v, meter, depth: (5, v),
    bool: lambda v, meter, depth: (6, v),
    type(None): lambda v, meter, depth: (9,),
}


def group_key(value: Any, meter: Meter = UNMETERED, depth: int = 0) -> Any:
    """A hashable key under which equivalent values (grouping, DISTINCT) coincide; null == null."""
    if is_number(value):
        return ("nan",) if math.isnan(value) else ("n", value)  # 1 and 1.0 hash alike
    return _GROUP_KEYS[type(value)](value, meter, depth)


def _list_group(value: list[Any], meter: Meter, depth: int) -> Any:
    inner = _built_key(meter, depth, len(value))
    return ("l", tuple(group_key(x, meter, inner) for x in value))


def _map_group(value: dict[str, Any], meter: Meter, depth: int) -> Any:
    inner = _built_key(meter, depth, len(value))
    return ("m", tuple(sorted((k, group_key(x, meter, inner)) for k, x in value.items())))


_GROUP_KEYS: dict[type, Callable[[Any, Meter, int], Any]] = {
    type(None): lambda v, meter, depth: ("null",),
    bool: lambda v, meter, depth: ("b", v),
    str: lambda v, meter, depth: ("s", v),
    list: _list_group,
    dict: _map_group,
    StoredEvent: lambda v, meter, depth: ("node", v.event_id),
    Relationship: lambda v, meter, depth: ("rel", v.start, v.type, v.end),
}


def to_json(value: Any, meter: Meter = UNMETERED, depth: int = 0) -> Any:
    """value as it goes into a result row: nodes as event objects, everything JSON-ready.
    What it renders is charged to meter: the result is memory the query holds."""
    render = _RENDER.get(type(value))
    return value if render is None else render(value, meter, depth)


def _render_node(value: StoredEvent, meter: Meter, depth: int) -> Any:
    meter.charge(node_bytes(value))
    return value.to_object()


def _render_string(value: str, meter: Meter, depth: int) -> str:
    meter.charge(SLOT_BYTES + len(value))  # what the answer's JSON will carry
    return value


def _render_list(value: list[Any], meter: Meter, depth: int) -> list[Any]:
    meter.charge(LIST_BYTES + SLOT_BYTES * len(value))
    inner = _enter(meter, depth, len(value))
    return [to_json(x, meter, inner) for x in value]


def _render_map(value: dict[str, Any], meter: Meter, depth: int) -> dict[str, Any]:
    meter.charge(LIST_BYTES + 3 * SLOT_BYTES * len(value))
    inner = _enter(meter, depth, len(value))
    return {k: to_json(x, meter, inner) for k, x in value.items()}


_RENDER: dict[type, Callable[[Any, Meter, int], Any]] = {
    StoredEvent: _render_node,
    Relationship: lambda v, meter, depth: v.to_object(),
    str: _render_string,
    list: _render_list,
    dict: _render_map,
    float: lambda v, meter, depth: None if math.isnan(v) or math.isinf(v) else v,  # not JSON
}

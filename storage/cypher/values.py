"""Cypher values: equality, comparison, sort order, grouping keys and JSON rendering."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from storage.cypher.graph import Relationship
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


def equals(a: Any, b: Any) -> bool | None:
    """`a = b` under three-valued logic: None when the answer depends on a null."""
    if a is None or b is None:
        return None
    if is_number(a) and is_number(b):
        return bool(a == b)
    if type(a) is not type(b):
        return False
    return _EQUALS.get(type(a), _plain_equals)(a, b)


def _plain_equals(a: Any, b: Any) -> bool:
    return bool(a == b)


def _all_equal(pairs: Any) -> bool | None:
    unknown = False
    for x, y in pairs:
        same = equals(x, y)
        if same is False:
            return False
        unknown = unknown or same is None
    return None if unknown else True


def _list_equals(a: list[Any], b: list[Any]) -> bool | None:
    return False if len(a) != len(b) else _all_equal(zip(a, b, strict=True))


def _map_equals(a: dict[str, Any], b: dict[str, Any]) -> bool | None:
    return False if a.keys() != b.keys() else _all_equal((a[k], b[k]) for k in a)


_EQUALS: dict[type, Callable[[Any, Any], bool | None]] = {
    list: _list_equals,
    dict: _map_equals,
    StoredEvent: lambda a, b: a.event_id == b.event_id,
}


def compare(a: Any, b: Any) -> int | None:
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
        return _compare_lists(a, b)
    return (a > b) - (a < b)


_COMPARABLE = (str, bool, list)


def _compare_lists(a: list[Any], b: list[Any]) -> int | None:
    for x, y in zip(a, b, strict=False):
        c = compare(x, y)
        if c != 0:
            return c
    return (len(a) > len(b)) - (len(a) < len(b))


def order_key(value: Any) -> tuple[Any, ...]:
    """A sort key giving openCypher's global order: maps, nodes, relationships, lists, strings,
    booleans, numbers (NaN last), then null."""
    if is_number(value):
        return (7, (1, 0) if math.isnan(value) else (0, value))
    return _ORDER_KEYS[type(value)](value)


_ORDER_KEYS: dict[type, Callable[[Any], tuple[Any, ...]]] = {
    dict: lambda v: (0, tuple(sorted((k, order_key(x)) for k, x in v.items()))),
    StoredEvent: lambda v: (1, v.seq),
    Relationship: lambda v: (2, v.start, v.type, v.end),
    list: lambda v: (3, tuple(order_key(x) for x in v)),
    str: lambda v: (5, v),
    bool: lambda v: (6, v),
    type(None): lambda v: (9,),
}


def group_key(value: Any) -> Any:
    """A hashable key under which equivalent values (grouping, DISTINCT) coincide; null == null."""
    if is_number(value):
        return ("nan",) if math.isnan(value) else ("n", value)  # 1 and 1.0 hash alike
    return _GROUP_KEYS[type(value)](value)


_GROUP_KEYS: dict[type, Callable[[Any], Any]] = {
    type(None): lambda v: ("null",),
    bool: lambda v: ("b", v),
    str: lambda v: ("s", v),
    list: lambda v: ("l", tuple(group_key(x) for x in v)),
    dict: lambda v: ("m", tuple(sorted((k, group_key(x)) for k, x in v.items()))),
    StoredEvent: lambda v: ("node", v.event_id),
    Relationship: lambda v: ("rel", v.start, v.type, v.end),
}


def to_json(value: Any) -> Any:
    """value as it goes into a result row: nodes as event objects, everything JSON-ready."""
    render = _RENDER.get(type(value))
    return value if render is None else render(value)


_RENDER: dict[type, Callable[[Any], Any]] = {
    StoredEvent: lambda v: v.to_object(),
    Relationship: lambda v: v.to_object(),
    list: lambda v: [to_json(x) for x in v],
    dict: lambda v: {k: to_json(x) for k, x in v.items()},
    float: lambda v: None if math.isnan(v) or math.isinf(v) else v,  # JSON has neither
}

"""A query's parameters as the engine accepts them: JSON values, the params object and what it
holds nested at most MAX_VALUE_DEPTH levels (as memspine/jsonbounds.py counts them at the HTTP
and MCP doors), integers within 64 bits, finite floats, strings and lists within the query's
limits. Every door (HTTP, MCP, a script calling storage) passes through here."""

from __future__ import annotations

import math
import sys
from typing import Any

from storage.cypher.bounds import (
    INT_MAX,
    INT_MIN,
    LIST_BYTES,
    MAX_VALUE_DEPTH,
    NUMBER_BYTES,
    SLOT_BYTES,
    Meter,
)
from storage.errors import InvalidRequest


def check_params(params: dict[str, Any], meter: Meter) -> None:
    """InvalidRequest naming the first parameter that is no acceptable value; what the
    parameters hold is charged to meter (the query holds them while it runs)."""
    if not isinstance(params, dict):
        raise InvalidRequest(f"params must be an object, got {type(params).__name__}")
    for name, value in params.items():
        problem = _problem(value, meter)
        if problem is not None:
            raise InvalidRequest(f"parameter ${name} {problem}")


def _problem(value: Any, meter: Meter) -> str | None:
    """What is wrong with one parameter's value, or None; iterative, as the value may be deep."""
    limits = meter.limits
    stack = [(value, 1)]  # the params object is the first level
    elements = 0
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is int:
            if not INT_MIN <= item <= INT_MAX:
                return "holds an integer outside the 64-bit range"
            meter.charge(NUMBER_BYTES)
        elif kind is float:
            if not math.isfinite(item):
                return "holds NaN or an infinity; numbers must be finite"
            meter.charge(NUMBER_BYTES)
        elif kind is str:
            if len(item) > limits.max_string:
                return f"holds a string longer than {limits.max_string} characters"
            meter.charge(sys.getsizeof(item))
        elif kind is list or kind is dict:
            if depth >= MAX_VALUE_DEPTH:
                return (
                    f"nests lists and maps too deep: params may nest at most {MAX_VALUE_DEPTH} "
                    "levels, the params object included"
                )
            elements += len(item)
            if elements > limits.max_list:
                return (
                    f"holds more than {limits.max_list} elements, "
                    "counting those of the lists and maps inside it"
                )
            if kind is dict and not all(type(k) is str for k in item):
                return "holds a map whose keys are not all strings"
            meter.step(len(item))
            meter.charge(LIST_BYTES + 3 * SLOT_BYTES * len(item))
            children = item.values() if kind is dict else item
            stack.extend((child, depth + 1) for child in children)
        elif item is not None and kind is not bool:
            return f"holds a {kind.__name__}, which is no JSON value"
    return None

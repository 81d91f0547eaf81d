"""What one query may use, and the Meter that holds it to that while it runs.

A query gets a deadline (parsing included), a budget of bytes for the values it builds and the
rows it holds, a longest string and list, and openCypher's 64-bit integers. Every bound is a
400 whose sentence names the bound. The Meter is checked by every operator per row, by the
walks over lists and maps (comparison, sort and grouping keys, rendering) every few thousand
elements, and by the parser every few dozen tokens, so no step between two checks can grow
with what the query asks for: each such step is one C call on a value no larger than the caps.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import msgspec

from storage.cypher.graph import Relationship
from storage.errors import InvalidRequest
from storage.model import StoredEvent

INT_MIN, INT_MAX = -(2**63), 2**63 - 1
# Lists and maps inside one value, params included: the walks over values recurse, and a
# value is rendered as JSON, which the server's encoder refuses to nest much deeper.
MAX_VALUE_DEPTH = 32
MAX_QUERY_CHARS = 20_000
TOO_DEEP = f"a value may nest lists and maps at most {MAX_VALUE_DEPTH} deep"

# How many elements a walk may visit between two looks at the clock.
_WALK_STEP = 2048
# Estimated bytes of what a query holds (CPython, 64-bit): a list of n is 56 + 8n, a number
# about 32, a decoded node its fixed fields plus its text and properties.
LIST_BYTES, SLOT_BYTES, NUMBER_BYTES, NODE_BYTES, RELATIONSHIP_BYTES = 56, 8, 32, 400, 200
SET_ENTRY_BYTES = 64  # a hash-set slot and its key tuple (DISTINCT, grouping)


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """The bounds of one query (memspine's settings fill them: docs/configuration.md)."""

    timeout_ms: int = 5000
    max_rows: int = 10_000
    max_bytes: int = 128 << 20
    max_string: int = 4 << 20  # characters
    max_list: int = 100_000  # elements


class Meter:
    """One query's clock and byte budget; every method raises InvalidRequest past a bound."""

    __slots__ = ("deadline", "limits", "spent", "_walked")

    def __init__(self, limits: Limits, *, clock: bool = True) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.timeout_ms / 1000 if clock else math.inf
        self.spent = 0
        self._walked = 0

    def tick(self) -> None:
        """InvalidRequest once the query has run past its time limit."""
        if time.monotonic() > self.deadline:
            raise InvalidRequest(
                f"query exceeded the {self.limits.timeout_ms} ms time limit; "
                "narrow it with an indexed predicate"
            )

    def walk(self, elements: int) -> None:
        """Account a walk over this many elements; looks at the clock every few thousand."""
        self._walked += elements
        if self._walked >= _WALK_STEP:
            self._walked = 0
            self.tick()

    def charge(self, nbytes: int) -> None:
        """Account bytes the query builds or holds (never given back, except release())."""
        self.spent += nbytes
        if self.spent > self.limits.max_bytes:
            raise InvalidRequest(
                f"query needed more than {_size(self.limits.max_bytes)} of memory; "
                "return less, or narrow it with an indexed predicate"
            )

    def release(self, nbytes: int) -> None:
        """Give back bytes charged for rows the query no longer holds (a sort's dropped rows)."""
        self.spent -= nbytes

    def string_length(self, length: int) -> None:
        """Refuse, before it is built, a string longer than the limit."""
        if length > self.limits.max_string:
            raise InvalidRequest(
                f"a string may have at most {self.limits.max_string} characters; "
                f"this one would have {length}"
            )

    def list_length(self, length: int) -> None:
        """Refuse, before it is built, a list longer than the limit."""
        if length > self.limits.max_list:
            raise InvalidRequest(
                f"a list may have at most {self.limits.max_list} elements; "
                f"this one would have {length}"
            )

    def string(self, value: str) -> str:
        """A string the query built: within the limit, and charged."""
        self.string_length(len(value))
        self.charge(sys.getsizeof(value))
        return value

    def list(self, value: list[Any]) -> list[Any]:
        """A list the query built: within the limit, and charged (its slots, not its items)."""
        self.list_length(len(value))
        self.charge(LIST_BYTES + SLOT_BYTES * len(value))
        return value


# For walks outside a query (tests, the planner's constant checks): no clock, no budget.
UNMETERED = Meter(
    Limits(timeout_ms=0, max_bytes=sys.maxsize, max_string=sys.maxsize, max_list=sys.maxsize),
    clock=False,
)


def checked(value: int, a: Any, op: str, b: Any) -> int:
    """An integer result of `a op b`, or InvalidRequest if it left the 64-bit range."""
    if INT_MIN <= value <= INT_MAX:
        return value
    raise InvalidRequest(f"integer overflow: {a} {op} {b} is outside the 64-bit integer range")


def node_bytes(node: StoredEvent) -> int:
    """About what a decoded node holds, text and properties included."""
    return NODE_BYTES + len(node.text or "") + len(node.properties_raw or b"")


def held_bytes(value: Any, meter: Meter, depth: int = 0) -> int:
    """About the bytes value holds, counting a list or map each time it appears (so a list
    made of one list twice counts twice, as every walk over it costs twice)."""
    kind = type(value)
    if kind is str:
        return sys.getsizeof(value)
    if kind is StoredEvent:
        return node_bytes(value)
    if kind is Relationship:
        return RELATIONSHIP_BYTES
    if kind is list:
        own, items = LIST_BYTES + SLOT_BYTES * len(value), value
    elif kind is dict:
        own, items = sys.getsizeof(value), value.values()
    else:
        return NUMBER_BYTES
    if depth >= MAX_VALUE_DEPTH:
        raise InvalidRequest(TOO_DEEP)
    meter.walk(len(value))
    return own + sum(held_bytes(item, meter, depth + 1) for item in items)


def row_bytes(row: dict[str, Any], meter: Meter) -> int:
    """About what holding a binding row costs: the dict and what its values hold."""
    return sys.getsizeof(row) + sum(held_bytes(v, meter) for v in row.values())


def _size(nbytes: int) -> str:
    """64 MiB, or the number of bytes when it is no whole number of MiB."""
    return f"{nbytes >> 20} MiB" if nbytes % (1 << 20) == 0 else f"{nbytes} bytes"

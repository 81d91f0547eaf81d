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
from collections.abc import Iterable
from typing import Any

import msgspec

from storage.cypher.graph import Node, Relationship
from storage.errors import InvalidRequest
from storage.heap import trim

INT_MIN, INT_MAX = -(2**63), 2**63 - 1
# Lists and maps inside one value, params included: the walks over values recurse, and a
# value is rendered as JSON, which the server's encoder refuses to nest much deeper.
MAX_VALUE_DEPTH = 32
MAX_QUERY_CHARS = 20_000
TOO_DEEP = f"a value may nest lists and maps at most {MAX_VALUE_DEPTH} deep"

# How many elements a walk may visit between two looks at the clock.
_WALK_STEP = 2048
# A query that charged this much gives the allocator's free memory back when it ends.
_TRIM_AFTER_BYTES = 4 << 20


# Estimated bytes of what a query holds (CPython, 64-bit): a list of n is 56 + 8n, a number
# about 32, a decoded node its fixed fields plus its text and properties.
LIST_BYTES, SLOT_BYTES, NUMBER_BYTES, RELATIONSHIP_BYTES = 56, 8, 32, 200
SET_ENTRY_BYTES = 64  # a hash-set slot and its key tuple (DISTINCT, grouping)
NODE_JSON_BYTES = 160  # an event object's id, kind, ts and keys as JSON


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """The bounds of one query (memspine's settings fill them: docs/configuration.md)."""

    timeout_ms: int = 5000
    max_rows: int = 10_000
    max_bytes: int = 64 << 20
    max_string: int = 4 << 20  # characters
    max_list: int = 100_000  # elements
    max_result_bytes: int = 32 << 20  # the answer as JSON, about


class Meter:
    """One query's clock and byte budget; every method raises InvalidRequest past a bound.
    The clock runs from `started` (time.monotonic(); now by default)."""

    __slots__ = ("_since_tick", "answer", "deadline", "limits", "row_values", "spent", "walked")

    def __init__(self, limits: Limits, *, clock: bool = True, started: float | None = None) -> None:
        self.limits = limits
        start = time.monotonic() if started is None else started
        self.deadline = start + limits.timeout_ms / 1000 if clock else math.inf
        self.spent = 0
        self.answer = 0  # bytes of the rendered result
        self.row_values = 0  # values in the result row being rendered
        self.walked = 0  # elements of the value being walked (see walk)
        self._since_tick = 0

    def tick(self) -> None:
        """InvalidRequest once the query has run past its time limit."""
        if time.monotonic() > self.deadline:
            raise InvalidRequest(
                f"query exceeded the {self.limits.timeout_ms} ms time limit; "
                "narrow it with an indexed predicate"
            )

    def walk(self, elements: int, *, start: bool = False) -> None:
        """Account this many more elements of one walk over a value (start: a new value).
        A value made of one list many times over is that many elements to every walk, so
        the walk, not only the list, is bounded; the clock is read every few thousand."""
        self.walked = elements if start else self.walked + elements
        if self.walked > self.limits.max_list:
            raise InvalidRequest(
                f"a value may hold at most {self.limits.max_list} elements, "
                "counting those of the lists and maps inside it"
            )
        self.step(elements)

    def step(self, elements: int) -> None:
        """Account this many elements of some loop; the clock is read every few thousand."""
        self._since_tick += elements
        if self._since_tick >= _WALK_STEP:
            self._since_tick = 0
            self.tick()

    def charge(self, nbytes: int) -> None:
        """Account bytes the query builds or holds (never given back, except release())."""
        self.spent += nbytes
        if self.spent > self.limits.max_bytes:
            raise InvalidRequest(
                f"query needed more than {_size(self.limits.max_bytes)} of memory; "
                "return less, or narrow it with an indexed predicate"
            )

    def render(self, nbytes: int, values: int = 1) -> None:
        """Account part of the answer: its bytes (memory too) and values in the current row.
        One row is encoded by one call of the JSON encoder, so its values are bounded."""
        self.answer += nbytes
        if self.answer > self.limits.max_result_bytes:
            raise InvalidRequest(
                f"the answer would be larger than {_size(self.limits.max_result_bytes)}; "
                "add LIMIT, or return fewer or smaller values"
            )
        self.row_values += values
        if self.row_values > self.limits.max_list:
            raise InvalidRequest(
                f"a row of the answer may hold at most {self.limits.max_list} values, "
                "counting those inside lists and maps"
            )
        self.charge(nbytes)

    def give_back(self) -> None:
        """After a query that built a lot: hand the allocator's free memory back to the OS.
        glibc keeps freed blocks of a thread's arena for reuse, so each read thread that
        ran a large query would keep its peak; malloc_trim returns the free pages (about a
        millisecond, without the interpreter lock: ctypes releases it around the call)."""
        if self.spent >= _TRIM_AFTER_BYTES:
            trim()

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
    Limits(
        timeout_ms=0,
        max_bytes=sys.maxsize,
        max_string=sys.maxsize,
        max_list=sys.maxsize,
        max_result_bytes=sys.maxsize,
    ),
    clock=False,
)


def checked(value: int, a: Any, op: str, b: Any) -> int:
    """An integer result of `a op b`, or InvalidRequest if it left the 64-bit range."""
    if INT_MIN <= value <= INT_MAX:
        return value
    raise InvalidRequest(f"integer overflow: {a} {op} {b} is outside the 64-bit integer range")


def node_bytes(node: Node) -> int:
    """About what a decoded node holds, text and properties included (the embedding as the
    floats it becomes when the node is returned)."""
    return node.size


def node_json(node: Node) -> tuple[int, int]:
    """About the bytes and the values a node adds to the answer, as an event object."""
    floats = node.floats()
    record = node.record
    size = (
        NODE_JSON_BYTES + len(record.text or "") + len(record.properties_raw or b"") + 20 * floats
    )
    return size, 8 + floats


# sys.getsizeof of a string or a dict, without its lookup of __sizeof__ (a tenth of the time,
# and a sort sizes every row it holds): a string is not tracked by the collector, so getsizeof
# adds nothing to __sizeof__; a dict is, so it adds the collector's header.
_str_bytes = str.__sizeof__
_dict_bytes = dict.__sizeof__
_GC_HEADER = sys.getsizeof({}) - _dict_bytes({})


def held_bytes(value: Any) -> int:
    """About the bytes that holding value keeps alive that were not charged yet: a string or a
    node read from the log. A list or map was charged, strings in it included, when the query
    built it (or took it as a parameter), and one list is often held by many rows."""
    kind = type(value)
    if kind is str:
        return _str_bytes(value)
    if kind is Node:
        return int(value.size)
    if kind is Relationship:
        return RELATIONSHIP_BYTES
    return NUMBER_BYTES


def strings_bytes(values: Iterable[Any]) -> int:
    """The bytes of the strings among values: a list or map built from a node's text holds
    it beyond the node."""
    return sum(sys.getsizeof(v) for v in values if type(v) is str)


def row_bytes(row: dict[str, Any]) -> int:
    """About what holding a binding row keeps alive: the dict and its values (held_bytes of
    each, inline: a sort charges every row it holds)."""
    return _dict_bytes(row) + _GC_HEADER + values_bytes(row.values())


def values_bytes(values: Iterable[Any]) -> int:
    """What row_bytes charges for a row's values, the dict aside."""
    total = 0
    for value in values:
        kind = type(value)
        if kind is str:
            total += _str_bytes(value)
        elif kind is Node:
            size = value._size  # the property's call, inline, for a node sized already
            total += size if size >= 0 else value.size
        else:
            total += RELATIONSHIP_BYTES if kind is Relationship else NUMBER_BYTES
    return total


def _size(nbytes: int) -> str:
    """64 MiB, or the number of bytes when it is no whole number of MiB."""
    return f"{nbytes >> 20} MiB" if nbytes % (1 << 20) == 0 else f"{nbytes} bytes"

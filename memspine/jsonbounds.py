"""Bounds on the JSON a client sends: nesting depth, read from the raw bytes before any decoder
recurses, and finite numbers in values another decoder already built (MCP arguments)."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from storage.errors import InvalidRequest

# Levels of objects and arrays a value inside a body may nest: `properties`, Cypher `params`,
# a tool's arguments. The body around them is one level more. msgspec, the SDK's JSON parser
# and the MCP clients all recurse per level (msgspec raises RecursionError near 1,000, the
# SDK's parser refuses 200 levels), so a stored value must stay far below what any reader of
# it can parse.
MAX_NESTING = 32
MAX_BODY_NESTING = MAX_NESTING + 1

NESTING_DETAIL = (
    f"JSON nested too deeply: properties, params and other values may nest at most "
    f"{MAX_NESTING} levels of objects and arrays"
)
NOT_FINITE = (
    "numbers must be finite (NaN, Infinity and values beyond ±1.8e308 are not JSON numbers)"
)

QUOTE, BACKSLASH = ord('"'), ord("\\")
CHUNK = 1 << 20  # bytes measured at once: bounds the scratch arrays whatever the body size
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


# The bytes that decide the depth: brackets, quotes, backslashes, and what may follow a
# backslash in JSON. Every other byte (digits, signs, commas, spaces, most letters: nearly all of
# an embedding's text) is dropped before the scan when no backslash is followed by one of them.
_KEPT = b'"\\/[]{}bfnrtu'
_DROPPED = bytes(b for b in range(256) if b not in _KEPT)
_BACKSLASH_BEFORE_DROPPED = re.compile(rb'\\[^"\\/bfnrtu]')


def nesting_exceeds(raw: bytes, limit: int) -> bool:
    """Whether raw JSON opens more than `limit` objects and arrays inside one another.

    Most bodies open fewer brackets in all than the limit, which two C-speed counts show;
    only the others are measured, on their skeleton.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    return max_depth(skeleton(raw)) > limit


def skeleton(raw: bytes) -> bytes:
    """Raw JSON less the bytes that cannot change its depth (max_depth of both is the same).

    A quote delimits a string by the run of backslashes right before it, and a dropped byte
    could join two runs or a run and a quote only if it followed a backslash: when one does,
    the bytes are kept whole (a batch of embeddings scans a tenth of its size otherwise).
    """
    if raw.find(b"\\") >= 0 and _BACKSLASH_BEFORE_DROPPED.search(raw):
        return raw
    return raw.translate(None, _DROPPED)


def max_depth(raw: bytes, chunk: int = CHUNK) -> int:
    """The deepest nesting of brackets outside strings, in vectorised passes (no per-byte Python).

    A quote delimits a string unless an odd run of backslashes precedes it; a bracket counts
    when an even number of delimiting quotes precedes it. Depth, string state and the run of
    backslashes carry from one chunk to the next.
    """
    depth = best = 0
    inside = 0  # 1 when the chunk starts inside a string
    run = 0  # backslashes just before the chunk
    for start in range(0, len(raw), chunk):
        codes = np.frombuffer(raw, dtype=np.uint8, count=min(chunk, len(raw) - start), offset=start)
        quotes = codes == QUOTE
        if run or raw.find(b"\\", start, start + len(codes)) >= 0:
            index = np.arange(len(codes), dtype=np.int32)
            # The position of the last byte that is not a backslash, at or before each byte;
            # the run carried in from the previous chunk ends just before position 0.
            plain = np.maximum.accumulate(np.where(codes == BACKSLASH, -run - 1, index))
            before = np.empty(len(codes), dtype=np.int32)
            before[0] = run
            before[1:] = index[1:] - 1 - plain[:-1]
            quotes &= before % 2 == 0
            run = int(len(codes) - 1 - plain[-1])
        in_string = (np.cumsum(quotes, dtype=np.int32) + inside) & 1
        steps = _STEP[codes]
        steps[in_string.astype(bool)] = 0
        levels = np.cumsum(steps, dtype=np.int32)
        best = max(best, depth + int(levels.max()))
        depth, inside = depth + int(levels[-1]), int(in_string[-1])
    return best


def check_body_nesting(raw: bytes) -> None:
    """400 for a request body nested deeper than its values may be."""
    if nesting_exceeds(raw, MAX_BODY_NESTING):
        raise InvalidRequest(NESTING_DETAIL)


def value_problem(value: Any, limit: int = MAX_BODY_NESTING) -> str | None:
    """What makes an already decoded JSON value unacceptable (too deep, a non-finite number), or None."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return NOT_FINITE
        elif isinstance(item, dict | list):
            if depth > limit:
                return NESTING_DETAIL
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return None

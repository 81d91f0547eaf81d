"""Byte encodings of LMDB keys: ids, order-preserving times and numbers, typed property values."""

from __future__ import annotations

import re
import struct
import uuid

from storage.model import FilterValue

_SIGN = 1 << 63
PROPERTY_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*\Z")  # \Z: "$" would accept a trailing newline
MAX_FILTERABLE = 16
MAX_FILTER_STRING_BYTES = 256
MAX_FILTER_NAME_BYTES = 128


def id_bytes(event_id: str) -> bytes:
    """The 16 raw bytes of a UUID string."""
    # Every lookup and scan step converts ids: the canonical form is read directly (twice as
    # fast as uuid.UUID); anything else, junk included, gets exactly uuid.UUID's answer.
    e = event_id
    if len(e) == 36 and e[8] == e[13] == e[18] == e[23] == "-":
        try:
            raw = bytes.fromhex(e[:8] + e[9:13] + e[14:18] + e[19:23] + e[24:])
        except ValueError:
            raw = b""
        if len(raw) == 16:  # 32 hex digits; fromhex skips spaces, so fewer bytes is not a UUID
            return raw
    return uuid.UUID(event_id).bytes


def id_str(raw: bytes) -> str:
    """The canonical UUID string of 16 raw bytes."""
    h = bytes(raw).hex()  # three times faster than str(uuid.UUID(bytes=raw)), same text
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def u64(n: int) -> bytes:
    """Big-endian unsigned 64-bit, so byte order is numeric order."""
    return struct.pack(">Q", n)


def read_u64(raw: bytes) -> int:
    """Inverse of u64."""
    return int(struct.unpack(">Q", bytes(raw[:8]))[0])


def ts_bytes(ts: int) -> bytes:
    """A signed microsecond time as 8 bytes that sort in time order."""
    return struct.pack(">Q", ts + _SIGN)


def read_ts(raw: bytes) -> int:
    """Inverse of ts_bytes."""
    return int(struct.unpack(">Q", bytes(raw[:8]))[0]) - _SIGN


def kind_prefix(kind: str) -> bytes:
    """The by_kind key prefix: length-prefixed so one kind never prefixes another."""
    raw = kind.encode()
    return len(raw).to_bytes(2, "big") + raw


def _number_bytes(x: float) -> bytes:
    """A float64 as 8 bytes that sort numerically (sign bit flipped, negatives inverted)."""
    (bits,) = struct.unpack(">Q", struct.pack(">d", float(x) + 0.0))  # + 0.0 folds -0.0 into 0.0
    bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits & _SIGN else bits | _SIGN
    return struct.pack(">Q", bits)


def value_bytes(value: FilterValue) -> bytes:
    """A filterable value with its type tag; 1 and 1.0 encode alike so equality is numeric."""
    if isinstance(value, bool):
        return b"b" + (b"\x01" if value else b"\x00")
    if isinstance(value, int | float):
        return b"n" + _number_bytes(value)
    raw = value.encode()
    return b"s" + struct.pack(">H", len(raw)) + raw


def property_prefix(name: str, value: FilterValue) -> bytes:
    """The key prefix under which every event with name == value is listed."""
    raw_name = name.encode()
    return bytes([len(raw_name)]) + raw_name + value_bytes(value)


def is_filterable_value(value: object) -> bool:
    """Whether a property value can be indexed: a boolean, a finite number or a short string."""
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, str):
        return len(value.encode()) <= MAX_FILTER_STRING_BYTES
    return False


def filterable_properties(properties: dict[str, object]) -> dict[str, FilterValue]:
    """The first 16 top-level properties, by sorted name, with a valid name and an indexable value."""
    picked: dict[str, FilterValue] = {}
    # Sorted names make the filterable set independent of how a client orders its JSON keys.
    for name in sorted(properties):
        if len(picked) == MAX_FILTERABLE:
            break
        value = properties[name]
        if _valid_name(name) and is_filterable_value(value):
            picked[name] = value  # type: ignore[assignment]
    return picked


_NAMES: dict[str, bool] = {}  # property names already judged: clients send the same few each time


def _valid_name(name: str) -> bool:
    """Whether a property name can be filtered on (PROPERTY_NAME, at most 128 bytes)."""
    ok = _NAMES.get(name)
    if ok is None:
        ok = bool(PROPERTY_NAME.match(name)) and len(name) <= MAX_FILTER_NAME_BYTES
        if len(_NAMES) >= 4096:  # bounded: names are client data
            _NAMES.clear()
        _NAMES[name] = ok
    return ok

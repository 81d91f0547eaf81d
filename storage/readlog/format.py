"""The read log's bytes: a header, then records of who read which events, in a hash chain.

A tenant's read log (`files.READS`) is one append-only file:

    header  MAGIC (8) | base seq (u64) | base chain value (32) | base ts (u64, µs)
    record  varint length | body
    body    link (4) | ts delta (zigzag varint, µs) | door+route (1, or 0xFF + str)
            | key id (tag) | request id (tag) | purpose (str) | event ids (16 each, to the end)

Records are numbered from base seq + 1. The chain value after record n is
H(n) = SHA-256(H(n-1) || body(n)); the base is H of the last record dropped by retention
(32 zero bytes before any). A record's link is the first 4 bytes of H(n-1), so a verify names
the first record that does not follow its predecessor; the full values are what the control
plane keeps (storage/readlog/verify.py). Timestamps are deltas from the record before (the
base ts for the first), so a 10-hit recall takes under 200 bytes.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import unicodedata
from collections.abc import Iterator
from typing import NamedTuple

import msgspec

from storage.errors import InvalidRequest
from storage.ids import ID_BYTES, id_bytes

MAGIC = b"MSREADS1"
_HEADER = struct.Struct(">8sQ32sQ")
HEADER_BYTES = _HEADER.size
ZERO_HASH = bytes(32)
LINK_BYTES = 4
MAX_STR = 255  # a key id, request id or purpose is at most this many bytes here
# Doors and routes seen most, one byte for both; anything else is spelled out after 0xFF.
ROUTES: tuple[tuple[str, str], ...] = (
    ("http", "/v1/memory/event/{event_id:str}"),
    ("http", "/v1/memory/events"),
    ("http", "/v1/memory/recall"),
    ("http", "/v1/memory/cypher"),
    ("http", "/v1/memory/export"),
    ("mcp", "memory_get"),
    ("mcp", "memory_list"),
    ("mcp", "memory_recall"),
    ("mcp", "memory_cypher"),
    ("bridge", "memory_get"),
    ("bridge", "memory_list"),
    ("bridge", "memory_recall"),
    ("bridge", "memory_cypher"),
    ("http", "/v1/memory/subjects/{subject:str}/export"),
)
_ROUTE_CODE = {pair: i for i, pair in enumerate(ROUTES)}
SPELLED = 0xFF
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_B62_INDEX = {c: i for i, c in enumerate(_B62)}
PACKED_KEY = 0  # tag: a 12-character base62 key id packed into 9 bytes
PACKED_HEX = 0  # tag: a 32-hex-digit request id packed into 16 bytes


MAX_PURPOSE_BYTES = 200
PURPOSE_HEADER = "Memspine-Purpose"


def check_purpose_text(value: str) -> str:
    """A read's purpose as given: at most 200 bytes (UTF-8), no control characters;
    InvalidRequest naming the header otherwise (every door checks it so, the CLI's
    --purpose too)."""
    if len(value.encode("utf-8", "surrogatepass")) > MAX_PURPOSE_BYTES:
        raise InvalidRequest(f"{PURPOSE_HEADER} may be at most {MAX_PURPOSE_BYTES} bytes")
    if any(unicodedata.category(ch) == "Cc" for ch in value):
        raise InvalidRequest(f"{PURPOSE_HEADER} must not contain control characters")
    return value


class ReadLogCorrupt(Exception):
    """The read log's bytes do not parse (a damaged or edited file)."""


class Read(msgspec.Struct, frozen=True, kw_only=True):
    """One read as the caller made it: when (µs), which key, through which door and route or
    tool, its request id, its purpose (None if none was given) and the ids of the events it
    returned."""

    ts: int
    key_id: str
    door: str
    route: str
    request_id: str
    purpose: str | None
    event_ids: list[str]


IDS_PER_RECORD = 4096  # a bigger answer (an export) is several records of one request


def records_of(
    ts: int,
    key_id: str,
    door: str,
    route: str,
    request_id: str,
    purpose: str | None,
    event_ids: list[str],
) -> list[Read]:
    """One read as its records: one per IDS_PER_RECORD ids, sharing everything else."""
    if len(event_ids) <= IDS_PER_RECORD:
        chunks = [event_ids]
    else:
        chunks = [
            event_ids[i : i + IDS_PER_RECORD] for i in range(0, len(event_ids), IDS_PER_RECORD)
        ]
    return [
        Read(
            ts=ts,
            key_id=key_id,
            door=door,
            route=route,
            request_id=request_id,
            purpose=purpose,
            event_ids=ids,
        )
        for ids in chunks
    ]


class Header(NamedTuple):
    """A read log's start: the seq and chain value of the last record before its first."""

    base_seq: int
    base_hash: bytes
    base_ts: int


def encode_header(h: Header) -> bytes:
    """The header's bytes."""
    return _HEADER.pack(MAGIC, h.base_seq, h.base_hash, h.base_ts)


def decode_header(raw: bytes) -> Header:
    """The header at the start of `raw`; ReadLogCorrupt if it is not one."""
    if len(raw) < HEADER_BYTES:
        raise ReadLogCorrupt("the read log is shorter than its header")
    magic, seq, base, ts = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise ReadLogCorrupt("the read log does not start with its magic bytes")
    return Header(seq, base, ts)


def chain(prev: bytes, body: bytes) -> bytes:
    """The chain value after a record: SHA-256 of the value before and the record's body."""
    return hashlib.sha256(prev + body).digest()


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint at buf[pos:] and the position after it."""
    n = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ReadLogCorrupt("a varint runs past its record")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7


def _str(text: str) -> bytes:
    raw = text.encode("utf-8")[:MAX_STR]
    return bytes([len(raw)]) + raw


@functools.lru_cache(maxsize=4096)  # a server sees few keys: each is packed once
def _key(key_id: str) -> bytes:
    if len(key_id) == 12 and all(c in _B62_INDEX for c in key_id):
        n = 0
        for c in key_id:
            n = n * 62 + _B62_INDEX[c]
        return bytes([PACKED_KEY]) + n.to_bytes(9, "big")
    return _str(key_id) if key_id else bytes([1, 0x2D])  # never an empty (packed) tag


def _request(request_id: str) -> bytes:
    if len(request_id) == 32:
        try:
            return bytes([PACKED_HEX]) + bytes.fromhex(request_id)
        except ValueError:
            pass
    return _str(request_id or "-")


@functools.lru_cache(maxsize=1024)
def _route(door: str, route: str) -> bytes:
    code = _ROUTE_CODE.get((door, route))
    return bytes([code]) if code is not None else bytes([SPELLED]) + _str(door) + _str(route)


def ids_bytes(event_ids: list[str]) -> bytes:
    """Event ids as 16 raw bytes each: canonical UUIDs (what answers carry) in one call."""
    try:
        raw = bytes.fromhex("".join(event_ids).replace("-", ""))
    except ValueError:
        raw = b""
    if len(raw) == ID_BYTES * len(event_ids) and all(len(e) == 36 for e in event_ids):
        return raw
    return b"".join(id_bytes(e) for e in event_ids)


def encode_body(read: Read, link: bytes, prev_ts: int) -> bytes:
    """A record's body (its event ids as given, 16 raw bytes each)."""
    delta = read.ts - prev_ts
    zigzag = delta << 1 if delta >= 0 else ((-delta) << 1) - 1
    route = _route(read.door, read.route)
    return b"".join(
        (
            link[:LINK_BYTES],
            _varint(zigzag),
            route,
            _key(read.key_id),
            _request(read.request_id),
            _str(read.purpose or ""),
            ids_bytes(read.event_ids),
        )
    )


def frame(body: bytes) -> bytes:
    """A record as the file holds it: its length, then its body."""
    return _varint(len(body)) + body


def _read_str(body: bytes, pos: int) -> tuple[str, int]:
    if pos >= len(body):
        raise ReadLogCorrupt("a field runs past its record")
    n = body[pos]
    end = pos + 1 + n
    if end > len(body):
        raise ReadLogCorrupt("a field runs past its record")
    try:
        return body[pos + 1 : end].decode("utf-8"), end
    except UnicodeDecodeError:
        raise ReadLogCorrupt("a field is not UTF-8") from None


def _read_tagged(body: bytes, pos: int, packed: int) -> tuple[str, int]:
    if pos >= len(body):
        raise ReadLogCorrupt("a field runs past its record")
    if body[pos] != 0:
        return _read_str(body, pos)
    end = pos + 1 + packed
    if end > len(body):
        raise ReadLogCorrupt("a field runs past its record")
    raw = body[pos + 1 : end]
    if packed == 16:
        return raw.hex(), end
    n = int.from_bytes(raw, "big")
    chars = []
    for _ in range(12):
        n, d = divmod(n, 62)
        chars.append(_B62[d])
    return "".join(reversed(chars)), end


def decode_body(body: bytes, prev_ts: int) -> Read:
    """A record's body as a Read; ReadLogCorrupt if it does not parse."""
    zigzag, pos = read_varint(body, LINK_BYTES)
    delta = zigzag >> 1 if not zigzag & 1 else -((zigzag + 1) >> 1)
    if pos >= len(body):
        raise ReadLogCorrupt("a record ends before its route")
    code = body[pos]
    pos += 1
    if code == SPELLED:
        door, pos = _read_str(body, pos)
        route, pos = _read_str(body, pos)
    elif code < len(ROUTES):
        door, route = ROUTES[code]
    else:
        raise ReadLogCorrupt("a record names an unknown route")
    key_id, pos = _read_tagged(body, pos, 9)
    request_id, pos = _read_tagged(body, pos, 16)
    purpose, pos = _read_str(body, pos)
    rest = len(body) - pos
    if rest % ID_BYTES:
        raise ReadLogCorrupt("a record's event ids are not whole")
    h = body[pos:].hex()  # one call for every id, then cut (id_str per id costs more)
    ids = [
        f"{h[i : i + 8]}-{h[i + 8 : i + 12]}-{h[i + 12 : i + 16]}-{h[i + 16 : i + 20]}-{h[i + 20 : i + 32]}"
        for i in range(0, len(h), 32)
    ]
    return Read(
        ts=prev_ts + delta,
        key_id=key_id,
        door=door,
        route=route,
        request_id=request_id,
        purpose=purpose or None,
        event_ids=ids,
    )


def check_body(body: bytes) -> str | None:
    """What is wrong with a record's shape (None: nothing), without decoding its fields: the
    verify's fast path over a million records (a changed byte is the hash chain's to find)."""
    try:
        pos = LINK_BYTES
        while body[pos] & 0x80:
            pos += 1
        code = body[pos + 1]
        pos += 2
        if code == SPELLED:
            pos += 1 + body[pos]
            pos += 1 + body[pos]
        elif code >= len(ROUTES):
            return "it names an unknown route"
        tag = body[pos]
        pos += 10 if tag == PACKED_KEY else 1 + tag
        tag = body[pos]
        pos += 17 if tag == PACKED_HEX else 1 + tag
        pos += 1 + body[pos]
    except IndexError:
        return "a field runs past its record"
    if pos > len(body) or (len(body) - pos) % ID_BYTES:
        return "its event ids are not whole"
    return None


def body_ts(body: bytes, prev_ts: int) -> int:
    """A record's time alone (µs), without decoding the rest."""
    zigzag, _ = read_varint(body, LINK_BYTES)
    return prev_ts + (zigzag >> 1 if not zigzag & 1 else -((zigzag + 1) >> 1))


class Frame(NamedTuple):
    """One record found in a file: its seq, where it starts, where it ends, its body."""

    seq: int
    start: int
    end: int
    body: bytes


def body_at(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Where the body of the record at pos starts and ends; an end past the buffer (or -1)
    for a record cut short (a write a crash interrupted)."""
    n = buf[pos]
    if n < 0x80:  # most records: a one- or two-byte length, read here
        return pos + 1, pos + 1 + n
    if pos + 1 < len(buf) and buf[pos + 1] < 0x80:
        return pos + 2, pos + 2 + ((n & 0x7F) | (buf[pos + 1] << 7))
    try:
        n, at = read_varint(buf, pos)
    except ReadLogCorrupt:
        return pos, -1
    return at, at + n


def frames(buf: bytes | memoryview, start: int, seq: int) -> Iterator[Frame]:
    """Every whole record of buf from `start` on, numbered from seq + 1; stops before a record
    cut short (a write a crash interrupted), which the caller may find by the last end."""
    size = len(buf)
    pos = start
    while pos < size:
        at, end = body_at(buf, pos)
        # A body is never shorter than its link: zeros where a crash left a size without its
        # data (no journal on the disk, the round journal not yet replayed) end the records.
        if not 0 <= end <= size or end - at < LINK_BYTES:
            return
        seq += 1
        yield Frame(seq, pos, end, bytes(buf[at:end]))
        pos = end

"""A tenant's export on the wire: NDJSON lines, versioned, with a trailer that counts and hashes.

One JSON object per line, each tagged by its "type":

1. `header`: the format's name and version, the tenant id, its embedding dimension and model,
   when the export was taken and how many events follow;
2. one `event` line per live event, in the order they were appended: every field of the
   stored record (storage/model.py's StoredEvent less `seq` and `filterable`, which the log
   derives), `properties` as the client sent them, byte for byte, and its links in their order;
3. one `idempotency` line per Idempotency-Key record of an event deleted since (ids and a
   hash, never content), so a retry of that append still replays after a move;
4. `end`: the counts of both and the SHA-256 of every byte before it.

docs/api.md ("Export format") is the description for people. FORMAT_VERSION names what is
written here; a reader takes every version from 1 to its own and refuses a later one. A new
version only adds: a line type or an optional field (with a default that means "absent", as
a file of an earlier version has it), so what an earlier version wrote still reads.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import msgspec

from storage.errors import InvalidRequest
from storage.model import (
    MAX_EMBEDDING_DIM,
    PlacedEvent,
    StoredEvent,
    check_event,
    check_ids,
    check_subjects,
)

FORMAT = "memspine-export"
# 2: the header's `vectors_by` (who makes the tenant's vectors: the server's are carried in the
# event lines like a client's, and an import keeps the tenant server-space).
# 3: an event line's `subjects` (the people the event is about), and `erased` lines (the
# tenant's erasure ledger, counted by the end line's `erased`) after the idempotency lines.
FORMAT_VERSION = 3
VECTORS_BY = ("server", "client")
MEDIA_TYPE = "application/x-ndjson"
# A line may hold a text of 100,000 characters (4 bytes each at most) and its embedding.
MAX_LINE_BYTES = 8 << 20
_DERIVED = ("seq", "filterable", "properties_raw")  # the log's own, or carried as `properties`
_LINE_BREAKS = (b"\n", b"\r")
_NULL = msgspec.Raw(b"null")  # msgspec reads no Raw | None: a Raw that says null instead
_RECORD = frozenset(StoredEvent.__struct_fields__) - frozenset(_DERIVED)  # carried as they are


class Header(msgspec.Struct, tag="header", tag_field="type", forbid_unknown_fields=True):
    """The first line."""

    format: str
    version: int
    tenant_id: str
    embedding_dim: int
    embedding_model: str | None
    exported_at: int
    events: int
    vectors_by: str | None = None  # VECTORS_BY; None: nobody yet (and every file of version 1)


class Links(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """An event's links to earlier events, each list in link order."""

    SOURCE_FROM: list[str] = []
    SUPERSEDES: list[str] = []


class Idempotency(msgspec.Struct, forbid_unknown_fields=True):
    """The record an Idempotency-Key left: the first body's SHA-256 and its unlinked ids."""

    body_hash: str
    unlinked: list[str] = []


def _field(f: msgspec.structs.FieldInfo) -> tuple[Any, ...]:
    """A StoredEvent field as an event line's field, default and all."""
    if f.default is not msgspec.NODEFAULT:
        return (f.name, f.type, f.default)
    if f.default_factory is not msgspec.NODEFAULT:
        return (f.name, f.type, msgspec.field(default_factory=f.default_factory))
    return (f.name, f.type)


# StoredEvent's own fields in its order, so a field added to the record is exported and imported
# without a change here (tests/test_transfer.py checks each one round-trips).
EventLine = msgspec.defstruct(
    "EventLine",
    [
        *(_field(f) for f in msgspec.structs.fields(StoredEvent) if f.name not in _DERIVED),
        ("properties", msgspec.Raw, _NULL),  # the bytes as sent; null: none were
        ("properties_text", str | None, None),  # the same, as a string, when they hold a line break
        ("links", Links, msgspec.field(default_factory=Links)),
        ("idempotency", Idempotency | None, None),
    ],
    kw_only=True,
    tag="event",
    tag_field="type",
    forbid_unknown_fields=True,
)


class IdempotencyLine(
    msgspec.Struct, tag="idempotency", tag_field="type", forbid_unknown_fields=True
):
    """The Idempotency-Key record of an event no longer live."""

    event_id: str
    body_hash: str
    unlinked: list[str] = []


class ErasedLine(msgspec.Struct, tag="erased", tag_field="type", forbid_unknown_fields=True):
    """An entry of the erasure ledger: an event deleted from the tenant, and when (version 3)."""

    event_id: str
    erased_at: int


class End(
    msgspec.Struct, tag="end", tag_field="type", forbid_unknown_fields=True, omit_defaults=True
):
    """The last line: what came before it, counted and hashed."""

    events: int
    idempotency: int
    sha256: str
    erased: int = 0  # ledger lines (version 3; absent when none)


_decode_line = msgspec.json.Decoder(Header | EventLine | IdempotencyLine | ErasedLine | End).decode
_encode = msgspec.json.Encoder().encode


def event_line(ev: StoredEvent, links: Links, idem: tuple[bytes, list[str]] | None) -> bytes:
    """The line of one live event (its newline included)."""
    fields = {f: getattr(ev, f) for f in _RECORD}
    fields["embedding"] = ev.embedding_out()
    raw = ev.properties_raw
    if raw is not None and any(b in raw for b in _LINE_BREAKS):
        fields["properties_text"] = raw.decode()  # JSON whitespace: a line must stay one line
    elif raw is not None:
        fields["properties"] = msgspec.Raw(raw)
    if idem is not None:
        fields["idempotency"] = Idempotency(body_hash=idem[0].hex(), unlinked=idem[1])
    return _encode(EventLine(links=links, **fields)) + b"\n"


def header_line(header: Header) -> bytes:
    """The header line."""
    return _encode(header) + b"\n"


def idempotency_line(event_id: str, body_hash: bytes, unlinked: list[str]) -> bytes:
    """The line of a deleted event's Idempotency-Key record."""
    return _encode(IdempotencyLine(event_id, body_hash.hex(), unlinked)) + b"\n"


def erased_line(event_id: str, erased_at: int) -> bytes:
    """The line of one erasure ledger entry."""
    return _encode(ErasedLine(event_id, erased_at)) + b"\n"


def end_line(events: int, idempotency: int, digest: str, erased: int = 0) -> bytes:
    """The trailer."""
    return _encode(End(events, idempotency, digest, erased)) + b"\n"


class Reader:
    """Checks an export line by line: each line is parsed and checked as it comes, the trailer
    against everything before it. Every refusal is InvalidRequest naming the line."""

    def __init__(self) -> None:
        self.header: Header | None = None
        self.end: End | None = None
        self.line = 0
        self.events = 0
        self.idempotency = 0
        self.erased = 0
        self._hash = hashlib.sha256()

    def feed(self, raw: bytes) -> PlacedEvent | IdempotencyLine | ErasedLine | Header | End:
        """One line as read (its newline included): what it holds, checked."""
        self.line += 1
        n = self.line
        if self.end is not None:
            raise InvalidRequest(f"line {n}: the file goes on after its end line")
        if not raw.endswith(b"\n"):
            raise InvalidRequest(f"line {n}: the file ends in the middle of a line (truncated)")
        if len(raw) > MAX_LINE_BYTES:
            raise InvalidRequest(f"line {n}: longer than {MAX_LINE_BYTES} bytes")
        try:
            value = _decode_line(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise InvalidRequest(f"line {n}: {_plain(str(exc))}") from None
        except RecursionError:
            raise InvalidRequest(f"line {n}: JSON nested too deeply") from None
        if isinstance(value, End):
            self._close(value)
            return value
        self._hash.update(raw)
        if isinstance(value, Header):
            return self._open(value)
        if self.header is None:
            raise InvalidRequest(f"line {n}: the file does not start with a header line")
        if isinstance(value, ErasedLine):
            _check_id(value.event_id, n, "event_id")
            if not 0 <= value.erased_at < 2**63:
                raise InvalidRequest(f"line {n}: erased_at must be microseconds from 0 to 2^63")
            self.erased += 1
            return value
        if self.erased:
            raise InvalidRequest(f"line {n}: a line after the erased lines")
        if isinstance(value, IdempotencyLine):
            _check_id(value.event_id, n, "event_id")
            self.idempotency += 1
            _body_hash(value.body_hash, n)
            return value
        if self.idempotency:
            raise InvalidRequest(f"line {n}: an event line after the idempotency lines")
        self.events += 1
        return placed(value, self.header, n)

    def finish(self) -> End:
        """At the end of the input: the trailer, or why the file is incomplete."""
        if self.end is None:
            where = f"after line {self.line}" if self.line else "at the start"
            raise InvalidRequest(f"the file ends {where} without its end line (truncated)")
        return self.end

    def _open(self, header: Header) -> Header:
        n = self.line
        if self.header is not None or n != 1:
            raise InvalidRequest(f"line {n}: a header line that is not the first line")
        if header.format != FORMAT:
            raise InvalidRequest(f"line {n}: not a memspine export (format {header.format!r})")
        if not 1 <= header.version <= FORMAT_VERSION:
            raise InvalidRequest(
                f"line {n}: export format version {header.version}; this version of memspine "
                f"reads versions 1 to {FORMAT_VERSION}"
            )
        if header.vectors_by is not None and header.vectors_by not in VECTORS_BY:
            raise InvalidRequest(
                f"line {n}: vectors_by must be one of {', '.join(VECTORS_BY)} or null"
            )
        if not 1 <= header.embedding_dim <= MAX_EMBEDDING_DIM:
            raise InvalidRequest(f"line {n}: embedding_dim must be from 1 to {MAX_EMBEDDING_DIM}")
        self.header = header
        return header

    def _close(self, end: End) -> None:
        n = self.line
        if self.header is None:
            raise InvalidRequest(f"line {n}: the file does not start with a header line")
        if (end.events, end.idempotency, end.erased) != (
            self.events,
            self.idempotency,
            self.erased,
        ):
            raise InvalidRequest(
                f"line {n}: the end line counts {end.events} events, {end.idempotency} "
                f"idempotency records and {end.erased} erased ids, the file holds {self.events}, "
                f"{self.idempotency} and {self.erased}"
            )
        if end.events != self.header.events:
            raise InvalidRequest(
                f"line {n}: the header announced {self.header.events} events, the file holds {end.events}"
            )
        if end.sha256 != self._hash.hexdigest():
            raise InvalidRequest(
                f"line {n}: the checksum does not match the lines before it: the file was "
                "changed or damaged after it was exported"
            )
        self.end = end


def placed(line: Any, header: Header, n: int) -> PlacedEvent:
    """An event line, checked by the event's rules (storage/model.py) as an append is, as the
    log's appender takes it (storage/log/appender.py)."""
    _check_id(line.event_id, n, "event_id")
    if line.embedding is not None and len(line.embedding) != header.embedding_dim:
        raise InvalidRequest(
            f"line {n}: the embedding has {len(line.embedding)} values, the header's "
            f"dimension is {header.embedding_dim}"
        )
    raw = _properties(line, n)
    try:
        check_subjects(line.subjects)
    except InvalidRequest as exc:
        raise InvalidRequest(f"line {n}: {exc.detail}") from None
    for target in (*line.links.SOURCE_FROM, *line.links.SUPERSEDES, *line.supersedes):
        _check_id(target, n, "a linked id")
    fields = {f: getattr(line, f) for f in _RECORD}
    try:
        check_event({**fields, "properties_raw": raw})
        check_ids(line.links.SOURCE_FROM, "its SOURCE_FROM links")
    except InvalidRequest as exc:
        raise InvalidRequest(f"line {n}: {exc.detail}") from None
    event = StoredEvent(seq=0, properties_raw=raw, **fields)
    idem = line.idempotency
    return PlacedEvent(
        event=event,
        sources=line.links.SOURCE_FROM,
        superseded=line.links.SUPERSEDES,
        body_hash=_body_hash(idem.body_hash, n) if idem is not None else None,
        unlinked=idem.unlinked if idem is not None else [],
        line=n,
    )


def _properties(line: Any, n: int) -> bytes | None:
    """The stored properties bytes of an event line (the rules check them: check_event)."""
    given = bytes(line.properties)
    if given != b"null" and line.properties_text is not None:
        raise InvalidRequest(f"line {n}: properties and properties_text are both given")
    text: str | None = line.properties_text
    return given if given != b"null" else text.encode() if text is not None else None


def _check_id(value: str, n: int, what: str) -> None:
    """An event id is a UUID in its canonical form (the form the log keeps)."""
    try:
        ok = str(uuid.UUID(value)) == value
    except ValueError:
        ok = False
    if not ok:
        raise InvalidRequest(f"line {n}: {what} {value[:40]!r} is not a UUID in canonical form")


def _body_hash(value: str, n: int) -> bytes:
    """A SHA-256 in hex."""
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise InvalidRequest(f"line {n}: body_hash must be 64 hexadecimal digits")
    return raw


def _plain(message: str) -> str:
    """Msgspec's message with its `$.` paths made readable."""
    return message.replace("`$.", "`").replace("`$`", "the line")

"""What a converter makes of another server's file: records keyed by the source's ids, and the
report that says what went where and what was left behind."""

from __future__ import annotations

import functools
import hashlib
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec

from storage.errors import InvalidRequest
from storage.model import MAX_KIND_BYTES, check_event

# A key must be what the API takes as an Idempotency-Key (memspine/schemas.py), so that the
# same source id names the same event whether it came in by this import or by an append.
MAX_KEY = 255
_PRINTABLE = re.compile(r"^[\x21-\x7e]+\Z")


class Record(msgspec.Struct, kw_only=True):
    """One event to create, named by its key (the source's id under the source's prefix)."""

    key: str
    kind: str
    ts: int
    text: str | None = None
    properties: dict[str, Any] = {}
    supersedes: list[str] = []  # keys of the records this one replaces
    sources: list[str] = []  # keys of the records this one was drawn from (SOURCE_FROM)
    valid_from: int | None = None
    valid_until: int | None = None
    embedding: list[float] | None = None
    subjects: list[str] = []  # the people the event is about (mem0 --subjects: its user_id)
    where: str = ""  # where in the source file it came from


class Report(msgspec.Struct, kw_only=True):
    """A conversion, counted: what the file held, what becomes of it, what cannot be carried."""

    source: str
    read: dict[str, int] = {}  # what the file holds, by what it is in the source's words
    created: dict[str, int] = {}  # events to create, by kind
    mapping: list[str] = []  # "source field -> memspine field", one line each
    dropped: dict[str, int] = {}  # "what (why)" -> how many items lost it
    notes: list[str] = []
    embedding_model: str | None = None  # the model of the embeddings kept, if any
    users: dict[str, int] = {}  # mem0: memories by user_id ("" for none)

    def drop(self, what: str, n: int = 1) -> None:
        """Count n items that lose `what`."""
        self.dropped[what] = self.dropped.get(what, 0) + n

    def count(self, what: str, n: int = 1) -> None:
        """Count n items the file holds."""
        self.read[what] = self.read.get(what, 0) + n


class Conversion(msgspec.Struct, kw_only=True):
    """A converted file: its records, in an order where each links only to earlier ones."""

    records: list[Record]
    report: Report


def key_of(source: str, source_id: object) -> str:
    """The key of a source id: `source:id`, or its SHA-256 when that is not a valid key."""
    key = f"{source}:{source_id}"
    if len(key) <= MAX_KEY and _PRINTABLE.match(key):
        return key
    return f"{source}:sha256:{hashlib.sha256(str(source_id).encode()).hexdigest()}"


def event_id(tenant_id: str, key: str) -> str:
    """The id the API gives an append under Idempotency-Key `key` (memspine/schemas.py's
    idempotent_id; docs/api.md states the formula)."""
    return str(uuid.uuid5(_namespace(tenant_id), key))


@functools.lru_cache(maxsize=64)
def _namespace(tenant_id: str) -> uuid.UUID:
    """The tenant's namespace of ids (one per import, not one per event)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, "memspine:" + tenant_id)


def micros(value: object, where: str) -> int | None:
    """An ISO 8601 time (a naive one is UTC), or seconds since the epoch, as microseconds."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InvalidRequest(f"{where}: a time must be an ISO 8601 string or a number")
    if isinstance(value, int | float):
        seconds = value / 1000 if value > 1e11 else value  # milliseconds, as JavaScript writes
        return int(seconds * 1_000_000)
    if not isinstance(value, str):
        raise InvalidRequest(f"{where}: a time must be an ISO 8601 string or a number")
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidRequest(f"{where}: {value[:40]!r} is not an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    us = int(moment.timestamp()) * 1_000_000 + moment.microsecond
    if not 0 <= us < 2**62:
        raise InvalidRequest(f"{where}: {value[:40]!r} is before 1970")
    return us


def kind_of(value: object, default: str) -> str:
    """A source's type name as a memspine kind: lowercased, or the default if unusable."""
    if not isinstance(value, str) or not value.strip():
        return default
    kind = value.strip().lower()
    if len(kind.encode()) > MAX_KIND_BYTES or not kind.isprintable():
        return default
    return kind


def window(rec: Record, report: Report) -> Record:
    """The record with an empty validity window opened on its start: the API refuses
    valid_from >= valid_until, and the end is what says the memory no longer holds."""
    vf, vu = rec.valid_from, rec.valid_until
    if vf is not None and vu is not None and vf >= vu:
        report.drop("valid_from (not before its valid_until)")
        rec.valid_from = None
    return rec


def ordered(records: list[Record], report: Report) -> list[Record]:
    """The records with each after those it links to (links to keys the file lacks, and the
    last link of any cycle, dropped and counted), otherwise in file order."""
    by_key: dict[str, Record] = {}
    for rec in records:
        if rec.key in by_key:
            report.drop("a second item with the same id (the first is kept)")
            continue
        by_key[rec.key] = rec
    for rec in by_key.values():
        for name in ("supersedes", "sources"):
            targets = getattr(rec, name)
            kept = [k for k in dict.fromkeys(targets) if k in by_key and k != rec.key]
            if len(kept) != len(targets):
                report.drop(
                    f"{name} link to an item the file does not hold", len(targets) - len(kept)
                )
            setattr(rec, name, kept)
    out: list[Record] = []
    state: dict[str, int] = {}  # 1: being placed, 2: placed
    for rec in by_key.values():
        checked(rec)
        _place(rec, by_key, state, out, report)
    return out


def checked(rec: Record) -> Record:
    """The record, if it keeps the event's rules (storage/model.py) as an append must; else
    InvalidRequest naming its place in the source file, not a line of the export made of it."""
    fields = {
        "kind": rec.kind,
        "ts": rec.ts,
        "text": rec.text,
        "embedding": rec.embedding,
        "valid_from": rec.valid_from,
        "valid_until": rec.valid_until,
        "properties_raw": msgspec.json.encode(rec.properties) if rec.properties else None,
    }
    try:
        check_event(fields)
    except InvalidRequest as exc:
        raise InvalidRequest(f"{rec.where}: {exc.detail}") from None
    return rec


def _place(
    first: Record,
    by_key: dict[str, Record],
    state: dict[str, int],
    out: list[Record],
    report: Report,
) -> None:
    """Place `first` after everything it links to (depth first, without recursion)."""
    if state.get(first.key):
        return
    stack: list[tuple[Record, int]] = [(first, 0)]
    state[first.key] = 1
    while stack:
        rec, i = stack.pop()
        targets = [*rec.supersedes, *rec.sources]
        if i < len(targets):
            stack.append((rec, i + 1))
            target = targets[i]
            seen = state.get(target)
            if seen == 1:  # a cycle: this link goes
                for name in ("supersedes", "sources"):
                    links = getattr(rec, name)
                    if target in links:
                        links.remove(target)
                        report.drop(f"{name} link closing a cycle")
                        break
                stack[-1] = (rec, i)  # the list shrank: the same position is the next link
            elif seen is None:
                state[target] = 1
                stack.append((by_key[target], 0))
            continue
        state[rec.key] = 2
        out.append(rec)

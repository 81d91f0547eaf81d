"""Listing events newest first by kind, time range and filterable properties, with opaque cursors."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterator

import msgspec

from storage.errors import InvalidRequest
from storage.log import layout
from storage.log.reader import LogReader
from storage.model import FilterValue, StoredEvent

MAX_LIMIT = 1000


class ListQuery(msgspec.Struct, frozen=True, kw_only=True):
    """What to list: every field optional but limit."""

    kind: str | None = None
    since: int | None = None
    until: int | None = None
    limit: int = 100
    cursor: str | None = None
    # name (or layout.SUBJECT) -> accepted values (any one matches)
    filters: dict[str, list[FilterValue]] = {}
    current: bool = True
    as_of: int | None = None


def encode_cursor(ev: StoredEvent) -> str:
    """An opaque, URL-safe position just after ev in newest-first order."""
    raw = layout.time_key(ev.ts, layout.id_bytes(ev.event_id))
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(cursor: str) -> bytes:
    """The by_ts key (ts, id) a cursor stands for; 400 if it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != layout.TIME_KEY_BYTES:
        raise InvalidRequest("cursor is not valid; pass next_cursor from a previous page unchanged")
    return raw


def list_events(
    r: LogReader, q: ListQuery, keep: Callable[[StoredEvent], bool] | None = None
) -> tuple[list[StoredEvent], str | None]:
    """One page of events newest first and the cursor of the next page (None at the end)."""
    if not 1 <= q.limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be from 1 to {MAX_LIMIT}")
    if q.since is not None and q.until is not None and q.since > q.until:
        raise InvalidRequest("since must not be later than until")
    before = decode_cursor(q.cursor) if q.cursor else None
    for bound in (q.until, None if q.as_of is None else q.as_of + 1):
        if bound is not None:
            key = layout.ts_bytes(bound)
            before = key if before is None else min(before, key)
    source = _by_property(r, q, before) if q.filters else r.newest_first(q.kind, q.since, before)
    page: list[StoredEvent] = []
    for ev in source:
        if not _matches(ev, q.filters) or (keep is not None and not keep(ev)):
            continue
        if len(page) == q.limit:
            return page, encode_cursor(page[-1])
        page.append(ev)
    return page, None


def _matches(ev: StoredEvent, filters: dict[str, list[FilterValue]]) -> bool:
    """Whether ev's filterable properties (or subjects: layout.SUBJECT) equal one accepted value
    per filter (typed equality)."""
    for name, accepted in filters.items():
        if not any(layout.tag_matches(ev, name, layout.value_bytes(v)) for v in accepted):
            return False
    return True


def _by_property(r: LogReader, q: ListQuery, before: bytes | None) -> Iterator[StoredEvent]:
    """Candidates from the property index (the first filter), sorted newest first."""
    name, accepted = next(iter(q.filters.items()))
    keys: list[tuple[bytes, StoredEvent]] = []
    for value in accepted:
        for event_id in r.ids_by_property(name, value):
            ev = r.get(event_id)
            if ev is None or (q.kind is not None and ev.kind != q.kind):
                continue
            if q.since is not None and ev.ts < q.since:
                continue
            key = layout.time_key(ev.ts, layout.id_bytes(ev.event_id))
            if before is None or key < before:
                keys.append((key, ev))
    keys.sort(key=lambda kv: kv[0], reverse=True)
    return (ev for _key, ev in keys)

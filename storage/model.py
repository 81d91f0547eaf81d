"""The stored form of an event and the append request the engine takes."""

from __future__ import annotations

from typing import Any

import msgspec

FilterValue = bool | int | float | str

# Relationship types between events (storage/log/layout.py gives each the byte its link keys carry).
SOURCE_FROM = "SOURCE_FROM"
SUPERSEDES = "SUPERSEDES"


class NewEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event to append, already validated by the caller."""

    kind: str
    ts: int
    text: str | None = None
    embedding: list[float] | None = None
    embedding_model: str | None = None
    properties_raw: bytes | None = None  # the JSON object exactly as the client sent it
    source_ids: tuple[str, ...] = ()
    supersedes: tuple[str, ...] = ()
    valid_from: int | None = None
    valid_until: int | None = None
    event_id: str | None = None  # set for Idempotency-Key appends
    body_hash: bytes | None = None  # sha256 of the request, kept for idempotency checks


class StoredEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event as the log holds it."""

    event_id: str
    seq: int
    kind: str
    ts: int
    text: str | None = None
    embedding: list[float] | None = None
    embedding_model: str | None = None
    properties_raw: bytes | None = None
    filterable: dict[str, FilterValue] = {}
    supersedes: list[str] = []
    valid_from: int | None = None
    valid_until: int | None = None

    def properties(self) -> dict[str, Any]:
        """The properties object decoded (an empty dict when none was sent)."""
        if not self.properties_raw:
            return {}
        value = msgspec.json.decode(self.properties_raw)
        return value if isinstance(value, dict) else {}

    def to_object(self) -> dict[str, Any]:
        """The event as clients see it: event_id, kind, ts, text, properties and embedding if any."""
        obj: dict[str, Any] = {
            "event_id": self.event_id,
            "kind": self.kind,
            "ts": self.ts,
            "text": self.text,
            "properties": self.properties(),
        }
        if self.embedding is not None:
            obj["embedding"] = self.embedding
        return obj


class AppendResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one append did: the id, the source and supersedes ids that named no event, and whether it was a replay."""

    event_id: str
    unlinked: list[str] = []
    replayed: bool = False


class PlacedEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An exported event to write back as it was (storage/transfer/): its record's fields (seq
    and filterable are the log's to set), its links in their order, its idempotency record."""

    event: StoredEvent
    sources: list[str] = []  # SOURCE_FROM targets, in link order; each must exist
    superseded: list[str] = []  # SUPERSEDES targets, in link order; each must exist
    body_hash: bytes | None = None  # with `unlinked`: the Idempotency-Key record, if it had one
    unlinked: list[str] = []
    line: int = 0  # where it came from, for the error that names it

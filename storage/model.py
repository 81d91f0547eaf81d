"""The stored form of an event and the append request the engine takes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from storage.errors import MemspineError, QuotaExceeded

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


class ItemRefused(Exception):
    """Why an all-or-nothing batch stored nothing: the index of its first event that could not
    be written, and the error that event met (raised by the batch's future)."""

    def __init__(self, item: int, error: MemspineError) -> None:
        super().__init__(item, error)
        self.item = item
        self.error = error


class Quota(msgspec.Struct, frozen=True, kw_only=True):
    """What a tenant may store: live events, their bytes, and the memory it holds open (None:
    no limit)."""

    max_events: int | None = None
    max_bytes: int | None = None
    max_memory: int | None = None

    def refusal(self, events: int, size: int, memory: int = 0) -> QuotaExceeded | None:
        """Why a tenant holding `events` live events of `size` bytes in all, and `memory` bytes
        in memory before this write, is over this quota, or None if it is within it."""
        if self.max_events is not None and events > self.max_events:
            return QuotaExceeded(
                f"this tenant may store at most {self.max_events} live events (its max_events "
                "limit); delete events to make room, or ask the operator to raise the limit",
                limit="max_events",
            )
        if self.max_bytes is not None and size > self.max_bytes:
            return QuotaExceeded(
                f"this tenant may store at most {self.max_bytes} bytes of live events (its "
                "max_bytes limit); delete events to make room, or ask the operator to raise "
                "the limit",
                limit="max_bytes",
            )
        if self.max_memory is not None and memory >= self.max_memory:
            return QuotaExceeded(
                f"this tenant may hold at most {self.max_memory} bytes in memory while open "
                f"(its max_memory limit) and holds {memory}; delete events and let the purge "
                "shrink its indexes, or ask the operator to raise the limit",
                limit="max_memory",
            )
        return None


UNLIMITED = Quota()
# What gives a tenant's quota when its writer starts a group commit (it may raise a
# MemspineError: the limits cannot be known, and nothing of the job is written).
QuotaSource = Callable[[], Quota]


def current_quota(quota: Quota | QuotaSource | None) -> Quota | MemspineError | None:
    """The quota in force: `quota` itself, or what its source gives now (or its error)."""
    if quota is None or isinstance(quota, Quota):
        return quota
    try:
        return quota()
    except MemspineError as exc:
        return exc


class PlacedEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An exported event to write back as it was (storage/transfer/): its record's fields (seq
    and filterable are the log's to set), its links in their order, its idempotency record."""

    event: StoredEvent
    sources: list[str] = []  # SOURCE_FROM targets, in link order; each must exist
    superseded: list[str] = []  # SUPERSEDES targets, in link order; each must exist
    body_hash: bytes | None = None  # with `unlinked`: the Idempotency-Key record, if it had one
    unlinked: list[str] = []
    line: int = 0  # where it came from, for the error that names it


class ServerSpace(msgspec.Struct, frozen=True, kw_only=True):
    """What the server's embedder offers a tenant whose space is nobody's yet: the model name
    its vectors are recorded under and their length (docs/embeddings.md, "Which events get a
    server vector")."""

    model: str
    dim: int


# The chain of turns (docs/recall.md, "Server-embedded recall"): the server's vector of an event
# of kind CHAIN_KIND is unit(e + CHAIN_WEIGHT * p), p the stored vector of the tenant's latest
# earlier such event, when that came at most CHAIN_GAP_US before it.
CHAIN_KIND = "turn"
CHAIN_WEIGHT = 0.7
CHAIN_GAP_US = 30 * 60 * 1_000_000


class StoredVector(msgspec.Struct, frozen=True):
    """A vector the server made for a live event, to write into its record."""

    event_id: str
    seq: int  # the event's append seq, checked so that an id reused since is never given it
    vector: list[float]

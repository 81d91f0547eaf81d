"""What the engine reads: the GraphReader protocol and the graph's fixed schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import msgspec

from storage.model import SOURCE_FROM, SUPERSEDES, FilterValue, StoredEvent

# The graph has one label and two relationship types; anything else in a pattern is refused.
LABEL = "Event"
REL_TYPES = (SOURCE_FROM, SUPERSEDES)

# Node properties backed by the event's own fields; other names come from `filterable`.
CORE_PROPERTIES = ("event_id", "kind", "ts", "text")


class GraphReader(Protocol):
    """One read transaction over a tenant's log, seen as a graph of events."""

    def get(self, event_id: str) -> StoredEvent | None:
        """The live event with this id, or None for unknown or deleted ids."""
        ...

    def ids_by_kind(self, kind: str, lo: int | None = None, hi: int | None = None) -> Iterator[str]:
        """Ids of one kind with lo <= ts < hi (None: unbounded), ascending ts."""
        ...

    def ids_by_property(self, name: str, value: FilterValue) -> Iterator[str]:
        """Ids whose filterable property equals value (1 and 1.0 are equal)."""
        ...

    def ids_by_ts(self, lo: int | None, hi: int | None) -> Iterator[str]:
        """Ids with lo <= ts < hi, ascending."""
        ...

    def all_ids(self) -> Iterator[str]:
        """Every live id, ascending ts."""
        ...

    def links_out(self, event_id: str, rel: str) -> list[str]:
        """The event's targets under rel, in link order."""
        ...

    def links_in(self, event_id: str, rel: str) -> list[str]:
        """The events linking to this one under rel, in append order."""
        ...

    def count(self) -> int:
        """Number of live events."""
        ...


class Relationship(msgspec.Struct, frozen=True):
    """A link as a query value: start links to end under type."""

    type: str
    start: str
    end: str

    def to_object(self) -> dict[str, str]:
        """The relationship as clients see it."""
        return {"type": self.type, "start": self.start, "end": self.end}

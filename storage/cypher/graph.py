"""What the engine reads: the GraphReader protocol and the graph's fixed schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, cast

import msgspec

from storage.ids import id_str
from storage.model import SOURCE_FROM, SUPERSEDES, FilterValue, StoredEvent

# The graph has one label and two relationship types; anything else in a pattern is refused.
LABEL = "Event"
REL_TYPES = (SOURCE_FROM, SUPERSEDES)

# Node properties backed by the event's own fields; other names come from `filterable`.
CORE_PROPERTIES = ("event_id", "kind", "ts", "text", "subjects")


# What a node is charged for itself beyond its text, properties and floats (storage/cypher/bounds.py)
NODE_BYTES = 400


class Codec(Protocol):
    """What decodes an encoded record: the GraphReader that read it."""

    def decode_record(self, raw: bytes) -> Any:
        """The record decoded (storage.log.layout.decode_record)."""
        ...

    def record_kind(self, raw: bytes) -> str:
        """Its kind alone, the rest of the record left undecoded."""
        ...


class GraphReader(Codec, Protocol):
    """One read transaction over a tenant's log, seen as a graph of events; it decodes the
    records it reads (Codec). Ids are the raw 16 bytes of the event id (storage/log/layout.py):
    a query goes from key to key, and converting an id to its text costs about what reading the
    event does, so only answers are converted."""

    def raw_record(self, raw_id: bytes) -> bytes | None:
        """The live event's encoded record, or None if deleted."""
        ...

    def raw_ids_by_kind(
        self, kind: str, lo: int | None = None, hi: int | None = None
    ) -> Iterator[bytes]:
        """Ids of one kind with lo <= ts < hi (None: unbounded), ascending ts."""
        ...

    def raw_ids_by_property(self, name: str, value: FilterValue) -> Iterator[bytes]:
        """Ids whose filterable property equals value (1 and 1.0 are equal), ascending."""
        ...

    def raw_ids_by_properties(self, pairs: list[tuple[str, FilterValue]]) -> list[bytes]:
        """Ids whose filterable properties equal every (name, value) pair, ascending."""
        ...

    def raw_ids_by_ts(self, lo: int | None, hi: int | None) -> Iterator[bytes]:
        """Ids with lo <= ts < hi, ascending ts (both None: every live id)."""
        ...

    def raw_links_out(self, raw_id: bytes, rel: str) -> list[bytes]:
        """The event's targets under rel, in link order."""
        ...

    def raw_links_out_of_kind(self, raw_id: bytes, rel: str, kind: str) -> list[bytes]:
        """The event's targets of this kind under rel, in link order, no target read."""
        ...

    def raw_links_in(self, raw_id: bytes, rel: str) -> list[bytes]:
        """The events linking to this one under rel, in append order."""
        ...

    def count(self) -> int:
        """Number of live events."""
        ...


class Node(msgspec.Struct, gc=False, eq=False):
    """An event as a query value: its raw id and its encoded record, decoded when a property is
    first read (its kind alone, the cheapest test, without decoding the rest), and without
    building the embedding's floats or a StoredEvent until the node is returned whole.

    Never tracked by the collector (it refers to no value that could refer back to it): a
    query that holds thousands of nodes would otherwise bring on collections of the whole
    process (bench/RESULTS.md, "Cypher at 100,000 events"). Equal only to itself, as a plain
    object is (values.py compares nodes by raw_id)."""

    raw_id: bytes
    raw: bytes
    codec: Codec
    _record: Any = None
    _size: int = -1

    @property
    def record(self) -> Any:
        """The decoded record (storage.log.layout.decode_record)."""
        record = self._record
        return self.decode() if record is None else record

    def decode(self) -> Any:
        """The record decoded now, and the node's size with it (what a sort or a cache charges
        for each row holding the node then costs no call)."""
        record = self._record = self.codec.decode_record(self.raw)
        floats = record.floats()
        text, props = len(record.text or ""), len(record.properties_raw or b"")
        self._size = NODE_BYTES + text + props + 32 * floats
        return record

    @property
    def kind(self) -> str:
        """The event's kind, read without decoding the record if it is not decoded yet."""
        record = self._record
        return self.codec.record_kind(self.raw) if record is None else cast(str, record.kind)

    @property
    def size(self) -> int:
        """About the bytes it holds (storage/cypher/bounds.py, node_bytes): its record decoded,
        text and properties, and the embedding as the floats it becomes if returned."""
        if self._size < 0:
            self.decode()
        return self._size

    @property
    def event_id(self) -> str:
        """The event id's text."""
        return cast(str, self.record.event_id)

    @property
    def seq(self) -> int:
        """The operation number that appended the event."""
        return cast(int, self.record.seq)

    @property
    def filterable(self) -> dict[str, FilterValue]:
        """The event's filterable properties (its other properties are not node properties)."""
        return cast(dict[str, FilterValue], self.record.filterable)

    def floats(self) -> int:
        """How many floats the embedding holds (0 without one)."""
        return cast(int, self.record.floats())

    def event(self) -> StoredEvent:
        """The StoredEvent."""
        return cast(StoredEvent, self.record.event())


class Relationship(msgspec.Struct, frozen=True, gc=False):
    """A link as a query value: start links to end under type (raw ids; text when rendered).
    Not a type the collector tracks, as Node is not: a row holding only nodes, links and
    scalars is then not tracked either."""

    type: str
    start_raw: bytes
    end_raw: bytes

    @property
    def start(self) -> str:
        """The linking event's id."""
        return id_str(self.start_raw)

    @property
    def end(self) -> str:
        """The linked event's id."""
        return id_str(self.end_raw)

    def to_object(self) -> dict[str, str]:
        """The relationship as clients see it."""
        return {"type": self.type, "start": self.start, "end": self.end}

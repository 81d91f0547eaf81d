"""Appending events inside one write transaction of the log: records, ops, index keys, links,
idempotency records, a tenant's vector space and quota (the environment's life is eventlog.py's)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any, Protocol

import lmdb
import msgspec

from storage.errors import EmbeddingMismatch, IdempotencyMismatch, InvalidRequest, MemspineError
from storage.log import layout
from storage.log.layout import LAST_WRITE, LIVE_BYTES, SUPERSEDING, IdempotencyRecord, space_name
from storage.log.reader import LogReader
from storage.model import (
    SOURCE_FROM,
    SUPERSEDES,
    AppendResult,
    ItemRefused,
    NewEvent,
    PlacedEvent,
    Quota,
    ServerSpace,
    StoredEvent,
)


class WritableLog(Protocol):
    """What an appender uses of its log (storage/log/eventlog.py's EventLog)."""

    env: lmdb.Environment | None  # None only while let go: never inside a write transaction
    dbs: dict[str, Any]

    def put_meta_int(self, txn: lmdb.Transaction, name: str, value: int) -> None:
        """Store an integer meta value inside a write transaction."""

    def delete_in(self, txn: lmdb.Transaction, event_ids: list[str]) -> list[str]:
        """Delete events inside a write transaction; the ids that existed."""


class Appender:
    """Appends events in one write transaction, reading the tenant's meta once for all of them."""

    # It numbers ops itself from the last seq it read, so every other write to the ops of txn
    # must go through it (`delete`). `written` keeps every record it wrote, in seq order: what
    # the writer projects into the indexes without reading the log back. It keeps the tenant's
    # live events and bytes as it goes, so each append is held to a quota without a read, and
    # writes the bytes and the last write's time to the meta once, in `finish`.

    def __init__(
        self, log: WritableLog, txn: lmdb.Transaction, offer: ServerSpace | None = None
    ) -> None:
        self.log = log
        self.txn = txn
        self.reader = LogReader(txn, log.dbs)
        self.dim = self.reader.meta_int(layout.DIM)
        self.model = self.reader.meta_str(layout.MODEL)
        self.space = self.reader.meta_int(layout.SPACE)
        self.offer = offer  # the server's embedder, for a tenant whose space is nobody's yet
        self.unembedded = 0  # events written here that await their server vector
        # Events listed before this transaction: their vectors are not in the live bytes yet,
        # but they count against max_bytes as if written (they will be, whatever the quota).
        self.listed = self.reader.unembedded_count()
        self.last = self.reader.last_seq()  # the newest op in txn
        self.events = self.reader.event_count()
        self.bytes = self.reader.meta_int(LIVE_BYTES) or 0
        self.written: list[StoredEvent] = []
        self._random = b""  # random bytes for ids, drawn from the OS a few dozen ids at a time
        self._unsaved = False  # events appended since the meta last had the live bytes
        # What the tenant held in memory when its group commit started (a quota's max_memory):
        # the indexes grow only once the commit is projected into them.
        self.memory = 0

    def finish(self) -> None:
        """Write the live bytes and the time of the last write to the meta, if events were
        appended since they were last written (call it before the transaction commits)."""
        if self._unsaved:
            self.log.put_meta_int(self.txn, LIVE_BYTES, self.bytes)
            self.log.put_meta_int(self.txn, LAST_WRITE, time.time_ns() // 1000)
            self._unsaved = False

    def delete(self, event_ids: list[str]) -> list[str]:
        """Delete events (EventLog.delete_in) in this appender's transaction."""
        self.finish()  # delete_in counts the freed bytes from the meta's figure
        deleted = self.log.delete_in(self.txn, event_ids)
        self.last = self.reader.last_seq()
        self.events = self.reader.event_count()
        self.bytes = self.reader.meta_int(LIVE_BYTES) or 0
        return deleted

    def append_all(
        self, events: list[NewEvent], quota: Quota | None = None
    ) -> list[AppendResult | MemspineError]:
        """Append each event in order; each gets its result or its own error."""
        return [self.append(ev, quota) for ev in events]

    def append_atomic(
        self, events: list[NewEvent], quota: Quota | None = None
    ) -> list[AppendResult] | ItemRefused:
        """Append every event in order, or none of them: the first that cannot be written
        (and why) undoes the others. Later events may link to earlier ones by id."""
        # A nested transaction: aborting it leaves txn as it was, with the other jobs of the
        # group commit in it; this appender's own counters move only once it commits.
        env = self.log.env
        assert env is not None  # held: this runs inside the log's write transaction
        child = env.begin(write=True, parent=self.txn)
        results: list[AppendResult] = []
        try:
            sub = Appender(self.log, child, self.offer)
            sub._random = self._random
            sub.bytes = self.bytes  # the meta's figure lags until finish: carry this one's
            sub.memory = self.memory
            for i, ev in enumerate(events):
                result = sub.append(ev, quota)
                if isinstance(result, MemspineError):
                    child.abort()
                    return ItemRefused(i, result)
                results.append(result)
        except BaseException:
            child.abort()
            raise
        child.commit()
        self.last, self.model, self.events, self.bytes = sub.last, sub.model, sub.events, sub.bytes
        self.space, self.unembedded = sub.space, self.unembedded + sub.unembedded
        self._unsaved = self._unsaved or sub._unsaved
        self.written += sub.written
        self._random = sub._random
        return results

    def append(self, ev: NewEvent, quota: Quota | None = None) -> AppendResult | MemspineError:
        """Write one event and its index entries, or return why it cannot be written (an
        Idempotency-Key's other body, an embedding of another length or model, the quota)."""
        if ev.event_id is None:
            raw_id = self._random_id()
            event_id = layout.id_str(raw_id)
        else:
            event_id = ev.event_id
            raw_id = layout.id_bytes(event_id)
            replay = self._replay(ev, event_id, raw_id)
            if replay is not None:
                return replay
        problem = self._check_embedding(ev)
        if problem is not None:
            return problem
        awaits = self._awaits_vector(ev)
        if isinstance(awaits, MemspineError):
            return awaits
        sources, supersedes, unlinked = self._links(ev)
        record = _record(ev, event_id, self.last + 1, supersedes)
        encoded = layout.encode_event(record)
        if quota is not None:
            # The vector the server will write into the record counts now, and so do those of
            # every event still awaiting its own: once acknowledged, an event is never refused
            # its vector, and max_bytes bounds what the tenant will store.
            promised = (self.listed + self.unembedded + bool(awaits)) * vector_bytes(self.dim or 0)
            size = len(encoded) + promised
            refused = quota.refusal(self.events + 1, self.bytes + size, self.memory)
            if refused is not None:
                return refused
        self._put(raw_id, record, sources, supersedes, encoded, awaits=awaits)
        if ev.body_hash is not None and ev.event_id is not None:
            self._put_idempotency(raw_id, ev.body_hash, unlinked)
        return AppendResult(event_id=event_id, unlinked=unlinked)

    def _replay(
        self, ev: NewEvent, event_id: str, raw_id: bytes
    ) -> AppendResult | MemspineError | None:
        """What an Idempotency-Key append already written answers (its result replayed, or
        IdempotencyMismatch for another body); None if the key is new."""
        if ev.body_hash is None:
            return None
        prior = self.txn.get(raw_id, db=self.log.dbs["idem"])
        if prior is None:
            return None
        rec = layout.decode_idempotency(prior)
        if rec.body_hash != ev.body_hash:
            return IdempotencyMismatch(
                "this Idempotency-Key was first used with a different body; "
                "use a new key for a different event"
            )
        return AppendResult(event_id=event_id, unlinked=rec.unlinked, replayed=True)

    def _links(self, ev: NewEvent) -> tuple[list[str], list[str], list[str]]:
        """The event's source and superseded ids that name live events, and those that name
        none (unlinked), each once in the order given."""
        if not (ev.source_ids or ev.supersedes):  # most events link nothing: skip four dedupes
            return [], [], []
        r = self.reader
        wanted_sources = dedupe(ev.source_ids)
        wanted_supersedes = dedupe(ev.supersedes)
        # An existence check, not r.get: decoding a whole record (embedding included) is
        # most of what a lookup costs and nothing here reads it.
        sources = [s for s in wanted_sources if r.exists(s)]
        supersedes = [s for s in wanted_supersedes if r.exists(s)]
        unlinked = [s for s in wanted_sources if s not in sources]
        unlinked += [s for s in wanted_supersedes if s not in supersedes and s not in unlinked]
        return sources, supersedes, unlinked

    def _put(
        self,
        raw_id: bytes,
        record: StoredEvent,
        sources: list[str],
        supersedes: list[str],
        encoded: bytes | None = None,
        *,
        awaits: bool = False,
    ) -> None:
        """Write a numbered record, its op, its index keys and its links (targets that exist);
        awaits: the event is listed for the background embedder."""
        txn, d, seq = self.txn, self.log.dbs, record.seq
        if encoded is None:
            encoded = layout.encode_event(record)
        # Nothing can refuse the event from here on: the tenant's model and space are recorded
        # with it.
        if record.embedding_model is not None and self.model is None:
            txn.put(layout.meta_key(layout.MODEL), record.embedding_model.encode(), db=d["meta"])
            self.model = record.embedding_model
        if self.space is None and record.embedding is not None:
            self.log.put_meta_int(txn, layout.SPACE, layout.SPACE_CLIENT)
            self.space = layout.SPACE_CLIENT
        elif self.space is None and awaits:
            self._claim_server_space()
        if awaits:
            txn.put(layout.unembedded_key(seq, raw_id), b"", db=d["unembedded"])
            self.unembedded += 1
        # MDB_APPEND refuses a seq that is not past every op: the transaction was written behind
        # this appender's back, and numbering on would overwrite or reorder ops. Records go at
        # the end the same way, which leaves their pages full (random ids split them in halves).
        op = layout.op_value(layout.OP_APPEND, raw_id)
        key = layout.op_key(seq)
        if not txn.put(key, op, db=d["ops"], append=True) or not txn.put(
            layout.record_key(seq), encoded, db=d["records"], append=True
        ):
            raise RuntimeError(f"op {seq} is not past the newest op: ops written outside it")
        prior = txn.get(raw_id, db=d["ids"])
        if prior is not None:  # an id written again: its new record replaces the old one
            txn.delete(prior, db=d["records"])
        txn.put(raw_id, layout.record_key(seq), db=d["ids"])
        self.last = seq
        self.events, self.bytes = self.events + 1, self.bytes + len(encoded)
        self._unsaved = True
        for name, key in layout.index_keys(record, raw_id):
            txn.put(key, b"", db=d[name])
        if supersedes:
            self.log.put_meta_int(txn, SUPERSEDING, 1)
        for rel, targets in ((SOURCE_FROM, sources), (SUPERSEDES, supersedes)):
            for i, target in enumerate(targets):
                raw_target = layout.id_bytes(target)
                value = layout.link_out_value(raw_target, self._kind(raw_target))
                txn.put(layout.link_out_key(raw_id, rel, i), value, db=d["links_out"])
                txn.put(layout.link_in_key(raw_target, rel, seq, raw_id), b"", db=d["links_in"])
        self.written.append(record)

    def _kind(self, raw_target: bytes) -> str:
        """The kind of a link's target, which the caller found live in this transaction."""
        raw = self.reader.raw_record(raw_target)
        if raw is None:
            raise RuntimeError("a link's target is not in the log")
        return layout.record_kind(raw)

    def place(self, placed: PlacedEvent, *, keep_before: int | None = None) -> bool:
        """Write an exported event as it was: its id, its record's fields, its links in their
        order (every target must exist) and its idempotency record. False (nothing written)
        when the id is live already and was so at op `keep_before` (a merge keeps it);
        InvalidRequest naming the line for anything else that cannot be written."""
        ev, line = placed.event, placed.line
        raw_id = layout.id_bytes(ev.event_id)
        held = self.reader.raw_record(raw_id)
        if held is not None:
            if keep_before is not None and layout.decode_light(held).seq <= keep_before:
                return False
            raise InvalidRequest(f"line {line}: event {ev.event_id} appears twice")
        for target in (*placed.sources, *placed.superseded):
            if not self.reader.exists(target):
                raise InvalidRequest(
                    f"line {line}: event {ev.event_id} links to {target}, "
                    "which is not an earlier event of the file or of the tenant"
                )
        problem = self._check_embedding(ev)
        if problem is not None:
            raise InvalidRequest(f"line {line}: {problem.detail}")
        awaits = self._awaits_vector(ev)
        if isinstance(awaits, MemspineError):
            raise InvalidRequest(f"line {line}: {awaits.detail}")
        properties = msgspec.json.decode(ev.properties_raw) if ev.properties_raw else {}
        filterable = layout.filterable_properties(
            properties if isinstance(properties, dict) else {}
        )
        record = msgspec.structs.replace(ev, seq=self.last + 1, filterable=filterable)
        self._put(raw_id, record, placed.sources, placed.superseded, awaits=awaits)
        if placed.body_hash is not None:
            self.place_idempotency(ev.event_id, placed.body_hash, placed.unlinked)
        return True

    def place_idempotency(self, event_id: str, body_hash: bytes, unlinked: list[str]) -> None:
        """Write the Idempotency-Key record of an event (one deleted since keeps its record, so
        a retry of its append still replays rather than stores it again)."""
        self._put_idempotency(layout.id_bytes(event_id), body_hash, unlinked)

    def _put_idempotency(self, raw_id: bytes, body_hash: bytes, unlinked: list[str]) -> None:
        """Write an Idempotency-Key record under the event's raw id."""
        idem = IdempotencyRecord(body_hash=body_hash, unlinked=unlinked)
        self.txn.put(raw_id, layout.encode_idempotency(idem), db=self.log.dbs["idem"])

    def claim_model(self, model: str) -> None:
        """Record the tenant's embedding model as an export names it; InvalidRequest if the
        tenant already has another."""
        if self.model is None:
            self.txn.put(layout.meta_key(layout.MODEL), model.encode(), db=self.log.dbs["meta"])
            self.model = model
        elif self.model != model:
            raise InvalidRequest(
                f"this tenant's embeddings come from '{self.model}', the file's from '{model}'"
            )

    def claim_space(self, space: int, model: str | None) -> None:
        """Record the tenant's vector space as an export names it; InvalidRequest if the
        tenant already has another."""
        if self.space is None:
            self.log.put_meta_int(self.txn, layout.SPACE, space)
            self.space = space
        elif self.space != space:
            raise InvalidRequest(
                f"this tenant's vectors are made by the {space_name(self.space)}, "
                f"the file's by the {space_name(space)}"
            )
        if model is not None:
            self.claim_model(model)

    def _awaits_vector(self, ev: NewEvent | StoredEvent) -> bool | MemspineError:
        """Whether the event gets a server vector after its append; EmbeddingMismatch for a
        client vector in a server-space tenant that does not name the server's model."""
        if ev.embedding is not None:
            if self.space == layout.SPACE_SERVER and ev.embedding_model != self.model:
                return EmbeddingMismatch(
                    f"this tenant's vectors are made by the server with '{self.model}'; "
                    "send no embedding (the server makes it), or one with embedding_model "
                    f"'{self.model}'"
                )
            return False
        if not ev.text:
            return False
        if self.space == layout.SPACE_SERVER:
            return True
        offer = self.offer
        return (
            self.space is None
            and self.model is None
            and offer is not None
            and offer.dim == self.dim
        )

    def _claim_server_space(self) -> None:
        """Make the tenant server-space (its first event to get a vector is text-only and the
        server embeds): every earlier live event with text and no vector is listed too."""
        assert self.offer is not None
        txn, d = self.txn, self.log.dbs
        self.log.put_meta_int(txn, layout.SPACE, layout.SPACE_SERVER)
        txn.put(layout.meta_key(layout.MODEL), self.offer.model.encode(), db=d["meta"])
        self.space, self.model = layout.SPACE_SERVER, self.offer.model
        for value in self.reader.record_values():
            ev = layout.decode_light(value)  # a log with no space yet holds no vector
            if ev.text:
                key = layout.unembedded_key(ev.seq, layout.id_bytes(ev.event_id))
                txn.put(key, b"", db=d["unembedded"])
                self.unembedded += 1

    def _random_id(self) -> bytes:
        """The 16 bytes of a random UUIDv4, as uuid.uuid4() makes them, without a syscall each."""
        if not self._random:
            self._random = os.urandom(16 * 32)
        raw = bytearray(self._random[:16])
        self._random = self._random[16:]
        raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
        raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
        return bytes(raw)

    def _check_embedding(self, ev: NewEvent | StoredEvent) -> MemspineError | None:
        """Refuse an embedding of the wrong length or from a model other than the tenant's."""
        if ev.embedding is not None:
            dim = self.dim
            if dim is not None and len(ev.embedding) != dim:
                return EmbeddingMismatch(
                    f"embedding has {len(ev.embedding)} values; this tenant's vectors have {dim}"
                )
        known = self.model
        if ev.embedding_model is not None and known is not None and known != ev.embedding_model:
            return EmbeddingMismatch(
                f"this tenant's embeddings come from '{known}'; "
                "vectors from another model cannot be mixed with them"
            )
        return None


def _record(ev: NewEvent, event_id: str, seq: int, supersedes: list[str]) -> StoredEvent:
    """The record a new event is stored as, numbered seq."""
    properties = msgspec.json.decode(ev.properties_raw) if ev.properties_raw else {}
    return StoredEvent(
        event_id=event_id,
        seq=seq,
        kind=ev.kind,
        ts=ev.ts,
        text=ev.text,
        embedding=ev.embedding,
        embedding_model=ev.embedding_model,
        properties_raw=ev.properties_raw,
        filterable=layout.filterable_properties(properties if isinstance(properties, dict) else {}),
        supersedes=supersedes,
        valid_from=ev.valid_from,
        valid_until=ev.valid_until,
        subjects=list(ev.subjects),
    )


def vector_bytes(dim: int) -> int:
    """What a vector of dim floats adds to a record (storage/log/layout.py): its float32s in a
    msgpack ext with its header, under the field's name, and the name of the model's field (the
    two are left out of a record without them; the model's own name is not counted)."""
    data = 4 * dim
    header = 2 if data in (1, 2, 4, 8, 16) else 3 if data < 256 else 4 if data < 65536 else 6
    return _FIELD_NAMES + header + data


_FIELD_NAMES = len("embedding") + 1 + len("embedding_model") + 1  # each a msgpack fixstr


def dedupe(ids: Iterable[str]) -> list[str]:
    """Ids in first-seen order without repeats."""
    return list(dict.fromkeys(ids))

"""The event log's format on disk: its named databases, every key and value in them, the meta names.

Every module that reads or writes a tenant's LMDB environment builds and parses its keys and
values here; no other module spells out a byte of them. SCHEMA_VERSION names this format and is
stored in each log's meta when the log is made.

Bump SCHEMA_VERSION in the same commit as any change to what is below: a database, the bytes of
a key, the encoding of a value, a meta name, or a field of StoredEvent (a record is its fields,
in order). tests/test_layout.py holds a fingerprint of each version's bytes and fails when they
change without a bump; a log made by a newer version than this code knows is refused on open.
"""

from __future__ import annotations

import array
import functools
import re
import struct
import sys
from collections.abc import Callable
from typing import Any, cast

import msgspec

from storage.ids import ID_BYTES as ID_BYTES
from storage.ids import id_bytes as id_bytes
from storage.ids import id_str as id_str
from storage.model import SOURCE_FROM, SUPERSEDES, FilterValue, StoredEvent

# 2: the meta names LIVE_BYTES and LAST_WRITE.
# 3: the vector space (meta SPACE), the database "unembedded" and the op OP_EMBED: vectors the
# server makes are written into their events' records after the append.
# 4: a links_out value is the target's raw id and then its kind (UTF-8): an expansion that asks
# its targets' kind answers from the link list, without reading the targets' records.
# 5: a record's field `subjects` (the people an event is about), each listed in by_prop under
# the name SUBJECT; the database "erased" (the erasure ledger: every deleted id and when).
# 6: a record's embedding is little-endian float32 in a msgpack ext of type EXT_FLOAT32 (a
# 384-float record then fits inline in its LMDB page), and a record leaves out the fields that
# hold their defaults. A record of version 5 or older (float64s in a msgpack bin, every field)
# still decodes.
# 7: records keyed by their append seq in the database "records" (put with MDB_APPEND, so its
# pages fill: random ids left them two-thirds full, bench/RESULTS.md "Disk per event"), found by
# id through the database "ids" (raw id -> the seq's key); version 6 and older kept them in the
# database "events" under their raw ids (LEGACY_EVENTS), moved on open.
# An older log is brought to this version on its first open (storage/log/migrations.py).
SCHEMA_VERSION = 7

# -- the named databases ----------------------------------------------------------------------

DB_NAMES = (
    "records",  # record_key(seq of its append) -> the event's record (encode_event)
    "ids",  # raw id -> record_key(seq): where a live event's record is
    "ops",  # op_key(seq) -> op_value(OP_APPEND | OP_DELETE, raw id): what projections replay
    "by_ts",  # time_key(ts, raw id) -> b""
    "by_kind",  # kind_key(kind, ts, raw id) -> b""
    "by_prop",  # property_key(name, value, raw id) -> b""
    # link_out_key(raw id, rel, position) -> link_out_value(raw target id, its kind) (link order)
    "links_out",
    "links_in",  # link_in_key(raw target id, rel, seq of the linking event, its raw id) -> b""
    "idem",  # raw id derived from an Idempotency-Key -> IdempotencyRecord (msgpack)
    "tombstones",  # raw id -> Tombstone (msgpack)
    "meta",  # meta_key(name) -> u64(value), or MODEL's name as UTF-8
    # unembedded_key(seq, raw id) -> b"": events of a server-space tenant awaiting their vector,
    # in append order (the background embedder's work, derived from the log after a restart)
    "unembedded",
    # raw id -> u64(microseconds since the epoch of its delete): the erasure ledger, kept past
    # the purge so that a restore, an import or a move can drop an erased event again
    # (docs/erasure.md, "The erasure ledger"); ids and times only, never content
    "erased",
)

# Databases a log of an older version may lack until its first open for writes (migrations.py):
# a read-only snapshot of it reads them as empty.
LATER_DBS = frozenset({"unembedded", "erased", "records", "ids"})

# Where version 6 and older kept the records (raw id -> record): present only in a log not yet
# migrated, or one whose migration was stopped halfway (readers look there after "ids").
LEGACY_EVENTS = "events"

# -- meta names -------------------------------------------------------------------------------

SCHEMA = "schema"  # SCHEMA_VERSION of the format the log was made in
DIM = "dim"  # the tenant's embedding dimension, fixed when the log is made
MODEL = "model"  # the embedding model of the tenant's first embedding (UTF-8), if any
KEYWORD_SEQ = "keyword_seq"  # the last op the durable keyword index covers
VECTOR_SEQ = "vector_seq"  # the last op the saved vector file covers
# 1 once any event of the log has superseded another (set with the link, never cleared): while it
# is 0 no event is superseded, and reads skip the supersession probe of each hit. Absent: not
# known, so reads probe.
SUPERSEDING = "superseding"
# The bytes of every live event's record in "records", kept in the transaction of each append and
# delete: what a tenant's max_bytes quota counts, read without a scan. (The number of live events
# needs no counter: LMDB keeps each database's entry count.)
LIVE_BYTES = "live_bytes"
LAST_WRITE = "last_write"  # microseconds since the epoch of the last append or delete
# Who makes the tenant's vectors (SPACE_CLIENT or SPACE_SERVER), fixed by its first event that
# carries or gets a vector; absent: nobody yet. With SPACE_SERVER, MODEL names the server's model.
SPACE = "space"
META_NAMES = (
    SCHEMA,
    DIM,
    MODEL,
    KEYWORD_SEQ,
    VECTOR_SEQ,
    SUPERSEDING,
    LIVE_BYTES,
    LAST_WRITE,
    SPACE,
)
SPACE_CLIENT = 1
SPACE_SERVER = 2


def meta_key(name: str) -> bytes:
    """The meta database's key for a meta name."""
    return name.encode()


# -- ids, numbers and times -------------------------------------------------------------------

# Ids (ID_BYTES, id_bytes, id_str) are storage/ids.py's, imported above for the log's keys.
_SIGN = 1 << 63


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


# -- keys -------------------------------------------------------------------------------------

OP_APPEND = b"A"
OP_DELETE = b"D"
# The live event's vector changed after its append (the server stored or cleared it): the vector
# index replays it as a delete and an add of the event's label (its append seq).
OP_EMBED = b"E"
# Relationship types as the byte their link keys carry.
REL_CODES: dict[str, bytes] = {SOURCE_FROM: b"S", SUPERSEDES: b"P"}
TIME_KEY_BYTES = 8 + ID_BYTES


def op_key(seq: int) -> bytes:
    """The ops key of operation seq: ops sort in the order they were written."""
    return u64(seq)


def record_key(seq: int) -> bytes:
    """The records key of the event appended as op seq (the same bytes as its op key): records
    sort in append order, so each append goes at the end of the database."""
    return u64(seq)


def op_value(op: bytes, raw_id: bytes) -> bytes:
    """What an op records: OP_APPEND or OP_DELETE, then the event's raw id."""
    return op + raw_id


def read_op(value: bytes) -> tuple[bytes, bytes]:
    """Inverse of op_value: (OP_APPEND or OP_DELETE, raw id)."""
    return value[:1], value[1:]


def unembedded_key(seq: int, raw_id: bytes) -> bytes:
    """The unembedded key of an event awaiting its server vector: its seq, then its id."""
    return u64(seq) + raw_id


def read_unembedded(key: bytes) -> tuple[int, bytes]:
    """Inverse of unembedded_key: (seq, raw id)."""
    return read_u64(key), key[8:]


def time_key(ts: int, raw_id: bytes) -> bytes:
    """The by_ts key of an event (and the tail of its by_kind key); listing cursors are one."""
    return ts_bytes(ts) + raw_id


# Prefixes are built once per kind, name and value: a tenant's events use few of them, and an
# append builds several per event. Bounded, as kinds, names and values are client data.
PREFIX_CACHE = 65536


@functools.lru_cache(maxsize=PREFIX_CACHE)
def kind_prefix(kind: str) -> bytes:
    """The by_kind key prefix: length-prefixed so one kind never prefixes another."""
    raw = kind.encode()
    return len(raw).to_bytes(2, "big") + raw


def kind_key(kind: str, ts: int, raw_id: bytes) -> bytes:
    """The by_kind key of an event: its kind, then its time key."""
    return kind_prefix(kind) + time_key(ts, raw_id)


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


# Prefixes already built: an append writes one per filterable property and the keyword index
# tags it twice more (storage/index/keyword.py), with the same few names and values each time.
# Keyed by the value's type too, so True and 1, equal in Python, never share an entry.
@functools.lru_cache(maxsize=PREFIX_CACHE, typed=True)
def property_prefix(name: str, value: FilterValue) -> bytes:
    """The key prefix under which every event with name == value is listed."""
    raw_name = name.encode()
    return bytes([len(raw_name)]) + raw_name + value_bytes(value)


def property_key(name: str, value: FilterValue, raw_id: bytes) -> bytes:
    """The by_prop key of one filterable property of an event."""
    return property_prefix(name, value) + raw_id


def key_id(key: bytes) -> str:
    """The event id that ends a by_ts, by_kind, by_prop or links_in key."""
    return id_str(key[-ID_BYTES:])


def link_prefix(raw_id: bytes, rel: str) -> bytes:
    """What begins an event's links_out keys (its targets) and links_in keys (its sources)."""
    return raw_id + REL_CODES[rel]


def link_out_key(raw_source: bytes, rel: str, position: int) -> bytes:
    """The links_out key of a source's link at this position of its list."""
    return link_prefix(raw_source, rel) + position.to_bytes(2, "big")


def link_out_value(raw_target: bytes, kind: str) -> bytes:
    """The links_out value of a link: the target's raw id, then its kind (an event's kind never
    changes, so the copy in the link stays true while the target lives)."""
    return raw_target + kind.encode()


def link_target(value: bytes) -> bytes:
    """The target's raw id in a links_out value."""
    return value[:ID_BYTES]


def link_in_key(raw_target: bytes, rel: str, seq: int, raw_source: bytes) -> bytes:
    """The links_in key of a link, under its target: sources sort in the order they were appended."""
    return link_prefix(raw_target, rel) + u64(seq) + raw_source


def index_keys(ev: StoredEvent, raw_id: bytes | None = None) -> list[tuple[str, bytes]]:
    """(database, key) of every key an append writes for an event beside its record, its op
    and its links: what a delete removes again (raw_id: the event's id as bytes, if at hand)."""
    if raw_id is None:
        raw_id = id_bytes(ev.event_id)
    tkey = time_key(ev.ts, raw_id)
    keys = [("by_ts", tkey), ("by_kind", kind_prefix(ev.kind) + tkey)]
    keys += [("by_prop", property_prefix(n, v) + raw_id) for n, v in ev.filterable.items()]
    keys += [("by_prop", property_prefix(SUBJECT, s) + raw_id) for s in ev.subjects]
    return keys


# The by_prop name under which an event's subjects are listed (its value: the subject id). No
# property can have it: PROPERTY_NAME starts with a letter.
SUBJECT = "$subject"


def tag_matches(ev: StoredEvent, name: str, want: bytes) -> bool:
    """Whether ev has `name` (a filterable property, or SUBJECT) equal to the value whose
    value_bytes are `want`."""
    if name == SUBJECT:
        return any(value_bytes(s) == want for s in ev.subjects)
    return name in ev.filterable and value_bytes(ev.filterable[name]) == want


# -- filterable properties (each gets a by_prop key) --------------------------------------------

PROPERTY_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*\Z")  # \Z: "$" would accept a trailing newline
MAX_FILTERABLE = 16
# With these, a by_prop key (1 + name + tag + 2 + string + id) stays under LMDB's 511-byte limit.
MAX_FILTER_STRING_BYTES = 256
MAX_FILTER_NAME_BYTES = 128


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


# -- values -----------------------------------------------------------------------------------


class Tombstone(msgspec.Struct, frozen=True):
    """A deleted event awaiting purge: its append seq and deletion time, never content."""

    seq: int
    deleted_at: int


class IdempotencyRecord(msgspec.Struct, frozen=True):
    """What a retry under the same Idempotency-Key needs: the body hash and the first answer's unlinked ids."""

    body_hash: bytes
    unlinked: list[str] = []


_encode_value = msgspec.msgpack.Encoder().encode
decode_tombstone = msgspec.msgpack.Decoder(Tombstone).decode
decode_idempotency = msgspec.msgpack.Decoder(IdempotencyRecord).decode


def encode_tombstone(tomb: Tombstone) -> bytes:
    """The tombstones value of a deleted event."""
    return _encode_value(tomb)


def encode_idempotency(rec: IdempotencyRecord) -> bytes:
    """The idem value of an event appended under an Idempotency-Key."""
    return _encode_value(rec)


# -- the event record -------------------------------------------------------------------------
#
# A record is the msgpack map of StoredEvent's fields, in their order, less those that hold
# their defaults, with the embedding as a msgpack ext of type EXT_FLOAT32 holding little-endian
# float32s: 1,536 bytes at 384 dimensions, so that such a record stays under LMDB's inline limit
# (about 2,000 bytes on a 4 KiB page; above it a record takes an overflow page of its own,
# bench/disk.py). Records of version 5 and older hold every field and the embedding as a msgpack
# bin of little-endian float64s; they decode alike (the migration to 6 rewrites them). A reader
# that leaves the embedding out (recall's candidates) skips it by its length instead of building
# its floats.

_SWAP = sys.byteorder == "big"  # array.array is native order; records are little-endian
EXT_FLOAT32 = 1  # the msgpack ext type of an embedding of little-endian float32s


def _field_spec(f: msgspec.structs.FieldInfo) -> tuple[Any, ...]:
    """A StoredEvent field as msgspec.defstruct takes it, default and all."""
    if f.default is not msgspec.NODEFAULT:
        return (f.name, f.type, f.default)
    if f.default_factory is not msgspec.NODEFAULT:
        return (f.name, f.type, msgspec.field(default_factory=f.default_factory))
    return (f.name, f.type)


def _record_floats(self: Any) -> int:
    """How many floats a decoded record's embedding holds (0 without one)."""
    return embedding_floats(self.embedding)


# StoredEvent's own fields in its order, so the two cannot drift apart; the embedding as its
# encoded form (Ext: float32s; bytes: the float64s of version 5 and older), the superseded ids
# as a tuple (most are empty, and the empty tuple is one object the collector does not track,
# where each empty list would be another). Not kw_only: a record is built from StoredEvent's
# values by position, which is cheaper than by name.
_RECORD_FIELDS: dict[str, tuple[Any, ...]] = {
    "embedding": ("embedding", msgspec.msgpack.Ext | bytes | None, None),
    "supersedes": ("supersedes", tuple[str, ...], ()),
}
_Record = msgspec.defstruct(
    "_Record",
    [_RECORD_FIELDS.get(f.name) or _field_spec(f) for f in msgspec.structs.fields(StoredEvent)],
    frozen=True,
    omit_defaults=True,  # most events leave most fields unset: ~90 bytes a record
    # never in a reference cycle (its fields are scalars, a dict of scalars, a list of ids), so
    # the collector need not track it: a query holds thousands of them (Cypher's nodes)
    gc=False,
    # event(): what decode_record hands readers outside the log (Cypher) that need the
    # StoredEvent; floats(): the embedding's length without building it
    namespace={"event": lambda self: event_of(self), "floats": _record_floats},
)
_EMBEDDING = StoredEvent.__struct_fields__.index("embedding")
_SUPERSEDES = StoredEvent.__struct_fields__.index("supersedes")

_encode_record = msgspec.msgpack.Encoder().encode
_decode_record = msgspec.msgpack.Decoder(_Record).decode


@functools.cache
def _packer(n: int) -> struct.Struct:
    """Packs n floats as little-endian float32s (one per embedding length a tenant uses)."""
    # struct.pack from the list is the fastest of the ways measured (bench/RESULTS.md, "Code
    # choices measured"); it rounds each float to the nearest float32 (the event's rules refuse
    # a value beyond float32's range, storage/model.py).
    return struct.Struct(f"<{n}f")


def pack_embedding(values: list[float]) -> msgspec.msgpack.Ext:
    """An embedding as a record holds it: little-endian float32s in an EXT_FLOAT32 ext."""
    return msgspec.msgpack.Ext(EXT_FLOAT32, _packer(len(values)).pack(*values))


def embedding_floats(embedding: msgspec.msgpack.Ext | bytes | None) -> int:
    """How many floats an embedding as a record holds it has (0 for None)."""
    if embedding is None:
        return 0
    if isinstance(embedding, msgspec.msgpack.Ext):
        return len(cast(bytes, embedding.data)) // 4
    return len(embedding) // 8  # version 5 and older: float64s


def encode_event(ev: StoredEvent) -> bytes:
    """The record that stores ev."""
    values: list[Any] = list(msgspec.structs.astuple(ev))
    if ev.embedding is not None:
        values[_EMBEDDING] = pack_embedding(ev.embedding)
    values[_SUPERSEDES] = tuple(ev.supersedes)  # none: the default (), which is left out
    return _encode_record(_Record(*values))


def decode_event(raw: bytes | memoryview) -> StoredEvent:
    """The StoredEvent a record holds, its floats the float32s stored (as Python floats)."""
    return event_of(_decode_record(raw))


# A record's fields as StoredEvent names them, the embedding left as its bytes (None if none)
# and the superseded ids as a tuple: for readers that look at many events' fields and few
# embeddings (Cypher's nodes); its event() (or event_of) makes the StoredEvent. The decoder's
# own method, not a function around it: Cypher decodes a record per node, thousands a query.
decode_record: Callable[[bytes | memoryview], Any] = _decode_record


# Only a record's kind, for a reader that tests it before anything else (Cypher's `i.kind =
# $kind` on an expansion's targets): msgspec skips the other fields without building them.
class _Kind(msgspec.Struct, frozen=True):
    kind: str


_decode_kind = msgspec.msgpack.Decoder(_Kind).decode


def record_kind(raw: bytes | memoryview) -> str:
    """The kind a record holds, the rest of it left undecoded."""
    return _decode_kind(raw).kind


def event_of(record: Any) -> StoredEvent:
    """The StoredEvent of a decode_record result."""
    fields = msgspec.structs.asdict(record)
    embedding = fields["embedding"]
    if embedding is not None:
        fields["embedding"] = _floats(embedding)
    fields["supersedes"] = list(fields["supersedes"])
    return StoredEvent(**fields)


# A record less its embedding, for readers that never look at it (recall's candidates, the
# supersession chains): msgspec skips the embedding's bytes by their length instead of building
# its floats. Made from StoredEvent's own fields, so the two cannot drift apart.
_Light = msgspec.defstruct(
    "_Light",
    [_field_spec(f) for f in msgspec.structs.fields(StoredEvent) if f.name != "embedding"],
    kw_only=True,
    frozen=True,
)
_decode_light = msgspec.msgpack.Decoder(_Light).decode


# A record's words only, for the erasure dry run's identifier search (storage/read/subjects.py):
# msgspec skips every other field (the embedding by its length) and no StoredEvent is built,
# which is most of what a pass over the tenant costs.
class _Words(msgspec.Struct, frozen=True, gc=False):
    event_id: str
    text: str | None = None
    properties_raw: bytes | None = None


_decode_words = msgspec.msgpack.Decoder(list[_Words]).decode


def decode_words(
    raws: list[bytes] | list[bytes | memoryview],
) -> list[tuple[str, str | None, bytes | None]]:
    """Records' ids, texts and properties JSON, the rest left undecoded: all in one call, the
    records framed as one msgpack array (a call per record cost as much as the rest)."""
    framed = b"".join([b"\xdd", len(raws).to_bytes(4, "big"), *raws])
    return [(w.event_id, w.text, w.properties_raw) for w in _decode_words(framed)]


def decode_light(raw: bytes | memoryview) -> StoredEvent:
    """The StoredEvent a record holds, without its embedding (None)."""
    return StoredEvent(**msgspec.structs.asdict(_decode_light(raw)))


def _floats(embedding: msgspec.msgpack.Ext | bytes) -> list[float]:
    """A record's embedding as a list: its float32s (or a version 5 record's float64s)."""
    # array.array is the fastest of the ways measured (bench/RESULTS.md, "Code choices measured").
    if isinstance(embedding, msgspec.msgpack.Ext):
        values = array.array("f", cast(bytes, embedding.data))  # bytes, as msgspec decodes it
    else:
        values = array.array("d", embedding)
    if _SWAP:
        values.byteswap()
    return values.tolist()


def space_name(space: int | None) -> str:
    """Who makes a tenant's vectors, as whoami and the usage name it."""
    return {SPACE_SERVER: "server", SPACE_CLIENT: "client"}.get(space or 0, "none")

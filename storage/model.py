"""The stored form of an event and the append request the engine takes."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from storage.errors import InvalidRequest, MemspineError, QuotaExceeded
from storage.floats import shortest

FilterValue = bool | int | float | str

# Relationship types between events (storage/log/layout.py gives each the byte its link keys carry).
SOURCE_FROM = "SOURCE_FROM"
SUPERSEDES = "SUPERSEDES"


class NewEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event to append; `new_event` makes one that keeps the event's rules (below)."""

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
    subjects: tuple[str, ...] = ()  # the people the event is about (check_subjects)


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
    subjects: list[str] = []  # the people the event is about (check_subjects), in sent order

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
            obj["embedding"] = self.embedding_out()
        if self.subjects:
            obj["subjects"] = list(self.subjects)
        return obj

    def embedding_out(self) -> list[float] | None:
        """The embedding as every door returns it: each stored float32 as its shortest decimal
        (storage/floats.py), so a vector comes back as sent, to float32's precision."""
        return None if self.embedding is None else shortest(self.embedding)


MAX_SUBJECTS = 16
MAX_SUBJECT_BYTES = 128


def check_subject(subject: object, field: str = "subject") -> str:
    """One subject id: 1 to 128 bytes of printable ASCII (space included); InvalidRequest
    naming `field`."""
    if not isinstance(subject, str) or not subject:
        raise InvalidRequest(f"{field} must be a non-empty string")
    raw = subject.encode()
    if len(raw) > MAX_SUBJECT_BYTES:
        raise InvalidRequest(f"{field} may be at most {MAX_SUBJECT_BYTES} bytes")
    if not all(0x20 <= b < 0x7F for b in raw):
        raise InvalidRequest(f"{field} must be printable ASCII (no control or non-ASCII bytes)")
    return subject


def check_subjects(value: object, field: str = "subjects") -> tuple[str, ...]:
    """An event's subjects: at most 16 distinct ids (check_subject), in the order sent."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidRequest(f"{field} must be a list of subject ids")
    if len(value) > MAX_SUBJECTS:
        raise InvalidRequest(f"{field} may name at most {MAX_SUBJECTS} subjects")
    checked = [check_subject(s, f"{field}[{i}]") for i, s in enumerate(value)]
    return tuple(dict.fromkeys(checked))


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
CONVERSATION = "conversation"  # the property that names a turn's conversation (its chain's key)


def conversation_of(ev: StoredEvent) -> FilterValue | None:
    """The conversation a turn belongs to (its filterable `conversation` property), None if
    it names none."""
    return ev.filterable.get(CONVERSATION)


class StoredVector(msgspec.Struct, frozen=True):
    """A vector the server made for a live event, to write into its record."""

    event_id: str
    seq: int  # the event's append seq, checked so that an id reused since is never given it
    vector: list[float]


# -- The event's rules ------------------------------------------------------------------------
# One home for what an event may hold, whichever door it came through: the HTTP API and its
# batches (memspine/schemas.py), the MCP tools (through the same operations) and import
# (storage/transfer/format.py). Each rule checks one field's value and raises InvalidRequest
# with a sentence naming the field; `FIELD_RULES` lists them by NewEvent/StoredEvent field, so a
# new field's rule is one function and one line of the table.

MAX_KIND_BYTES = 64
MAX_TEXT_CHARS = 100_000
MAX_IDS = 1000
MAX_TS = 2**62
MAX_MODEL_CHARS = 200
MAX_EMBEDDING_DIM = 4096  # MEMSPINE_EMBEDDING_DIM's bound: no tenant has longer vectors
# The vector index holds float32: a larger magnitude becomes infinite there, then NaN in every
# distance it enters, and spoils the tenant's recall (docs/api.md, "Append an event").
FLOAT32_MAX = 3.4028234663852886e38
MAX_PROPERTIES_NESTING = 32  # memspine/jsonbounds.py's MAX_NESTING: what every reader parses
KIND_PATTERN = "^[^\\x00-\\x1f\\x7f]+$"
_KIND = re.compile(r"^[^\x00-\x1f\x7f]+\Z")  # \Z: "$" would accept a trailing newline


def check_kind(kind: str, field: str = "kind") -> str:
    """A kind is 1-64 bytes of printable text."""
    if not kind or len(kind.encode()) > MAX_KIND_BYTES or not _KIND.match(kind):
        raise InvalidRequest(f"{field} must be 1 to {MAX_KIND_BYTES} bytes of printable text")
    return kind


def check_text(text: str, field: str = "text", limit: int = MAX_TEXT_CHARS) -> str:
    """At most `limit` characters."""
    if len(text) > limit:
        raise InvalidRequest(f"{field} may be at most {limit} characters")
    return text


def check_embedding(values: list[float], field: str = "embedding") -> list[float]:
    """1 to MAX_EMBEDDING_DIM values, each finite and within float32's range."""
    if not values:
        raise InvalidRequest(f"{field} must not be empty")
    if len(values) > MAX_EMBEDDING_DIM:
        raise InvalidRequest(f"{field} may hold at most {MAX_EMBEDDING_DIM} values")
    # One C loop per append (about twice a sum's cost; min and max compare object by object,
    # ten times slower): the vector's length bounds each value's magnitude, and it is NaN or
    # infinite when a value is (a NaN compares false). Only a refusal, or a vector of values near
    # the bound, pays for the search of the index to name.
    if math.hypot(*values) <= FLOAT32_MAX:
        return values
    for i, v in enumerate(values):
        if not math.isfinite(v):
            raise InvalidRequest(
                f"{field} must contain only finite numbers (no NaN or infinity): "
                f"{field}[{i}] is {v}"
            )
        if abs(v) > FLOAT32_MAX:
            raise InvalidRequest(
                f"{field}[{i}] is {v:g}, beyond what a float32 vector holds (±3.4e38): "
                "send values of a real embedding"
            )
    return values  # an overflowing sum of values that are each in range


def check_model(model: str, field: str = "embedding_model") -> str:
    """1 to MAX_MODEL_CHARS characters."""
    if not 0 < len(model) <= MAX_MODEL_CHARS:
        raise InvalidRequest(f"{field} must be 1 to {MAX_MODEL_CHARS} characters")
    return model


def check_ts(value: int, field: str) -> int:
    """Microseconds since the Unix epoch, from 0 to 2^62 (memspine/schemas.py adds the check of
    a plausible unit that a request may turn off)."""
    if not 0 <= value < MAX_TS:
        raise InvalidRequest(f"{field} must be microseconds since the Unix epoch, from 0 to 2^62")
    return value


def check_ids(value: Any, field: str) -> tuple[str, ...]:
    """A list of at most MAX_IDS strings (ids); non-UUID strings are kept: they come back as
    unlinked."""
    # A tuple of types, not `list | tuple`: that builds a union object at each call.
    if not isinstance(value, (list, tuple)) or (
        value and not all(isinstance(v, str) for v in value)
    ):
        raise InvalidRequest(f"{field} must be a list of event id strings")
    if len(value) > MAX_IDS:
        raise InvalidRequest(f"{field} may name at most {MAX_IDS} events")
    return tuple(value)


def read_properties(raw: bytes) -> dict[str, Any]:
    """An event's properties bytes as the object they hold: a JSON object whose numbers are
    finite (1e400 is refused, not stored) nested at most MAX_PROPERTIES_NESTING levels."""
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        reason = str(exc).split(" - at ")[0].lower()  # "number out of range"
        if "number" not in reason:  # an import's properties_text; a body's were parsed already
            raise InvalidRequest(f"properties are not valid JSON ({reason})") from None
        raise InvalidRequest(
            f"properties hold a number no JSON reader can hold ({reason}): "
            "numbers must be finite, within ±1.8e308"
        ) from None
    except RecursionError:
        value = None  # deeper than msgspec reads: refused below as too deep
        raw = b"{" * (MAX_PROPERTIES_NESTING + 1)
    if value is not None and not isinstance(value, dict):
        raise InvalidRequest("properties must be a JSON object")
    if raw.count(b"[") + raw.count(b"{") > MAX_PROPERTIES_NESTING and _deeper(value):
        raise InvalidRequest(
            f"properties may nest at most {MAX_PROPERTIES_NESTING} levels of objects and arrays"
        )
    return value or {}


def _deeper(value: Any) -> bool:
    """Whether a decoded value (None: one msgspec could not read) nests past the bound."""
    if value is None:
        return True
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_PROPERTIES_NESTING:
                return True
            stack.extend(
                (c, depth + 1) for c in (item.values() if isinstance(item, dict) else item)
            )
    return False


# The rule of each field, by its name in NewEvent and StoredEvent; a field left None is absent.
FIELD_RULES: dict[str, Callable[[Any], object]] = {
    "kind": check_kind,
    "text": check_text,
    "embedding": check_embedding,
    "embedding_model": check_model,
    "properties_raw": read_properties,
    "ts": lambda v: check_ts(v, "ts"),
    "valid_from": lambda v: check_ts(v, "valid_from"),
    "valid_until": lambda v: check_ts(v, "valid_until"),
    "supersedes": lambda v: check_ids(v, "supersedes"),
}


def check_event(fields: Mapping[str, Any]) -> None:
    """Every rule of FIELD_RULES on the fields given (by name), then the rules between fields;
    InvalidRequest naming the first field that breaks one."""
    for name, value in fields.items():
        rule = FIELD_RULES.get(name)
        if rule is not None and value is not None:
            rule(value)
    valid_from, valid_until = fields.get("valid_from"), fields.get("valid_until")
    if valid_from is not None and valid_until is not None and valid_from >= valid_until:
        raise InvalidRequest("valid_from must be earlier than valid_until")


def new_event(*, properties_raw: bytes | None = None, **fields: Any) -> NewEvent:
    """A NewEvent whose fields keep the event's rules; its source ids are read from
    properties.source_event_ids. InvalidRequest names the first field that breaks a rule."""
    sources: tuple[str, ...] = ()
    if properties_raw is not None:
        found = read_properties(properties_raw).get("source_event_ids")
        if found is not None:
            sources = check_ids(found, "properties.source_event_ids")
    check_event(fields)
    return NewEvent(properties_raw=properties_raw, source_ids=sources, **fields)

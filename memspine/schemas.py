"""Request and response bodies (msgspec Structs) and their validation into engine calls."""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import msgspec

from memspine import integers
from memspine.jsonbounds import check_body_nesting
from storage import (
    KIND_PATTERN,
    MAX_EMBEDDING_DIM,
    MAX_FILTER_NAME_BYTES,
    MAX_FILTER_STRING_BYTES,
    MAX_IDS,
    MAX_KIND_BYTES,
    MAX_MODEL_CHARS,
    MAX_QUERY_CHARS,
    MAX_SUBJECT_BYTES,
    MAX_SUBJECTS,
    MAX_TEXT_CHARS,
    MAX_TS,
    SUBJECT_PROPERTY,
    NewEvent,
    RecallQuery,
    RecallResult,
    StoredEvent,
    Walk,
    Withheld,
    check_embedding,
    check_kind,
    check_subject,
    check_subjects,
    check_text,
    is_filterable_value,
    new_event,
)
from storage import PROPERTY_NAME as FILTER_NAME
from storage import check_model as model_rule
from storage.errors import InvalidRequest

T = TypeVar("T")

MAX_IDEMPOTENCY_KEY = 255
MAX_RECALL_TEXT_CHARS = 10_000
MAX_K, MAX_HOPS = 100, 3
_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]+\Z")
# A time a client sends must fall from 2000 through 9999 unless the request says
# `Memspine-Time-Check: off`: seconds or milliseconds read as microseconds land in January
# 1970, nanoseconds past the year 10000, and either would be stored without a word.
EARLIEST_TS = 946_684_800_000_000  # 2000-01-01T00:00:00Z
LATEST_TS = 253_402_300_800_000_000  # 10000-01-01T00:00:00Z, excluded


def doc(description: str = "", **schema: Any) -> msgspec.Meta:
    """JSON Schema for /schema/openapi.json only: msgspec checks none of it while decoding (the
    checks below do, with sentences in the API's words)."""
    return msgspec.Meta(description=description or None, extra_json_schema=schema)


# The bounds schemas can state; to_new_event and to_recall_query enforce them.
TIME = {"minimum": EARLIEST_TS, "maximum": LATEST_TS - 1}
KIND_SCHEMA = {"minLength": 1, "maxLength": MAX_KIND_BYTES, "pattern": KIND_PATTERN}
Kind = Annotated[str, doc(f"1-{MAX_KIND_BYTES} bytes of printable text.", **KIND_SCHEMA)]
Time = Annotated[int, doc("Microseconds since the Unix epoch, 2000 through 9999.", **TIME)]
From = Annotated[
    int,
    doc("Microseconds since the Unix epoch, 2000 through 9999, or 0.", anyOf=[{"const": 0}, TIME]),
]
Vector = Annotated[
    list[float],
    doc(
        "Finite numbers within float32's range (±3.4e38), as many as the tenant's dimension.",
        minItems=1,
        maxItems=MAX_EMBEDDING_DIM,
    ),
]
Model = Annotated[str, doc(minLength=1, maxLength=MAX_MODEL_CHARS)]
Ids = Annotated[list[str], doc(f"Event ids, at most {MAX_IDS}.", maxItems=MAX_IDS)]
SUBJECT_SCHEMA = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_SUBJECT_BYTES,
    "pattern": "^[ -~]+$",
}
Subject = Annotated[str, doc(**SUBJECT_SCHEMA)]
Subjects = Annotated[
    list[Subject],
    doc(
        f"The people the event is about: at most {MAX_SUBJECTS} ids of 1-{MAX_SUBJECT_BYTES} "
        "printable ASCII bytes.",
        maxItems=MAX_SUBJECTS,
    ),
]
Properties = Annotated[
    msgspec.Raw,
    doc(
        "A JSON object, stored and returned byte for byte; null or absent: none.",
        type=["object", "null"],
        properties={
            "source_event_ids": {
                "type": ["array", "null"],
                "items": {"type": "string"},
                "maxItems": MAX_IDS,
            }
        },
    ),
]
FILTER_VALUE = {
    "anyOf": [
        {"type": "boolean"},
        {"type": "number"},
        {"type": "string", "maxLength": MAX_FILTER_STRING_BYTES},
    ]
}
PROPERTY_NAME = f"^[A-Za-z][A-Za-z0-9_]{{0,{MAX_FILTER_NAME_BYTES - 1}}}$"
Filter = Annotated[
    dict[str, bool | int | float | str],
    doc(
        "Equality on filterable properties.",
        propertyNames={"pattern": PROPERTY_NAME},
        additionalProperties=FILTER_VALUE,
    ),
]


class EventIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/memory/event."""

    kind: Kind
    ts: Time | None = None
    text: Annotated[str, doc(maxLength=MAX_TEXT_CHARS)] | None = None
    embedding: Vector | None = None
    embedding_model: Model | None = None
    properties: Properties | msgspec.UnsetType = msgspec.UNSET  # kept as sent
    supersedes: Ids | None = None
    valid_from: From | None = None
    valid_until: Time | None = None
    subjects: Subjects | None = None


class EventCreated(msgspec.Struct, omit_defaults=True):
    """The answer to an append: the id, and any source or supersedes ids that named no event."""

    event_id: str
    unlinked: list[str] = []


class RecallIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/memory/recall: text, an embedding, or both."""

    text: Annotated[str, doc(maxLength=MAX_RECALL_TEXT_CHARS)] | None = None
    embedding: Vector | None = None
    embedding_model: Model | None = None
    kind: Kind | None = None
    k: Annotated[int, doc(minimum=1, maximum=MAX_K)] = 10
    hops: Annotated[int, doc(minimum=0, maximum=MAX_HOPS)] = 0
    filter: Filter | None = None
    current: bool = True
    as_of: Time | None = None
    explain: bool = False
    wait_for_vectors: bool = False


class CypherIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/memory/cypher."""

    query: Annotated[str, doc("One read-only openCypher query.", maxLength=MAX_QUERY_CHARS)]
    params: dict[str, Any] | None = None


def decode_body(body: bytes, type_: type[T]) -> T:
    """Decode a JSON body into a Struct, with a sentence that says what to fix."""
    if not body.strip():
        raise InvalidRequest("the request body is empty; send a JSON object")
    check_body_nesting(body)  # before msgspec, which recurses once per level
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        lax = (
            integers.decode(body, type_)
            if integers.INT_WORDS.search(str(exc)) is not None
            else None
        )
        if lax is not None:  # 2.0 where an integer goes: an integer to JSON Schema
            return lax
        raise InvalidRequest(f"invalid request body: {_explain(str(exc))}") from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None


def convert_body(values: dict[str, Any], type_: type[T]) -> T:
    """A body given as Python values (the MCP tools) into its Struct, in decode_body's words."""
    try:
        return msgspec.convert(values, type=type_)
    except msgspec.ValidationError as exc:
        lax = (
            integers.convert(values, type_)
            if integers.INT_WORDS.search(str(exc)) is not None
            else None
        )
        if lax is not None:
            return lax
        raise InvalidRequest(f"invalid request body: {_explain(str(exc))}") from None


def event_in(values: dict[str, Any]) -> EventIn:
    """An append body from Python values; its properties become the JSON bytes that are stored."""
    properties = values.get("properties")
    event = convert_body({k: v for k, v in values.items() if k != "properties"}, EventIn)
    if properties is not None:
        event.properties = msgspec.Raw(msgspec.json.encode(properties))
    return event


def plain(value: Any) -> Any:
    """An answer as plain Python values, as a client decodes it (stored properties decoded)."""
    return msgspec.to_builtins(value, enc_hook=_decode_raw)


def _decode_raw(value: Any) -> Any:
    if isinstance(value, msgspec.Raw):
        return msgspec.json.decode(value)
    raise TypeError(f"cannot render {type(value).__name__}")


def _explain(message: str) -> str:
    """Msgspec's message with `$.` paths made readable ("at `$.kind`" -> "at kind")."""
    return message.replace("`$.", "`").replace("`$`", "the body")


# A time a client sends must fall from EARLIEST_TS to LATEST_TS unless the request says
# `Memspine-Time-Check: off` (constants above the Structs, which document them).
TIME_CHECK_HEADER = "Memspine-Time-Check"
_UNITS = (("seconds", 1_000_000, 1), ("milliseconds", 1000, 1), ("nanoseconds", 1, 1000))


def time_check(value: str | None) -> bool:
    """Whether a request's times are checked for a plausible unit: on unless the header says off."""
    if value is None or value.strip().lower() == "on":
        return True
    if value.strip().lower() == "off":
        return False
    raise InvalidRequest(f"{TIME_CHECK_HEADER} must be on or off")


def check_time(
    value: int | None, field: str, *, checked: bool = True, zero: bool = False
) -> int | None:
    """Microseconds from 0 to 2^62 and, when checked, from 2000 through 9999 (0 too if `zero`:
    a lower bound meaning "from the start")."""
    if value is None:
        return None
    if not 0 <= value < MAX_TS:
        raise InvalidRequest(f"{field} must be microseconds since the Unix epoch, from 0 to 2^62")
    if not checked or EARLIEST_TS <= value < LATEST_TS or (zero and value == 0):
        return value
    raise InvalidRequest(_unit_hint(value, field))


def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _unit_hint(value: int, field: str) -> str:
    """Why a time is refused: the unit it seems to be in, and what to send instead."""
    keep = f"or the header {TIME_CHECK_HEADER}: off to keep it as it is"
    seen = (
        f"as microseconds it is {_iso(value)}"
        if value < LATEST_TS
        else "as microseconds it is after the year 9999"
    )
    for unit, times, over in _UNITS:
        us = value * times // over
        if EARLIEST_TS <= us < LATEST_TS:
            return (
                f"{field} {value} looks like {unit}: times are microseconds since the Unix epoch "
                f"and {seen}; send {us} ({_iso(us)}), {keep}"
            )
    return (
        f"{field} {value} is outside 2000-01-01 to 9999-12-31: times are microseconds since "
        f"the Unix epoch and {seen}; send microseconds, {keep}"
    )


def idempotent_id(tenant_id: str, key: str) -> str:
    """uuid5(uuid5(NAMESPACE_URL, "memspine:" + tenant), key), as docs/api.md states it."""
    namespace = uuid.uuid5(uuid.NAMESPACE_URL, "memspine:" + tenant_id)
    return str(uuid.uuid5(namespace, key))


def check_idempotency_key(key: str, field: str = "Idempotency-Key") -> str:
    """1–255 printable ASCII characters."""
    if not 0 < len(key) <= MAX_IDEMPOTENCY_KEY or not _IDEMPOTENCY_KEY.match(key):
        raise InvalidRequest(
            f"{field} must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters"
        )
    return key


def to_new_event(
    body: EventIn, *, tenant_id: str, idempotency_key: str | None, check_times: bool = True
) -> NewEvent:
    """Validate an append body and turn it into the engine's NewEvent: the request's own checks
    here (times of a plausible unit, the key), the event's rules in storage.model.new_event."""
    ts = check_time(body.ts, "ts", checked=check_times)
    check_time(body.valid_from, "valid_from", checked=check_times, zero=True)
    check_time(body.valid_until, "valid_until", checked=check_times)
    event_id = None
    if idempotency_key is not None:
        event_id = idempotent_id(tenant_id, check_idempotency_key(idempotency_key))
    raw = bytes(body.properties) if body.properties is not msgspec.UNSET else None
    new = new_event(
        kind=body.kind,
        ts=ts if ts is not None else time.time_ns() // 1000,
        text=body.text,
        embedding=body.embedding,
        embedding_model=body.embedding_model,
        properties_raw=raw if raw != b"null" else None,
        supersedes=_ids(body.supersedes),
        valid_from=body.valid_from,
        valid_until=body.valid_until,
        event_id=event_id,
        subjects=check_subjects(body.subjects),
    )
    if idempotency_key is None:
        return new
    return msgspec.structs.replace(new, body_hash=_body_hash(body))


def _ids(value: list[str] | None) -> tuple[str, ...]:
    return tuple(value) if value is not None else ()


def _body_hash(body: EventIn) -> bytes:
    """SHA-256 of the body in a canonical form (sorted keys), so whitespace changes are the same
    body; an event of a batch hashes as the same event sent alone (its key left out)."""
    obj: dict[str, Any] = {f: getattr(body, f) for f in EventIn.__struct_fields__}
    raw = body.properties
    obj["properties"] = msgspec.json.decode(raw) if raw is not msgspec.UNSET else None
    if obj["subjects"] is None:  # absent: the hash an event had before subjects existed
        del obj["subjects"]
    return hashlib.sha256(msgspec.json.encode(obj, order="sorted")).digest()


class EventOut(msgspec.Struct):
    """An event as GET and listing return it; properties are the bytes the client sent."""

    event_id: str
    kind: str
    ts: int
    text: str | None
    properties: Annotated[msgspec.Raw, doc("As sent; {} when none were.", type="object")]
    embedding: list[float] | msgspec.UnsetType = msgspec.UNSET
    embedding_model: str | msgspec.UnsetType = msgspec.UNSET
    supersedes: list[str] | msgspec.UnsetType = msgspec.UNSET
    valid_from: int | msgspec.UnsetType = msgspec.UNSET
    valid_until: int | msgspec.UnsetType = msgspec.UNSET
    current: bool | msgspec.UnsetType = msgspec.UNSET
    superseded_by: list[str] | msgspec.UnsetType = msgspec.UNSET
    subjects: list[str] | msgspec.UnsetType = msgspec.UNSET


def _set(value: T | None) -> T | msgspec.UnsetType:
    """None becomes UNSET, so optional fields are left out rather than sent as null."""
    return msgspec.UNSET if value is None else value


def event_out(
    ev: StoredEvent,
    *,
    with_embedding: bool = True,
    current: bool | None = None,
    superseded_by: list[str] | None = None,
) -> EventOut:
    """The client's view of a stored event: event_id, kind, ts, text and properties always, the
    others when they apply."""
    return EventOut(
        event_id=ev.event_id,
        kind=ev.kind,
        ts=ev.ts,
        text=ev.text,
        embedding=_set(ev.embedding_out()) if with_embedding else msgspec.UNSET,
        embedding_model=_set(ev.embedding_model),
        properties=msgspec.Raw(ev.properties_raw or b"{}"),
        supersedes=ev.supersedes or msgspec.UNSET,
        valid_from=_set(ev.valid_from),
        valid_until=_set(ev.valid_until),
        current=_set(current),
        superseded_by=_set(superseded_by),
        subjects=ev.subjects or msgspec.UNSET,
    )


class EventPage(msgspec.Struct):
    """One page of a listing, newest first, and the cursor of the next (null on the last)."""

    events: list[EventOut]
    next_cursor: str | None


class DeleteDone(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A delete's answer; `purge_pending` and `detail` only when a purge asked for is pending."""

    deleted: bool
    purged: bool
    purge_pending: bool | msgspec.UnsetType = msgspec.UNSET
    deleted_ids: list[str]
    detail: str | msgspec.UnsetType = msgspec.UNSET


class WouldDelete(msgspec.Struct):
    """A dry run's answer: what the delete would remove, the event first."""

    would_delete: list[str]


class HitOut(msgspec.Struct):
    """One recall hit as the client sees it."""

    event_id: str
    kind: str
    ts: int
    text: str | None
    properties: Annotated[msgspec.Raw, doc("As sent; {} when none were.", type="object")]
    score: float
    via: str | msgspec.UnsetType = msgspec.UNSET
    hop: int | msgspec.UnsetType = msgspec.UNSET
    replaces: list[str] | msgspec.UnsetType = msgspec.UNSET
    keyword_rank: int | msgspec.UnsetType | None = msgspec.UNSET  # with explain, ranked hits only
    vector_rank: int | msgspec.UnsetType | None = msgspec.UNSET
    # With explain, ranked hits only: the other arms that returned it (docs/recall.md).
    arm_ranks: dict[str, int] | msgspec.UnsetType = msgspec.UNSET
    subjects: list[str] | msgspec.UnsetType = msgspec.UNSET


class PersonOut(msgspec.Struct):
    """A person the recall's text names, as the tenant holds them."""

    property: str
    value: str


class WindowOut(msgspec.Struct):
    """A time window the recall's text names, over `ts`: from <= ts < until (µs)."""

    from_: int = msgspec.field(name="from")
    until: int


class FocusOut(msgspec.Struct):
    """With explain: what recall read the text to name, which its focus and time arms used."""

    people: list[PersonOut]
    dates: list[WindowOut]
    asks_when: bool


class RecallOut(msgspec.Struct):
    """The recall answer; `walk` appears only when hops > 0, `withheld` only when current state
    kept something out, `focus` only with explain when the text named someone, a date, or
    asked when."""

    hits: list[HitOut]
    walk: Walk | msgspec.UnsetType = msgspec.UNSET
    withheld: Withheld | msgspec.UnsetType = msgspec.UNSET
    focus: FocusOut | msgspec.UnsetType = msgspec.UNSET


def check_model(model: str | None) -> None:
    """Refuse an embedding_model name that is empty or longer than the document allows."""
    if model is not None:
        model_rule(model)


def to_recall_query(body: RecallIn, *, check_times: bool = True) -> RecallQuery:
    """Validate a recall body (limits, filter names and values, as_of) into the engine's query."""
    if body.text is not None:
        check_text(body.text, limit=MAX_RECALL_TEXT_CHARS)
    if body.kind is not None:
        check_kind(body.kind)
    check_model(body.embedding_model)
    filters = dict(body.filter or {})
    if "subject" in filters:  # the subjects' index, not a property (docs/api.md, "Subjects")
        filters[SUBJECT_PROPERTY] = check_subject(filters.pop("subject"), "filter 'subject'")
    for name, value in filters.items():
        if name == SUBJECT_PROPERTY:
            continue
        if not FILTER_NAME.match(name) or len(name) > MAX_FILTER_NAME_BYTES:
            raise InvalidRequest(
                f"filter '{name}' is not a filterable property name (letters, digits, underscores; starting with a letter)"
            )
        if not is_filterable_value(value):
            raise InvalidRequest(
                f"filter '{name}' must be a boolean, a finite number or a string of at most 256 bytes"
            )
    check_time(body.as_of, "as_of", checked=check_times)
    return RecallQuery(
        text=body.text,
        embedding=check_embedding(body.embedding) if body.embedding is not None else None,
        embedding_model=body.embedding_model,
        kind=body.kind,
        k=body.k,
        hops=body.hops,
        filters=filters,
        current=body.current,
        as_of=body.as_of,
        explain=body.explain,
    )


def recall_out(result: RecallResult) -> RecallOut:
    """The client's view of a recall result."""
    hits = [
        HitOut(
            event_id=h.event.event_id,
            kind=h.event.kind,
            ts=h.event.ts,
            text=h.event.text,
            properties=msgspec.Raw(h.event.properties_raw or b"{}"),
            score=h.score,
            via=h.via if h.via is not None else msgspec.UNSET,
            hop=h.hop if h.hop is not None else msgspec.UNSET,
            replaces=h.replaces if h.replaces else msgspec.UNSET,
            keyword_rank=h.ranks[0] if h.ranks is not None else msgspec.UNSET,
            vector_rank=h.ranks[1] if h.ranks is not None else msgspec.UNSET,
            arm_ranks=h.arm_ranks if h.arm_ranks is not None else msgspec.UNSET,
            subjects=h.event.subjects or msgspec.UNSET,
        )
        for h in result.hits
    ]
    focus = result.focus
    return RecallOut(
        hits=hits,
        walk=result.walk if result.walk is not None else msgspec.UNSET,
        withheld=result.withheld if result.withheld is not None else msgspec.UNSET,
        focus=msgspec.UNSET
        if focus is None
        else FocusOut(
            # As the focus arms use them: one person named gets arms, several get none.
            people=[PersonOut(property=p, value=v) for p, v in focus.people],
            dates=[WindowOut(from_=lo, until=hi) for lo, hi in focus.windows],
            asks_when=focus.when,
        ),
    )

"""What an erasure by subject reaches (docs/erasure.md, "Erasure by subject"): the events tagged
with the subject, those derived from them, and those whose text or properties name one of the
identifiers a person gave; one snapshot, nothing written."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable
from itertools import accumulate

import msgspec

from storage.errors import InvalidRequest
from storage.log import layout
from storage.log.reader import LogReader
from storage.read.cascade import derived_closure
from storage.read.retention import Hold, refuse_held

SUBJECT = "subject"  # the reasons an event is reached, as the answer names them
DERIVED = "derived"
IDENTIFIER = "identifier"
MAX_IDENTIFIERS = 20
MIN_IDENTIFIER_CHARS = 3  # shorter would match most of a tenant
MAX_IDENTIFIER_CHARS = 256
MAX_CONFIRM_IDS = 10_000
CHUNK = 2048  # records folded and searched at once by matching
_WORD = re.compile(r"\w+")


class Reach(msgspec.Struct, frozen=True, kw_only=True):
    """What to look for: the subject, identifiers (lowercased when matched), the ids a person
    confirmed among the identifiers' matches, and whether derived events go too."""

    subject: str
    identifiers: tuple[str, ...] = ()
    confirm_ids: tuple[str, ...] = ()
    cascade: bool = True


class Reached(msgspec.Struct, frozen=True, kw_only=True):
    """One event an erasure would reach, and why (SUBJECT, DERIVED, IDENTIFIER)."""

    event_id: str
    kind: str
    ts: int
    reasons: list[str]


def check_identifiers(value: Iterable[str] | None) -> tuple[str, ...]:
    """At most MAX_IDENTIFIERS distinct strings of 3 to 256 characters; 400 naming the field."""
    given = list(value or ())
    if len(given) > MAX_IDENTIFIERS:
        raise InvalidRequest(f"identifiers may hold at most {MAX_IDENTIFIERS} strings")
    for i, ident in enumerate(given):
        if len(ident.strip()) < MIN_IDENTIFIER_CHARS:
            raise InvalidRequest(
                f"identifiers[{i}] must be at least {MIN_IDENTIFIER_CHARS} characters "
                "(a shorter one would match nearly every event)"
            )
        if len(ident) > MAX_IDENTIFIER_CHARS:
            raise InvalidRequest(
                f"identifiers[{i}] may be at most {MAX_IDENTIFIER_CHARS} characters"
            )
    return tuple(dict.fromkeys(given))


def reach(r: LogReader, q: Reach) -> list[Reached]:
    """Every live event the erasure would reach, oldest first, with its reasons; the derived
    ones of identifier matches only for those confirmed (they are what the real run erases)."""
    reasons: dict[str, list[str]] = {}
    for event_id in tagged(r, q.subject):
        reasons.setdefault(event_id, []).append(SUBJECT)
    for event_id in matching(r, q.identifiers):
        reasons.setdefault(event_id, []).append(IDENTIFIER)
    roots = [e for e, why in reasons.items() if SUBJECT in why or e in q.confirm_ids]
    for event_id in derived(r, roots) if q.cascade else ():
        if event_id not in roots:
            reasons.setdefault(event_id, []).append(DERIVED)
    found = []
    for event_id, why in reasons.items():
        ev = r.get_light(event_id)
        if ev is not None:
            found.append(Reached(event_id=event_id, kind=ev.kind, ts=ev.ts, reasons=why))
    found.sort(key=lambda f: (f.ts, f.event_id))
    return found


def doomed(r: LogReader, q: Reach, holds: Iterable[Hold] = ()) -> list[str]:
    """The ids the real run deletes: tagged, confirmed (if still live), and with cascade
    everything derived from those; read in the delete's own transaction, so an event tagged
    or derived meanwhile goes too. LegalHold (nothing deleted) if one of `holds` keeps one."""
    roots = list(dict.fromkeys([*tagged(r, q.subject), *q.confirm_ids]))
    roots = [e for e in roots if r.exists(e)]
    ids = derived(r, roots) if q.cascade else roots
    if holds:
        refuse_held(r, holds, ids)
    return ids


def tagged(r: LogReader, subject: str) -> list[str]:
    """The live events whose subjects hold this one."""
    return list(r.ids_by_property(layout.SUBJECT, subject))


def derived(r: LogReader, roots: list[str]) -> list[str]:
    """The roots and every live event derived from any of them over SOURCE_FROM."""
    seen: dict[str, None] = {}
    for root in roots:
        if root not in seen:
            seen.update(dict.fromkeys(derived_closure(r, root)))
    return list(seen)


def matching(r: LogReader, identifiers: tuple[str, ...]) -> list[str]:
    """The live events whose text or properties name an identifier: the identifier itself,
    case folded, or every word of it as a word of the event (so "Smith, Ann" matches "Ann
    Smith"). One pass over every live record's text and properties (layout.decode_words),
    CHUNK records at a time."""
    if not identifiers:
        return []
    wanted = [(i.casefold(), frozenset(_WORD.findall(i.casefold()))) for i in identifiers]
    # A word of the identifier, which every event that names it holds (within a word of its
    # own, or as one); the longest, which fewest events hold. None: no word to look for.
    keys = [max(parts, key=len) if parts else None for _, parts in wanted]
    found: list[str] = []
    for words in r.live_words(CHUNK):
        chunk = [(event_id, _hay(text, raw)) for event_id, text, raw in words]
        found += _matching_chunk(chunk, wanted, keys)
    return found


def _matching_chunk(
    chunk: list[tuple[str, str]],
    wanted: list[tuple[str, frozenset[str]]],
    keys: list[str | None],
) -> list[str]:
    """The ids in chunk whose hay names an identifier: only those whose hay holds a key word
    (found in all of them folded at once) are tested one by one."""
    big = "\0".join(hay for _, hay in chunk)
    folded = big.casefold()
    if None in keys or len(folded) != len(big):  # no key, or offsets that moved: test each
        return [event_id for event_id, hay in chunk if _names(hay.casefold(), wanted)]
    starts = list(accumulate((len(hay) + 1 for _, hay in chunk), initial=0))
    candidates: set[int] = set()
    for key in keys:
        at = folded.find(key) if key else -1
        while at >= 0:
            k = bisect_right(starts, at) - 1
            candidates.add(k)
            at = folded.find(key, starts[k + 1]) if key else -1  # the next event's hay on
    return [
        chunk[k][0]
        for k in sorted(candidates)
        if _names(folded[starts[k] : starts[k + 1] - 1], wanted)
    ]


def _hay(text: str | None, raw: bytes | None) -> str:
    """An event's text and its properties' strings (keys and values), as one string."""
    if not raw:
        return text or ""
    if b"\\" in raw:  # an escape in the JSON: its strings as they read
        texts = [text] if text else []
        value = msgspec.json.decode(raw)
        _strings(value if isinstance(value, dict) else {}, texts)
        return " ".join(texts)
    # the JSON text itself holds every key and value as written
    props = raw.decode(errors="replace")
    return f"{text} {props}" if text else props


def _names(hay: str, wanted: list[tuple[str, frozenset[str]]]) -> bool:
    """Whether a case-folded hay holds one of the identifiers."""
    if not hay:
        return False
    words: set[str] | None = None
    for whole, parts in wanted:
        if whole in hay:
            return True
        if len(parts) > 1 and all(p in hay for p in parts):  # words only if each is there
            words = words if words is not None else set(_WORD.findall(hay))
            if parts <= words:
                return True
    return False


def _strings(value: object, into: list[str]) -> None:
    """Every string and number in a decoded JSON value (keys included), as text."""
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            into.append(key)
            _strings(item, into)
    elif isinstance(value, list):
        for item in value:
            _strings(item, into)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        into.append(str(value))

"""What an erasure by subject reaches (docs/erasure.md, "Erasure by subject"): the events tagged
with the subject, those derived from them, and those whose text or properties name one of the
identifiers a person gave; one snapshot, nothing written."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from storage.errors import InvalidRequest
from storage.index.keyword import KeywordIndex, searched_text, words
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
CHUNK = 2048  # records decoded at once by matching


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


def reach(r: LogReader, q: Reach, keyword: KeywordIndex | None = None) -> list[Reached]:
    """Every live event the erasure would reach, oldest first, with its reasons; the derived
    ones of identifier matches only for those confirmed (they are what the real run erases).
    keyword: the tenant's keyword index, which finds identifiers without a pass over the log."""
    reasons: dict[str, list[str]] = {}
    for event_id in tagged(r, q.subject):
        reasons.setdefault(event_id, []).append(SUBJECT)
    for event_id in matching(r, q.identifiers, keyword):
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


def matching(
    r: LogReader, identifiers: tuple[str, ...], keyword: KeywordIndex | None = None
) -> list[str]:
    """The live events whose text or properties (keys and values) name an identifier: hold
    every word of it as a word (keyword.words: runs of letters and digits, lowercased, folded to
    ASCII; in any order, so "Smith, Ann" matches "Ann Smith"). With the tenant's keyword index,
    its WORDS field gives the candidates and the log the rest (events appended since its last
    commit), each confirmed against its record in this snapshot; without it, one pass over
    every record (matching_by_pass)."""
    wanted = _wanted(identifiers)
    if not wanted:
        return []
    if keyword is None:
        return matching_by_pass(r, identifiers)
    seqs, covered = keyword.with_words(wanted)
    raws: dict[bytes, None] = {}
    for seq in seqs:
        if (raw_id := r.raw_id_for_seq(seq)) is not None:
            raws[raw_id] = None
    for _seq, op, event_id in r.ops_after(covered):
        if op == layout.OP_APPEND:
            raws[layout.id_bytes(event_id)] = None
    records = [rec for raw_id in raws if (rec := r.raw_record(raw_id)) is not None]
    found = []
    for i in range(0, len(records), CHUNK):
        for event_id, text, props in layout.decode_words(records[i : i + CHUNK]):
            if _names(searched_text(text, props), wanted):
                found.append(event_id)
    return found


def matching_by_pass(r: LogReader, identifiers: tuple[str, ...]) -> list[str]:
    """As matching, by one pass over every live record (the reference the index is held to)."""
    wanted = _wanted(identifiers)
    found: list[str] = []
    if not wanted:
        return found
    for chunk in r.live_words(CHUNK):
        for event_id, text, props in chunk:
            if _names(searched_text(text, props), wanted):
                found.append(event_id)
    return found


def _wanted(identifiers: tuple[str, ...]) -> list[list[str]]:
    """Each identifier's words (an identifier without any, all punctuation, names nothing)."""
    return [w for i in identifiers if (w := words(i))]


def _names(hay: str, wanted: list[list[str]]) -> bool:
    """Whether a text holds every word of one of the identifiers."""
    if not hay:
        return False
    held = set(words(hay))
    return any(held.issuperset(w) for w in wanted)

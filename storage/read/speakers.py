"""People named in a recall's text, matched against those the tenant has seen: the values of
its events' `speaker` and `actor` properties and its data subjects (docs/recall.md, "Query
focus"). A name is a capitalised word (or run of them) of the text that some event holds as
one of those values exactly; each test is one seek in the log's property index."""

from __future__ import annotations

import re
from collections.abc import Iterable

from storage.index.keyword import STOP_WORDS
from storage.log import layout
from storage.log.reader import LogReader

# The properties that say who an event is by or about, checked in this order.
PEOPLE = ("speaker", "actor", layout.SUBJECT)
MAX_CANDIDATES = 8  # names tried per text: each costs a seek per property
MAX_NAME_CHARS = 64
# The first word of a sentence is capitalised whatever it is: there it is a name only if it is
# not a word that commonly opens a question or request ("Will Ann come?" names Ann, not Will).
OPENERS = STOP_WORDS | {
    "will",
    "can",
    "may",
    "might",
    "must",
    "shall",
    "tell",
    "list",
    "name",
    "describe",
    "give",
    "please",
    "show",
    "find",
    "remind",
    "recall",
}
_NAME = re.compile(r"[A-Z][\w\-]*(?:\s+[A-Z][\w\-]*)*")
_POSSESSIVE = re.compile(r"(?:'s|\u2019s|')$")


def candidates(text: str, taken: Iterable[tuple[int, int]] = ()) -> list[str]:
    """The capitalised words and runs of them in text, possessives stripped, that may be names:
    not in a span another parse took (a date's month), not a sentence's opening common word."""
    spans = list(taken)
    out: dict[str, None] = {}
    for m in _NAME.finditer(text):
        if any(not (m.end() <= a or m.start() >= b) for a, b in spans):
            continue
        words = m.group(0).split()
        before = text[: m.start()].rstrip(" \t")
        if (not before or before[-1] in ".!?:;\n") and words[0].lower() in OPENERS:
            words = words[1:]
        words = [_POSSESSIVE.sub("", w) for w in words]
        if len(words) > 1:
            out.setdefault(" ".join(words))
        for w in words:
            out.setdefault(w)
    # A common word is no name wherever it stands ("The", "Me"): its lowercase is too common.
    names = [c for c in out if 1 < len(c) <= MAX_NAME_CHARS and c.lower() not in STOP_WORDS]
    return names[:MAX_CANDIDATES]


def people(r: LogReader, text: str, taken: Iterable[tuple[int, int]] = ()) -> list[tuple[str, str]]:
    """(property, value) for each person the text names that the tenant has seen, in text
    order: a candidate as written, else lowercased, equal to a PEOPLE property of some event."""
    found: list[tuple[str, str]] = []
    names = candidates(text, taken)
    held = [p for p in PEOPLE if names and _held(r, p)]  # a seek each, then one per name
    for name in names:
        for value in dict.fromkeys((name, name.lower())):
            hit = next((p for p in held if _seen(r, p, value)), None)
            if hit is not None:
                found.append((hit, value))
                break
    return found


def _held(r: LogReader, prop: str) -> bool:
    """Whether some event has the property at all (its name's prefix in the property index)."""
    raw = prop.encode()
    return r.more_keys_than(0, "by_prop", bytes([len(raw)]) + raw)


def _seen(r: LogReader, prop: str, value: str) -> bool:
    """Whether some event holds prop == value (a key in the property index; deleted events'
    keys go with them)."""
    return r.more_keys_than(0, "by_prop", layout.property_prefix(prop, value))

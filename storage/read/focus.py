"""Query focus: who and when a recall's text names, understood without a language model
(docs/recall.md, "Query focus"): the people the tenant has seen (storage/read/speakers.py),
the dates it names as windows over `ts` (storage/read/dates.py) and whether it asks when
(storage/read/times.py)."""

from __future__ import annotations

import re
import time

import msgspec

from storage.log.reader import LogReader
from storage.read import dates, speakers, times


class Focus(msgspec.Struct, frozen=True, kw_only=True):
    """The people ((property, value) pairs) and the time windows ([lo, hi) µs) a text names."""

    people: list[tuple[str, str]] = []
    windows: list[tuple[int, int]] = []
    date_spans: list[tuple[int, int]] = []
    when: bool = False  # the text asks when (storage/read/times.py): the time arms run

    def without(self, text: str, people: bool, dates: bool) -> str:
        """The text less the names of its people and/or its dates (what a focus arm already
        restricts to), or the text as it is if nothing else would remain."""
        out = text
        if dates:
            for a, b in sorted(self.date_spans, reverse=True):
                out = out[:a] + " " + out[b:]
        if people:
            for _prop, value in self.people:
                out = re.sub(rf"\b{re.escape(value)}(?:'s|\u2019s)?\b", " ", out, flags=re.I)
        return out if re.search(r"\w", out) else text

    def __bool__(self) -> bool:
        """Whether the text names someone or some dates (the focus arms run)."""
        return bool(self.people or self.windows)


def understand(r: LogReader, text: str, as_of: int | None) -> Focus:
    """The focus of a recall's text in this tenant; relative dates count back from as_of, else
    from the tenant's newest event (its "now": a tenant replaying old conversations has the
    dates of those), else from the clock."""
    newest: list[int | None] = []

    def newest_ts() -> int | None:
        if not newest:
            ev = next(r.newest_first(None, None, None), None)
            newest.append(ev.ts if ev is not None else None)
        return newest[0]

    def reference() -> int:
        if as_of is not None:
            return as_of
        ts = newest_ts()
        return ts if ts is not None else time.time_ns() // 1000

    found = dates.windows(text, reference)
    # A window that holds no event ranks nothing; one that holds them all, nothing new.
    windows = [(lo, hi) for lo, hi in found.windows if next(r.ids_by_ts(lo, hi), None)]
    if windows and _covering(r, windows, newest_ts()):
        windows = []
    return Focus(
        people=speakers.people(r, text, found.spans),
        windows=windows,
        date_spans=found.spans,
        when=times.asks_when(text),
    )


def embedded_question(r: LogReader, text: str, as_of: int | None) -> str:
    """The text a server that embeds makes a recall's vector from: the text less the people it
    names (docs/recall.md, "Server-embedded recall"). Every turn of a speaker starts with
    their name, so a name in the question's vector pulls toward all of that person's turns, and
    most toward their shortest ("Nate: Bye Joanna!"); the person's own arms rank by who it is."""
    return understand(r, text, as_of).without(text, people=True, dates=False)


def _covering(r: LogReader, windows: list[tuple[int, int]], newest: int | None) -> bool:
    """Whether one window holds every event of the tenant ("this year" in a tenant of this
    week): a date arm would then only rank the main arms' events again."""
    first = next(r.ids_by_ts(None, None), None)
    oldest = r.get_light(first) if first is not None else None
    if oldest is None or newest is None:
        return False
    return any(lo <= oldest.ts and newest < hi for lo, hi in windows)

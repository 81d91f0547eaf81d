"""Query focus: who and when a recall's text names, understood without a language model
(docs/recall.md, "Query focus"): the people the tenant has seen (storage/read/speakers.py) and
the dates it names as windows over `ts` (storage/read/dates.py)."""

from __future__ import annotations

import re
import time

import msgspec

from storage.log.reader import LogReader
from storage.read import dates, speakers


class Focus(msgspec.Struct, frozen=True, kw_only=True):
    """The people ((property, value) pairs) and the time windows ([lo, hi) µs) a text names."""

    people: list[tuple[str, str]] = []
    windows: list[tuple[int, int]] = []
    date_spans: list[tuple[int, int]] = []

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
        return bool(self.people or self.windows)


def understand(r: LogReader, text: str, as_of: int | None) -> Focus:
    """The focus of a recall's text in this tenant; relative dates count back from as_of, else
    from the tenant's newest event (its "now": a tenant replaying old conversations has the
    dates of those), else from the clock."""

    def reference() -> int:
        if as_of is not None:
            return as_of
        newest = next(r.newest_first(None, None, None), None)
        return newest.ts if newest is not None else time.time_ns() // 1000

    found = dates.windows(text, reference)
    return Focus(
        people=speakers.people(r, text, found.spans),
        windows=found.windows,
        date_spans=found.spans,
    )

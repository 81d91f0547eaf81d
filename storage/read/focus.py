"""Query focus: who and when a recall's text names, understood without a language model
(docs/recall.md, "Query focus"): the people the tenant has seen (storage/read/speakers.py) and
the dates it names as windows over `ts` (storage/read/dates.py)."""

from __future__ import annotations

import time

import msgspec

from storage.log.reader import LogReader
from storage.read import dates, speakers


class Focus(msgspec.Struct, frozen=True, kw_only=True):
    """The people ((property, value) pairs) and the time windows ([lo, hi) µs) a text names."""

    people: list[tuple[str, str]] = []
    windows: list[tuple[int, int]] = []

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
    return Focus(people=speakers.people(r, text, found.spans), windows=found.windows)

"""Current state: which events exist at a moment, which are superseded, and the heads of their chains."""

from __future__ import annotations

import time

import msgspec

from storage.log.reader import LogReader
from storage.model import SUPERSEDES, StoredEvent

MAX_CHAIN_HOPS = 5
# Why current state keeps an event out of an answer (recall's `withheld` counts them by these).
SUPERSEDED, EXPIRED, NOT_YET_VALID = "superseded", "expired", "not_yet_valid"


class Moment:
    """The rules of one read: `as_of` bounds what exists; `current` hides superseded and expired events."""

    def __init__(self, r: LogReader, *, current: bool = True, as_of: int | None = None) -> None:
        self.r = r
        self.current = current
        self.as_of = as_of
        self.at = as_of if as_of is not None else time.time_ns() // 1000
        self._superseded: dict[str, bool] = {}
        self._none_superseded = not r.may_supersede()  # then no event needs a probe

    def exists(self, ev: StoredEvent) -> bool:
        """Whether the event exists at this moment (ts <= as_of)."""
        return self.as_of is None or ev.ts <= self.as_of

    def in_window(self, ev: StoredEvent) -> bool:
        """Whether the moment falls inside the event's validity window."""
        if ev.valid_from is not None and self.at < ev.valid_from:
            return False
        return ev.valid_until is None or self.at < ev.valid_until

    def window_reason(self, ev: StoredEvent) -> str | None:
        """Why the moment falls outside the event's window ("not_yet_valid", "expired"), or None."""
        if ev.valid_from is not None and self.at < ev.valid_from:
            return NOT_YET_VALID
        if ev.valid_until is not None and self.at >= ev.valid_until:
            return EXPIRED
        return None

    def superseders(self, ev: StoredEvent) -> list[StoredEvent]:
        """Live events that exist at this moment and name ev in `supersedes`."""
        out: list[StoredEvent] = []
        if self._none_superseded:
            return out
        for other_id in self.r.links_in(ev.event_id, SUPERSEDES):
            other = self.r.get_light(other_id)  # no caller reads a superseder's embedding
            if other is not None and self.exists(other):
                out.append(other)
        return out

    def is_superseded(self, ev: StoredEvent) -> bool:
        """Whether a live event existing at this moment supersedes ev."""
        cached = self._superseded.get(ev.event_id)
        if cached is None:
            cached = bool(self.superseders(ev))
            self._superseded[ev.event_id] = cached
        return cached

    def is_current(self, ev: StoredEvent) -> bool:
        """Exists, is inside its window and is superseded by nothing that exists."""
        return self.exists(ev) and self.in_window(ev) and not self.is_superseded(ev)

    def visible(self, ev: StoredEvent) -> bool:
        """What listing shows and the walk may reach: every existing event, or only current ones."""
        return self.exists(ev) and (not self.current or self.is_current(ev))

    def heads(self, ev: StoredEvent) -> list[StoredEvent]:
        """The current events at the end of ev's supersession chains (at most 5 hops, cycle-safe)."""
        seen = {ev.event_id}
        frontier = [ev]
        heads: list[StoredEvent] = []
        for _hop in range(MAX_CHAIN_HOPS):
            nxt: list[StoredEvent] = []
            for node in frontier:
                for newer in self.superseders(node):
                    if newer.event_id in seen:
                        continue
                    seen.add(newer.event_id)
                    if self.is_current(newer):
                        heads.append(newer)
                    else:
                        nxt.append(newer)
            if not nxt:
                break
            frontier = nxt
        return heads


class EventState(msgspec.Struct, frozen=True):
    """An event with whether it is current now and the live events that supersede it directly."""

    event: StoredEvent
    current: bool
    superseded_by: list[str]


def event_state(r: LogReader, event_id: str) -> EventState | None:
    """The live event with this id and its current state now; None for an unknown or deleted id."""
    ev = r.get(event_id)
    if ev is None:
        return None
    moment = Moment(r)
    newer = [e.event_id for e in moment.superseders(ev)]
    # is_current would look the superseders up a second time: use the list we have.
    current = moment.exists(ev) and moment.in_window(ev) and not newer
    return EventState(event=ev, current=current, superseded_by=newer)

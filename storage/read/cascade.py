"""Cascading deletes: an event together with every event derived from it over SOURCE_FROM."""

from __future__ import annotations

from storage.log.reader import LogReader
from storage.model import SOURCE_FROM


def derived_closure(r: LogReader, event_id: str) -> list[str]:
    """The event, then every live event that reaches it over SOURCE_FROM, breadth first in link
    (append) order; empty if the event does not exist. SUPERSEDES is not followed."""
    if not r.exists(event_id):
        return []
    order = [event_id]
    seen = {event_id}
    i = 0
    while i < len(order):
        for derived in r.links_in(order[i], SOURCE_FROM):
            if derived not in seen:
                seen.add(derived)
                order.append(derived)
        i += 1
    return order


def would_delete(r: LogReader, event_id: str, *, cascade: bool) -> list[str]:
    """The ids a delete of this event would remove, the event first; empty if it does not exist."""
    if cascade:
        return derived_closure(r, event_id)
    return [event_id] if r.exists(event_id) else []

"""Where a chain of turns starts (docs/recall.md, "Server-embedded recall"): a turn carries the
stored vector of the previous turn *of its conversation* (its `conversation` property; turns
without one chain with each other), so two conversations written at once in one tenant keep
their chains apart."""

from __future__ import annotations

from collections.abc import Mapping

from storage.log.reader import LogReader
from storage.model import CHAIN_GAP_US, CHAIN_KIND, FilterValue, StoredEvent, conversation_of

MAX_STEPS = 256  # earlier turns read looking for the start of each conversation in a batch

Key = FilterValue | None


def starts_of(before: StoredEvent | Mapping[Key, StoredEvent] | None) -> dict[Key, StoredEvent]:
    """Chain starts by conversation, from one stored turn (the start of its own) or a mapping."""
    if before is None:
        return {}
    if isinstance(before, StoredEvent):
        return {conversation_of(before): before}
    return dict(before)


def chain_starts(r: LogReader, events: list[StoredEvent], scan: int) -> dict[Key, StoredEvent]:
    """For each conversation of these events' turns, the latest stored turn of it appended
    before the first of them that has a vector: the turns before, newest first, up to
    MAX_STEPS of them (each looked for at most `scan` ops back), and none older than the
    chain's gap before the earliest of these turns (it could start no chain)."""
    turns = [ev for ev in events if ev.kind == CHAIN_KIND]
    if not turns:
        return {}
    wanted = {conversation_of(ev) for ev in turns}
    oldest = min(ev.ts for ev in turns) - CHAIN_GAP_US
    starts: dict[Key, StoredEvent] = {}
    seq = events[0].seq
    for _ in range(MAX_STEPS):
        ev = r.chain_before(seq, CHAIN_KIND, scan)
        if ev is None or ev.ts < oldest:
            break
        key = conversation_of(ev)
        if key in wanted:
            starts.setdefault(key, ev)
            if len(starts) == len(wanted):
                break
        seq = ev.seq
    return starts

"""The reply arm (docs/recall.md, "Replies and times"): the turn right after each question turn
among a recall's first fused hits. A turn that answers is often elliptical ("Yep! A
contemporary piece.") and ranks below the question it answers, which matches the recall's words;
this arm ranks it beside that question."""

from __future__ import annotations

from collections.abc import Callable

from storage.log.reader import LogReader
from storage.model import CHAIN_GAP_US, CHAIN_KIND, StoredEvent, conversation_of

# The first fused hits whose replies are looked for (the ten places a recall usually fills).
REPLY_FROM = 10
# Events read after a question turn looking for its reply: others' turns and events of other
# kinds written in between are passed over, up to this many.
REPLY_SCAN = 16


def asks(ev: StoredEvent) -> bool:
    """Whether an event is a turn that asks something (its text ends with a question mark)."""
    return ev.kind == CHAIN_KIND and (ev.text or "").rstrip().endswith("?")


def reply_to(r: LogReader, ev: StoredEvent) -> StoredEvent | None:
    """The next turn of ev's conversation in time (its `conversation` property, as the chain
    of turns keys it: storage/tenants/chains.py), within the chain's gap, None if there is none."""
    key = conversation_of(ev)
    for n, raw in enumerate(r.raw_ids_by_ts(ev.ts, ev.ts + CHAIN_GAP_US)):
        if n >= REPLY_SCAN:
            return None
        other = r.get_light_raw(raw)
        if other is None or other.event_id == ev.event_id or other.kind != CHAIN_KIND:
            continue
        if other.ts == ev.ts and other.seq < ev.seq:
            continue  # same time, written before: not after it
        if conversation_of(other) == key:
            return other
    return None


def reply_arm(
    r: LogReader, fused: list[StoredEvent], admit: Callable[[StoredEvent], bool]
) -> list[StoredEvent]:
    """The replies to the question turns among the first REPLY_FROM fused hits, in their
    order, each once; a reply the chokepoint turns away is left out."""
    out: dict[str, StoredEvent] = {}
    for ev in fused[:REPLY_FROM]:
        if not asks(ev):
            continue
        reply = reply_to(r, ev)
        if reply is not None and reply.event_id not in out and admit(reply):
            out[reply.event_id] = reply
    return list(out.values())

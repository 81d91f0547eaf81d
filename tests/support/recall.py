"""Events and a recall over a real tenant, shortly written."""

from __future__ import annotations

from typing import Any

import msgspec

from storage.model import AppendResult, NewEvent
from storage.read.recall import RecallQuery, RecallResult, recall, validate
from storage.tenants.tenant import Tenant


def ev(
    text: str | None = None,
    emb: list[float] | None = None,
    *,
    kind: str = "turn",
    ts: int = 1_000,
    sources: tuple[str, ...] = (),
    **props: Any,
) -> NewEvent:
    """A NewEvent; keyword arguments become properties, sources become SOURCE_FROM links."""
    properties = dict(props)
    if sources:
        properties["source_event_ids"] = list(sources)
    raw = msgspec.json.encode(properties) if properties else None
    return NewEvent(
        kind=kind, ts=ts, text=text, embedding=emb, properties_raw=raw, source_ids=sources
    )


def add(t: Tenant, *events: NewEvent) -> list[str]:
    """Append events in one group commit and return their ids."""
    results = t.submit_append(list(events)).result()
    assert all(isinstance(r, AppendResult) for r in results), results
    return [r.event_id for r in results]


def run(t: Tenant, **query: Any) -> RecallResult:
    """Validate and run one recall against the tenant, as the engine does."""
    q = RecallQuery(**query)
    with t.log.reader() as r:
        validate(q, t.dim, r.meta_str("model"))
        return recall(r, t.keyword, t.vectors, q)

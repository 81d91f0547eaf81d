"""Recall says what current state kept out of its answer (`withheld`), counting only events that
would have ranked: the ones each arm read best first while filling the answer."""

from __future__ import annotations

import time
from typing import Any

import pytest

from storage.model import NewEvent
from storage.read.recall import RecallQuery, RecallResult, Withheld, recall
from storage.tenants.tenant import Tenant

HOUR = 3_600_000_000
NOW = time.time_ns() // 1000
T0 = NOW - 24 * HOUR
Q = [1.0, 0.0, 0.0, 0.0]


def add(t: Tenant, text: str | None, emb: list[float] | None = None, **fields: Any) -> str:
    """Append one event through the tenant's writer; its id."""
    ev = NewEvent(kind=fields.pop("kind", "fact"), ts=T0, text=text, embedding=emb, **fields)
    return str(t.submit_append([ev]).result(timeout=30)[0].event_id)


def ask(t: Tenant, **query: Any) -> RecallResult:
    with t.log.reader() as r:
        return recall(r, t.keyword, t.vectors, RecallQuery(**query))


def test_expired_and_not_yet_valid_hits_are_counted(tenant: Tenant) -> None:
    add(tenant, "promo code SPRING is valid", valid_until=NOW - HOUR)
    add(tenant, "promo code AUTUMN is valid", valid_from=NOW + HOUR)
    live = add(tenant, "promo code SUMMER is valid")
    result = ask(tenant, text="promo code")
    assert [h.event.event_id for h in result.hits] == [live]
    assert result.withheld == Withheld(expired=1, not_yet_valid=1)
    assert ask(tenant, text="promo code", current=False).withheld is None
    # The windows are tested at as_of: two hours ago SPRING still held and AUTUMN did not yet.
    earlier = ask(tenant, text="promo code", as_of=NOW - 2 * HOUR)
    assert len(earlier.hits) == 2 and earlier.withheld == Withheld(not_yet_valid=1)


def test_everything_withheld_still_says_why(tenant: Tenant) -> None:
    """docs/current-state.md's example once its dates had passed: no hit, and now a reason."""
    add(tenant, "billing cutover on the tenth", valid_until=NOW - HOUR)
    add(tenant, "billing cutover moved to the seventeenth", valid_until=NOW - HOUR)
    result = ask(tenant, text="billing cutover")
    assert result.hits == [] and result.withheld == Withheld(expired=2)


def test_superseded_versions_are_counted_beside_the_heads_that_replace_them(
    tenant: Tenant,
) -> None:
    old = add(tenant, "invoice run is on the first")
    new = add(tenant, "invoice run moved to the third", supersedes=(old,))
    result = ask(tenant, text="invoice run")
    assert [h.event.event_id for h in result.hits] == [new] and result.hits[0].replaces == [old]
    assert result.withheld == Withheld(superseded=1)


def test_a_plain_tenant_withholds_nothing(tenant: Tenant) -> None:
    for i in range(5):
        add(tenant, f"order {i} shipped", [1.0, 0.1 * i, 0.0, 0.0])
    assert ask(tenant, text="order shipped", embedding=Q, hops=1).withheld is None


@pytest.mark.parametrize("restricted", [False, True], ids=["graph", "exact scan of a kind"])
def test_only_events_that_would_have_ranked_count(tenant: Tenant, restricted: bool) -> None:
    # An expired event ranked below the k answered ones was never read: it is not withheld.
    kind = "note" if restricted else "fact"
    for i in range(3):
        add(tenant, None, [1.0, 0.01 * i, 0.0, 0.0], kind=kind)
    add(tenant, None, [0.2, 1.0, 0.0, 0.0], kind=kind, valid_until=NOW - HOUR)
    query = {"embedding": Q, "k": 2, **({"kind": kind} if restricted else {})}
    assert ask(tenant, **query).withheld is None
    # The same kind of event ranked first is.
    add(tenant, None, [1.0, 0.0, 0.0, 0.0], kind=kind, valid_until=NOW - HOUR)
    assert ask(tenant, **query).withheld == Withheld(expired=1)

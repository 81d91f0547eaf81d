"""Cascading deletes and dry runs on a chain and a diamond of SOURCE_FROM links, in storage
(tests/server/test_cascade_http.py: over HTTP)."""

from __future__ import annotations

import threading

from storage.model import NewEvent
from storage.read.cascade import derived_closure
from storage.tenants.tenant import Tenant

NOT_FOUND = {"error": "not_found", "detail": "no event with that id"}


# -- storage -----------------------------------------------------------------------------------


def add(
    t: Tenant, name: str, sources: tuple[str, ...] = (), supersedes: tuple[str, ...] = ()
) -> str:
    """Append one event and return its id."""
    ev = NewEvent(kind="fact", ts=len(name), text=name, source_ids=sources, supersedes=supersedes)
    [result] = t.submit_append([ev]).result()
    return str(result.event_id)


def closure(t: Tenant, event_id: str) -> list[str]:
    with t.log.reader() as r:
        return derived_closure(r, event_id)


def test_closure_of_a_diamond_is_breadth_first_in_link_order(tenant: Tenant) -> None:
    #      a
    #    /   \
    #   b     c      (b and c derive from a; d from both; e from d; x unrelated; s supersedes a)
    #    \   /
    #      d - e
    a = add(tenant, "a")
    x = add(tenant, "x")
    b = add(tenant, "b", (a,))
    c = add(tenant, "c", (a, x))
    d = add(tenant, "d", (c, b))
    e = add(tenant, "e", (d,))
    s = add(tenant, "s", supersedes=(a,))
    assert closure(tenant, a) == [a, b, c, d, e]
    assert closure(tenant, c) == [c, d, e]
    assert closure(tenant, e) == [e]
    assert closure(tenant, x) == [x, c, d, e]
    assert closure(tenant, s) == [s]
    assert closure(tenant, "00000000-0000-4000-8000-000000000000") == []


def test_cascading_delete_is_one_transaction_and_reaches_the_indexes(tenant: Tenant) -> None:
    a = add(tenant, "alpha")
    b = add(tenant, "beta", (a,))
    keep = add(tenant, "gamma")
    deleted = tenant.submit_delete_cascade(a).result()
    assert deleted == [a, b]
    with tenant.log.reader() as r:
        assert r.get(a) is None and r.get(b) is None and r.get(keep) is not None
        assert sorted(r.tombstone_ids()) == sorted([a, b])
    assert tenant.keyword.search("beta", limit=5) == []
    assert [e for e, _s in tenant.keyword.search("gamma", limit=5)] == [keep]
    assert tenant.submit_delete_cascade(a).result() == []


def test_an_event_derived_while_the_cascade_is_queued_goes_with_it(tenant: Tenant) -> None:
    root = add(tenant, "root")
    gate = threading.Event()
    blocker = tenant.call(gate.wait)  # hold the writer so both jobs queue behind it
    late = tenant.submit_append([NewEvent(kind="fact", ts=9, text="late", source_ids=(root,))])
    cascade = tenant.submit_delete_cascade(root)
    gate.set()
    blocker.result()
    [appended] = late.result()
    assert cascade.result() == [root, appended.event_id]

"""Every operation on a tenant is a method of the storage Tenant, which keeps its own invariants:
a script or an embedded server that uses Tenant directly gets the same answers and refusals as
a request through the server's Engine."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from storage.cypher import Limits
from storage.errors import Conflict
from storage.model import AppendResult, NewEvent
from storage.read.listing import ListQuery
from storage.read.recall import RecallQuery
from storage.tenants.standin import EmptyStandIn
from storage.tenants.tenant import Tenant

DIM = 4


def keyed(key: str, text: str = "the parcel arrived") -> NewEvent:
    """An append under an Idempotency-Key (its derived id and the body's hash)."""
    return NewEvent(
        kind="note",
        ts=1_800_000_000_000_000,
        text=text,
        event_id=key,
        body_hash=hashlib.sha256(text.encode()).digest(),
    )


@contextmanager
def writer_held(t: Tenant) -> Iterator[None]:
    """Keep the tenant's writer busy: appends submitted meanwhile stay in flight."""
    started, gate = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        gate.wait(10)

    held = t.call(hold)
    assert started.wait(10)
    try:
        yield
    finally:
        gate.set()
        held.result(10)


def test_a_twin_of_an_append_in_flight_is_refused_and_its_retry_replays(tenant: Tenant) -> None:
    key = str(uuid.uuid4())
    with writer_held(tenant):
        first = tenant.submit_append([keyed(key)])
        with pytest.raises(Conflict) as refused:
            tenant.submit_append([keyed(key)])
        assert refused.value.headers == {"Retry-After": "1"}
        # Another key is not held back, nor is an append without one.
        other = tenant.submit_append([keyed(str(uuid.uuid4())), NewEvent(kind="note", ts=1)])
    [result] = first.result(10)
    assert isinstance(result, AppendResult) and result.event_id == key and not result.replayed
    assert len(other.result(10)) == 2
    # Answered: the key is free again, and the retry replays the first answer.
    [again] = tenant.submit_append([keyed(key)]).result(10)
    assert isinstance(again, AppendResult) and again.replayed


def test_a_batch_with_one_key_in_flight_is_refused_whole(tenant: Tenant) -> None:
    held_key, free_key = str(uuid.uuid4()), str(uuid.uuid4())
    with writer_held(tenant):
        first = tenant.submit_append([keyed(held_key)])
        with pytest.raises(Conflict):
            tenant.submit_append([keyed(free_key), keyed(held_key)])
    first.result(10)
    # Nothing of the refused batch was written, and its free key was not left held.
    assert tenant.get(free_key) is None
    [written] = tenant.submit_append([keyed(free_key)]).result(10)
    assert isinstance(written, AppendResult) and not written.replayed


def test_an_append_the_writer_refuses_frees_its_key(tmp_path: Path) -> None:
    standin = EmptyStandIn(DIM)  # a real tenant whose writer takes nothing
    try:
        t = standin.get()
        key = str(uuid.uuid4())
        for _ in range(2):  # the second is refused by the writer again, not as a twin in flight
            with pytest.raises(RuntimeError, match="takes no writes"):
                t.submit_append([keyed(key)])
    finally:
        standin.close()


def test_reads_and_deletes_are_tenant_methods(tenant: Tenant) -> None:
    [a, b] = tenant.submit_append(
        [
            NewEvent(
                kind="note", ts=1_800_000_000_000_000, text="parcel lost", embedding=[1, 0, 0, 0]
            ),
            NewEvent(
                kind="note", ts=1_800_000_000_000_001, text="parcel found", embedding=[0, 1, 0, 0]
            ),
        ]
    ).result(10)
    assert isinstance(a, AppendResult) and isinstance(b, AppendResult)
    [c] = tenant.submit_append(
        [
            NewEvent(
                kind="summary", ts=1_800_000_000_000_002, text="summary", source_ids=(a.event_id,)
            )
        ]
    ).result(10)
    assert isinstance(c, AppendResult)

    state = tenant.get(a.event_id)
    assert state is not None and state.current and state.superseded_by == []
    page, cursor = tenant.list_events(ListQuery(kind="note"))
    assert [e.event_id for e in page] == [b.event_id, a.event_id] and cursor is None
    found = tenant.recall(RecallQuery(text="parcel", embedding=[1, 0, 0, 0], k=1), embeddings=True)
    assert [h.event.event_id for h in found.hits] == [a.event_id]
    assert found.hits[0].event.embedding == [1.0, 0.0, 0.0, 0.0]
    rows = tenant.cypher(
        "MATCH (s:Event)-[:SOURCE_FROM]->(e:Event) RETURN s.event_id, e.event_id",
        None,
        Limits(timeout_ms=1000, max_rows=10),
    ).rows
    assert rows == [[c.event_id, a.event_id]]
    assert tenant.would_delete(a.event_id, cascade=True) == [a.event_id, c.event_id]
    assert tenant.would_delete(a.event_id, cascade=False) == [a.event_id]
    assert tenant.would_delete(str(uuid.uuid4()), cascade=True) == []

    assert tenant.submit_delete_cascade(a.event_id).result(10) == [a.event_id, c.event_id]
    assert tenant.get(a.event_id) is None and tenant.get(c.event_id) is None
    assert tenant.awaiting_purge()
    assert tenant.purge().purged == 2
    assert not tenant.awaiting_purge()

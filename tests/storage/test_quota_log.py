"""A tenant's quota and usage in the log: the live events and bytes the appender holds each
append to, all-or-nothing jobs in one group commit, the figures kept through deletes, purges,
reopening and a log read by another process."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from storage.errors import EmbeddingMismatch, QuotaExceeded, Unavailable
from storage.log import layout
from storage.log.eventlog import EventLog, read_only, record_bytes
from storage.model import AppendResult, ItemRefused, NewEvent, Quota
from storage.tenants.footprint import tenant_bytes
from storage.tenants.tenant import Tenant
from storage.tenants.usage import closed_usage

TS = 1_790_000_000_000_000


def one(i: int, dim: int = 4, text: str | None = None) -> NewEvent:
    return NewEvent(kind="k", ts=TS + i, text=text or f"event {i}", embedding=[1.0] * dim)


def scanned(log: EventLog) -> tuple[int, int]:
    """The live events and their records' bytes, counted by a scan, and the meta's figure."""
    with log.reader() as r:
        assert r.meta_int(layout.LIVE_BYTES) == record_bytes(r)
        return r.event_count(), record_bytes(r)


def test_a_refused_batch_leaves_the_other_jobs_of_its_group_commit_written(
    tmp_path: Path,
) -> None:
    log = EventLog.open(tmp_path / "events", embedding_dim=4)

    def apply(txn: Any) -> tuple[Any, Any, Any, Any]:
        appender = log.appender(txn)
        before = appender.append_all([one(0)])
        refused = appender.append_atomic([one(1), one(2), one(3, dim=3)])
        good = appender.append_atomic([one(4), one(5)])
        after = appender.append_all([one(6)])
        appender.finish()
        return before, refused, good, after

    before, refused, good, after = log.write(apply)
    assert isinstance(refused, ItemRefused) and refused.item == 2
    assert isinstance(refused.error, EmbeddingMismatch)
    assert all(isinstance(r, AppendResult) for r in (*before, *good, *after))
    with log.reader() as r:
        assert sorted(e.text or "" for e in r.newest_first(None, None, None)) == [
            "event 0",
            "event 4",
            "event 5",
            "event 6",
        ]
        # Ops stay numbered without a gap: nothing of the refused batch took a seq.
        assert [seq for seq, _op, _id in r.ops_after(0)] == [1, 2, 3, 4]
    assert scanned(log)[0] == 4  # the refused events' bytes were never counted
    log.close()


def test_the_quota_counts_every_job_committed_before_in_the_same_group(tmp_path: Path) -> None:
    log = EventLog.open(tmp_path / "events", embedding_dim=4)
    quota = Quota(max_events=5)

    def apply(txn: Any) -> tuple[Any, Any, Any]:
        appender = log.appender(txn)
        first = appender.append_all([one(0), one(1)], quota)
        # Three more would make six: the whole batch goes, and what it undid is not counted.
        batch = appender.append_atomic([one(2), one(3), one(4), one(5)], quota)
        rest = appender.append_all([one(6), one(7), one(8), one(9)], quota)
        appender.finish()
        return first, batch, rest

    first, batch, rest = log.write(apply)
    assert all(isinstance(r, AppendResult) for r in first)
    assert isinstance(batch, ItemRefused) and batch.item == 3
    assert isinstance(batch.error, QuotaExceeded) and batch.error.limit == "max_events"
    assert [type(r).__name__ for r in rest] == ["AppendResult"] * 3 + ["QuotaExceeded"]
    assert scanned(log)[0] == 5
    log.close()


def test_live_bytes_follow_appends_deletes_and_a_purge(tmp_path: Path) -> None:
    t = Tenant.open("t", tmp_path / "t", embedding_dim=4)
    assert t.usage().memory is None  # nobody measures it: no manager opened this one
    t.measure_memory = tenant_bytes
    try:
        ids = [r.event_id for r in t.submit_append([one(i) for i in range(20)]).result()]
        count, size = scanned(t.log)
        assert count == 20 and size > 20 * 4 * 4
        t.submit_delete(ids[:5]).result()
        assert scanned(t.log)[0] == 15
        usage = t.usage()
        assert (usage.events.live, usage.events.deleted) == (15, 5)
        t.purge()
        count, after = scanned(t.log)  # the purge's new log carries the figure
        usage = t.usage()
        assert (count, usage.events.live, usage.events.deleted) == (15, 15, 0)
        assert usage.bytes.live == after < size
        assert usage.vectors.graph + usage.vectors.pending == 15
        assert usage.memory > 0 and usage.last_write is not None
    finally:
        t.close()
    reopened = Tenant.open("t", tmp_path / "t", embedding_dim=4)
    try:
        assert scanned(reopened.log) == (15, after)
    finally:
        reopened.close()


def test_a_closed_tenants_figures_match_what_it_said_open(tmp_path: Path) -> None:
    t = Tenant.open("t", tmp_path / "t", embedding_dim=4)
    try:
        t.submit_append([one(i) for i in range(12)]).result()
        t.submit_append([NewEvent(kind="k", ts=TS, text="no vector")]).result()
        t.vectors.flush()
        open_usage = t.usage()
    finally:
        t.close()
    closed = closed_usage(tmp_path / "t")
    assert closed.open is False and open_usage.open is True
    assert closed.events == open_usage.events
    assert closed.bytes.live == open_usage.bytes.live
    assert closed.vectors.graph + closed.vectors.pending == 12
    assert closed.vector_space == open_usage.vector_space
    assert closed.last_write == open_usage.last_write
    empty = closed_usage(tmp_path / "never")
    assert (empty.events.live, empty.bytes.total, empty.last_write) == (0, 0, None)


def test_a_quota_source_is_asked_when_the_group_commit_starts(tmp_path: Path) -> None:
    t = Tenant.open("t", tmp_path / "t", embedding_dim=4)
    try:
        limit = [Quota()]
        busy, release = threading.Event(), threading.Event()

        def hold() -> None:
            busy.set()
            release.wait()

        # The writer is busy: the appends queue up, then the limit changes before they commit.
        held = t.call(hold)
        assert busy.wait(10)
        queued = [t.submit_append([one(i)], quota=lambda: limit[0]) for i in range(4)]
        limit[0] = Quota(max_events=2)
        release.set()
        held.result()
        outcomes = [f.result()[0] for f in queued]
        assert [type(o).__name__ for o in outcomes] == ["AppendResult"] * 2 + ["QuotaExceeded"] * 2
        assert t.usage().events.live == 2

        def unknown() -> Quota:
            raise Unavailable("the control plane cannot be reached")

        with pytest.raises(Unavailable):
            t.submit_append([one(9)], quota=unknown, atomic=True).result()
        [single] = t.submit_append([one(9)], quota=unknown).result()
        assert isinstance(single, Unavailable)
        assert t.usage().events.live == 2
    finally:
        t.close()


def test_a_missing_log_is_not_made_by_reading_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError), read_only(tmp_path / "missing" / "events"):
        pass
    assert not (tmp_path / "missing").exists()


def test_max_bytes_counts_the_vectors_the_server_will_add(tmp_path: Path) -> None:
    """A server-space tenant capped at 100,000 bytes, sent text-only batches while its vectors
    are not made yet: what it holds once every vector is written stays within the cap."""
    from storage.model import ServerSpace, StoredVector

    cap = 100_000
    offer = ServerSpace(model="test/m", dim=384)
    t = Tenant.open("t", tmp_path / "t", embedding_dim=384, offer=lambda: offer)
    quota = Quota(max_bytes=cap)
    stored = refused = 0
    for b in range(20):
        batch = [
            NewEvent(kind="note", ts=TS + b * 100 + i, text=f"note {b} {i}") for i in range(50)
        ]
        for result in t.submit_append(batch, quota=quota).result():
            stored += isinstance(result, AppendResult)
            refused += isinstance(result, QuotaExceeded)
    assert 0 < stored < 1000 and stored + refused == 1000
    events, _before, deletes, model = t.to_embed(10_000)
    assert len(events) == stored and model is not None
    vectors = [StoredVector(ev.event_id, ev.seq, [0.05] * 384) for ev in events]
    assert t.store_vectors(vectors, model, deletes).result() == stored
    assert scanned(t.log)[1] <= cap  # 1,768,436 of 100,000 before: vectors were not counted
    t.close()

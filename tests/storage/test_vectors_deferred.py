"""A reopened tenant's saved HNSW graph (past EXACT_BELOW) is loaded at its first use, not on
open: reads of events leave it on disk, the first vector search loads it and answers as before
the close, and writes after such a reopen are kept like any others."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from storage.index.vectors import EXACT_BELOW
from storage.model import AppendResult, NewEvent
from storage.read.listing import ListQuery
from storage.read.recall import RecallQuery, recall
from storage.tenants.tenant import Tenant

DIM = 8
N = EXACT_BELOW + 300


def vectors(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def append(t: Tenant, rows: np.ndarray, first: int) -> list[str]:
    batch = [
        NewEvent(kind="turn", ts=1_000_000 + first + i, text=f"note {first + i}", embedding=v)
        for i, v in enumerate(rows.tolist())
    ]
    ids = []
    for lo in range(0, len(batch), 500):
        done = t.submit_append(batch[lo : lo + 500]).result()
        assert all(isinstance(r, AppendResult) for r in done)
        ids += [r.event_id for r in done if isinstance(r, AppendResult)]
    return ids


def nearest(t: Tenant, query: np.ndarray, k: int = 5) -> list[str]:
    with t.log.reader() as r:
        q = RecallQuery(embedding=query.tolist(), k=k)
        return [h.event.event_id for h in recall(r, t.keyword, t.vectors, q).hits]


def test_the_graph_loads_at_the_first_vector_search_and_answers_as_before(
    tmp_path: Path,
) -> None:
    rows = vectors(N, 1)
    queries = vectors(20, 2)
    t = Tenant.open("t", tmp_path, embedding_dim=DIM)
    try:
        ids = append(t, rows, 0)
        t.vectors.flush()
        before = [nearest(t, q) for q in queries]
    finally:
        t.close()
    t = Tenant.open("t", tmp_path, embedding_dim=DIM)
    try:
        assert not t.vectors.loaded()
        assert t.get(ids[7]) is not None
        page, _cursor = t.list_events(ListQuery(limit=10))
        assert len(page) == 10
        graph_bytes, _exact = t.vectors.memory_bytes()
        assert graph_bytes > N * DIM * 4  # counted as what it will hold
        assert t.usage().vectors.graph == N
        assert not t.vectors.loaded()  # reads of events and usage leave the graph on disk
        assert [nearest(t, q) for q in queries] == before
        assert t.vectors.loaded()
        assert len(t.vectors.live) == N
        assert t.usage().vectors.graph == N
    finally:
        t.close()


def test_writes_after_a_reopen_before_any_search_are_kept(tmp_path: Path) -> None:
    t = Tenant.open("t", tmp_path, embedding_dim=DIM)
    try:
        ids = append(t, vectors(N, 3), 0)
    finally:
        t.close()
    new_rows = vectors(40, 4)
    t = Tenant.open("t", tmp_path, embedding_dim=DIM)
    try:
        assert not t.vectors.loaded()
        new_ids = append(t, new_rows, N)
        assert t.submit_delete(ids[:5]).result() == ids[:5]
    finally:
        t.close()
    t = Tenant.open("t", tmp_path, embedding_dim=DIM)
    try:
        for i in (0, 17, 39):
            assert nearest(t, new_rows[i], k=1) == [new_ids[i]]
        assert len(t.vectors.live) == N - 5 + 40
        assert not set(ids[:5]) & set(nearest(t, vectors(N, 3)[2], k=50))
    finally:
        t.close()


def test_a_large_graph_with_damaged_links_is_rebuilt_from_the_log_on_open(
    tmp_path: Path,
) -> None:
    rows = vectors(N, 5)
    t = Tenant.open("t", tmp_path, embedding_dim=DIM)
    try:
        append(t, rows, 0)
        t.vectors.flush()
        before = nearest(t, rows[3], k=10)
    finally:
        t.close()
    saved = tmp_path / "vectors.hnsw"
    saved.write_bytes(saved.read_bytes()[:-4])  # the last link list cut short: hnswlib refuses it
    t = Tenant.open("t", tmp_path, embedding_dim=DIM)
    try:
        assert nearest(t, rows[3], k=10) == before
        assert t.vectors.count() == N  # replayed from the log (the tail, then the graph)
    finally:
        t.close()

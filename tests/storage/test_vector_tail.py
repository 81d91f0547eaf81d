"""The vector index's background tail: bounded, and a delete or a new vector
that lands while the inserter moves a label into the graph never leaves a stale vector findable."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from storage.index import vectors
from storage.index.vectors import VectorIndex

DIM = 8


def _vectors(n: int, seed: int = 7) -> list[list[float]]:
    return np.random.default_rng(seed).standard_normal((n, DIM)).tolist()  # type: ignore[no-any-return]


def test_a_full_tail_holds_appends_until_the_inserter_makes_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vectors, "MAX_TAIL", 4)
    monkeypatch.setattr(vectors, "EXACT_BELOW", 2)
    index = VectorIndex.create_empty(tmp_path / "v.hnsw", DIM)
    rows = _vectors(12)
    try:
        index.add([1, 2, 3], rows[:3])  # past EXACT_BELOW: a graph
        index.flush()
        with index.lock.exclusive():  # the inserter cannot move anything into the graph
            index.add([4, 5, 6, 7], rows[3:7])
            blocked = threading.Thread(target=index.add, args=([8, 9], rows[7:9]))
            blocked.start()
            time.sleep(0.3)
            assert blocked.is_alive(), "an add past MAX_TAIL must wait for the inserter"
        blocked.join(timeout=10)
        assert not blocked.is_alive()
        index.flush()
        for label, row in zip(range(1, 10), rows, strict=False):
            assert index.search(row, 1)[0][0] == label
    finally:
        index.close()


def test_without_a_graph_the_tail_is_not_bounded_by_max_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vectors, "MAX_TAIL", 4)
    index = VectorIndex.create_empty(tmp_path / "v.hnsw", DIM)
    rows = _vectors(12)
    try:
        index.add(list(range(12)), rows)  # would wait forever for an inserter there is not
        assert index.index is None and index.count() == 12 and index.pending() == 0
    finally:
        index.close()


def _pause_after_insert(
    index: VectorIndex, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Event]:
    """Hold the inserter between its graph insert and its bookkeeping: (inserted, go)."""
    inserted, go = threading.Event(), threading.Event()
    real = index._insert

    def insert(labels: list[int], data: np.ndarray) -> None:
        real(labels, data)
        inserted.set()
        assert go.wait(10)

    monkeypatch.setattr(index, "_insert", insert)
    return inserted, go


@pytest.mark.parametrize("graph", ["exact", "hnsw"])
def test_a_label_deleted_or_replaced_while_it_moves_into_the_graph_is_never_found_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, graph: str
) -> None:
    monkeypatch.setattr(vectors, "EXACT_BELOW", 4 if graph == "hnsw" else 2048)
    index = VectorIndex.create_empty(tmp_path / "v.hnsw", DIM)
    rows = _vectors(13)
    fresh = _vectors(1, seed=8)[0]
    try:
        if graph == "exact":
            index._make_graph()  # a graph searched exactly: one that shrank below EXACT_BELOW
        index.add(list(range(1, 9)), rows[1:9])
        index.flush()  # 8 in the graph: past EXACT_BELOW, searched through hnswlib
        inserted, go = _pause_after_insert(index, monkeypatch)
        index.add([9, 10, 11, 12], rows[9:13])
        assert inserted.wait(10)  # 9-12 are in the graph, not yet live
        index.delete([10])
        index.delete([11])
        index.add([11], [fresh])  # 11 gets a new vector while the old one is in the graph

        def check() -> None:
            assert 10 not in [label for label, _sim in index.search(rows[10], 3)]
            assert len(index.search(rows[10], 3)) == 3  # the stale one did not take a place
            best, sim = index.search(fresh, 1)[0]
            assert (best, round(sim, 4)) == (11, 1.0)
            assert (11, 1.0) not in [(lb, round(s, 4)) for lb, s in index.search(rows[11], 3)]
            for label in (9, 12):
                assert index.search(rows[label], 1)[0][0] == label

        check()  # while the inserter holds 9-12 between the graph and the live set
        go.set()
        index.flush()
        check()
        assert index.count() == 11  # 1-9, 11 and 12
        assert 10 not in index.live and 11 in index.live
    finally:
        go.set()
        index.close()


def test_a_deleted_vector_is_noise_in_every_file_saved_after_its_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vectors, "EXACT_BELOW", 4)
    path = tmp_path / "v.hnsw"
    index = VectorIndex.create_empty(path, DIM)
    rows = _vectors(12)
    try:
        index.add(list(range(1, 12)), rows[1:12])
        index.flush()
        index.save()
        graph = index.index
        assert graph is not None

        def stored(label: int) -> bytes:  # as hnswlib holds it (cosine: its own normalising)
            return np.asarray(graph.get_items([label]), dtype="<f4").tobytes()

        old = {label: stored(label) for label in (5, 6, 7)}
        assert old[5] in path.read_bytes()
        index.delete([5, 6])  # hidden at once; the memory of the graph still holds them
        assert 5 not in [label for label, _sim in index.search(rows[5], 3)]
        index.add([6], [rows[0]])  # 6 replaced: its new vector is live and saved as it is
        index.flush()
        for _ in range(2):  # and again: a second save erases them as the first did
            index.save()
            saved = path.read_bytes()
            assert old[5] not in saved and old[6] not in saved
            assert stored(6) in saved and old[7] in saved
    finally:
        index.close()
    reopened = VectorIndex.open(path, DIM)
    try:
        assert reopened.search(rows[0], 1)[0][0] in (6,)
        assert 5 not in [label for label, _sim in reopened.search(rows[5], 3)]
        assert reopened.count() == 10
    finally:
        reopened.close()

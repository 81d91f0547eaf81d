"""The vector index's background tail: bounded, and its inserter runs at a lower CPU priority."""

from __future__ import annotations

import os
import sys
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
    index = VectorIndex.create_empty(tmp_path / "v.hnsw", DIM)
    rows = _vectors(12)
    try:
        with index.lock.exclusive():  # the inserter cannot move anything into the graph
            index.add([1, 2, 3, 4], rows[:4])
            blocked = threading.Thread(target=index.add, args=([5, 6], rows[4:6]))
            blocked.start()
            time.sleep(0.3)
            assert blocked.is_alive(), "an add past MAX_TAIL must wait for the inserter"
        blocked.join(timeout=10)
        assert not blocked.is_alive()
        index.flush()
        for label, row in zip([1, 2, 3, 4, 5, 6], rows, strict=False):
            assert index.search(row, 1)[0][0] == label
    finally:
        index.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_the_inserter_thread_runs_niced(tmp_path: Path) -> None:
    index = VectorIndex.create_empty(tmp_path / "v.hnsw", DIM)
    try:
        native = index._thread.native_id
        assert native is not None
        ours = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        wanted = min(19, ours + vectors.INSERT_NICENESS)  # 19 is the lowest priority there is
        deadline = time.monotonic() + 5
        while os.getpriority(os.PRIO_PROCESS, native) != wanted:
            assert time.monotonic() < deadline, "the inserter never lowered its priority"
            time.sleep(0.01)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == ours
    finally:
        index.close()

"""An open tenant's index parts exist only while needed (storage/index/): no HNSW graph below
EXACT_BELOW, no Tantivy writer while nothing is left to fold, no thread of an index's own (their
work runs on the shared pool, storage/index/background.py); and a tenant opened and closed in a
loop leaks no descriptor, thread or megabyte, and loses nothing."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from storage.heap import pin_mmap_threshold
from storage.index import keyword as keyword_module
from storage.index import vectors
from storage.index.keyword import KeywordDoc, KeywordIndex
from storage.index.vectors import VectorIndex
from storage.model import NewEvent
from storage.tenants.footprint import give_back_memory
from storage.tenants.tenant import Tenant
from tests.support.wait import wait_until

DIM = 16
TS = 1_791_208_939_000_000


def events(n: int, seed: int, start: int = 0) -> list[NewEvent]:
    """Events with text and a random vector each, n of them."""
    rows = np.random.default_rng(seed).standard_normal((n, DIM), dtype=np.float32)
    return [
        NewEvent(kind="turn", ts=TS + start + i, text=f"fact {start + i} about parcels",
                 embedding=row.tolist())
        for i, row in enumerate(rows)
    ]  # fmt: skip


def native_threads() -> list[str]:
    """This process's threads as the kernel names them."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # gone meanwhile
            names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())
    return names


def tantivy_writer_threads() -> int:
    """Threads a Tantivy IndexWriter runs (its indexing, segment-updater and merge threads)."""
    return sum(1 for name in native_threads() if name.startswith("thrd-tantivy"))


def exact(rows: dict[int, np.ndarray], query: np.ndarray, k: int) -> list[int]:
    """The k labels nearest to query by cosine, computed here."""
    labels = sorted(rows)
    data = np.stack([rows[lb] / np.linalg.norm(rows[lb]) for lb in labels])
    sims = data @ (query / np.linalg.norm(query))
    order = sorted(range(len(labels)), key=lambda i: (-sims[i], labels[i]))
    return [labels[i] for i in order[:k]]


def test_a_small_tenant_holds_no_graph_no_writer_and_no_thread_of_its_indexes(
    tmp_path: Path,
) -> None:
    tenant = Tenant.open("small", tmp_path / "small", embedding_dim=DIM)
    try:
        written = events(200, seed=1)
        tenant.submit_append(written).result(timeout=60)
        wait_until(tenant.keyword.settled, "the fold committed")
        wait_until(lambda: tenant.keyword._writer is None, "the idle writer closed")
        assert tenant.vectors.index is None  # searched from its rows: no hnswlib index at all
        assert tenant.vectors.memory_bytes()[0] == 0
        wait_until(lambda: tantivy_writer_threads() == 0, "the writer's threads ended")
        assert not [t.name for t in threading.enumerate() if t.name in ("vectors", "keyword")]
        query = np.asarray(written[7].embedding)
        before = [label for label, _sim in tenant.vectors.search(query, 10)]
    finally:
        tenant.close()
    again = Tenant.open("small", tmp_path / "small", embedding_dim=DIM)
    try:
        assert again.vectors.index is None and again.vectors.count() == 200
        assert [label for label, _sim in again.vectors.search(query, 10)] == before
        assert again.keyword._writer is None  # a read-only open makes no writer
    finally:
        again.close()


def test_growing_past_the_threshold_builds_the_graph_and_recall_stays_exact_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vectors, "EXACT_BELOW", 64)
    path = tmp_path / "v.hnsw"
    index = VectorIndex.create_empty(path, DIM)
    rng = np.random.default_rng(5)
    rows: dict[int, np.ndarray] = {}
    queries = rng.standard_normal((12, DIM), dtype=np.float32)
    try:
        for lo in range(1, 400, 20):
            batch = rng.standard_normal((20, DIM), dtype=np.float32)
            labels = list(range(lo, lo + 20))
            index.add(labels, batch.tolist())
            rows.update(zip(labels, batch, strict=True))
            if len(rows) <= 64:
                assert index.index is None
            # Whatever has moved into the graph so far: until the graph holds more than
            # EXACT_BELOW, every search is exact (the tail and the graph's rows).
            for q in queries:
                found = [label for label, _sim in index.search(q, 10)]
                if index._small is not None or index.index is None:
                    assert found == exact(rows, q, 10)
                else:  # past EXACT_BELOW in the graph: approximate, and very near
                    assert len(set(found) & set(exact(rows, q, 10))) >= 9
        assert index.index is not None  # 400 > 64: a graph, built in the background
        index.flush()
        assert index.pending() == 0 and len(index.live) == 400
        index.save()
    finally:
        index.close()
    reopened = VectorIndex.open(path, DIM)
    try:
        assert reopened.index is not None and reopened.count() == 400
        reopened.delete(list(range(1, 351)))  # shrinks: it keeps its graph while open
        assert reopened.index is not None
        for label in range(1, 351):
            rows.pop(label)
        reopened.save()
    finally:
        reopened.close()
    small = VectorIndex.open(path, DIM)  # 50 left: opened without a graph
    try:
        assert small.index is None and small.count() == 50
        for q in queries:
            assert [label for label, _sim in small.search(q, 10)] == exact(rows, q, 10)
    finally:
        small.close()


def test_the_keyword_writer_exists_while_a_fold_runs_and_closes_when_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = KeywordIndex.open(tmp_path / "kw")
    committed, go = threading.Event(), threading.Event()
    real = index._commit_ops

    def held(ops: list[keyword_module.Op], *, replace_all: bool = False) -> keyword_module.View:
        view = real(ops, replace_all=replace_all)
        committed.set()
        assert go.wait(30)
        return view

    monkeypatch.setattr(index, "_commit_ops", held)
    try:
        assert index._writer is None  # opening makes none
        doc = KeywordDoc("e1", "turn", "a parcel went missing", {}, seq=1)
        index.publish([doc], [], 1, new=True)
        assert committed.wait(30)
        assert index._writer is not None  # during the write; its threads come back after the
        # commit the fold just made, which a busy machine may take a moment to schedule
        wait_until(lambda: tantivy_writer_threads() > 0, "the writer's threads")
        go.set()
        wait_until(lambda: index._writer is None, "the writer closed once idle")
        wait_until(lambda: tantivy_writer_threads() == 0, "the writer's threads ended")
        assert index.search("parcel", limit=5) and index.settled()
        index.publish([KeywordDoc("e2", "turn", "another parcel", {}, seq=2)], [], 2, new=True)
        index.flush()  # a new writer for the new write, closed again after it
        wait_until(lambda: index._writer is None, "the second writer closed")
        assert {hit for hit, _score in index.search("parcel", limit=5)} == {"e1", "e2"}
    finally:
        go.set()
        index.close()


def rss_bytes() -> int:
    """This process's resident set."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_tenant_opened_and_closed_in_a_loop_leaks_nothing_and_loses_nothing(
    tmp_path: Path,
) -> None:
    pin_mmap_threshold()  # the heap as the server sets it (memspine/app.py)
    root = tmp_path / "loop"
    tenant = Tenant.open("loop", root, embedding_dim=DIM)
    tenant.submit_append(events(100, seed=2)).result(timeout=60)
    tenant.close()
    appended = 100

    def cycle(i: int) -> None:
        nonlocal appended
        t = Tenant.open("loop", root, embedding_dim=DIM)
        try:
            if i % 40 == 0:  # a write now and then: a fold, a writer, a save on close
                t.submit_append(events(1, seed=100 + i, start=appended)).result(timeout=60)
                appended += 1
            assert t.vectors.count() == appended
        finally:
            t.close()

    for i in range(30):  # warm: imports, caches, the shared pool's workers
        cycle(i + 1)
    give_back_memory()
    fds, threads, rss = len(os.listdir("/proc/self/fd")), len(native_threads()), rss_bytes()
    for i in range(400):
        cycle(i)
    give_back_memory()
    # Tantivy's file watcher polls meta.json from a thread that ends at its next poll after
    # its index closes: wait for the last one rather than count its descriptor.
    wait_until(lambda: len(os.listdir("/proc/self/fd")) <= fds, "closed tenants' files closed")
    wait_until(lambda: len(native_threads()) <= threads, "closed tenants' threads gone")
    # 400 opens that each leaked hnswlib's tables alone would be a gigabyte.
    assert rss_bytes() - rss < 16 << 20
    last = Tenant.open("loop", root, embedding_dim=DIM)
    try:
        with last.log.reader() as r:
            assert r.count() == appended == 110
        assert last.vectors.count() == appended
    finally:
        last.close()


CHILD = """
import sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from storage.tenants.tenant import Tenant
from tests.storage.test_lazy_parts import events
root = Path({root!r})
t = Tenant.open("grow", root, embedding_dim={dim})
t.submit_append(events(3000, seed=9, start=100)).result(timeout=120)
print(t.vectors.pending(), t.vectors.index is not None, flush=True)
import time
time.sleep(120)
"""


def test_kill_9_during_the_background_graph_build_loses_nothing(tmp_path: Path) -> None:
    root = tmp_path / "grow"
    tenant = Tenant.open("grow", root, embedding_dim=DIM)
    tenant.submit_append(events(100, seed=8)).result(timeout=60)
    tenant.close()  # saved without a graph
    repo = str(Path(__file__).resolve().parents[2])
    script = CHILD.format(repo=repo, root=str(root), dim=DIM)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        pending, graph = child.stdout.readline().split()
        child.kill()  # SIGKILL while the pool moves the acknowledged vectors into the graph
    finally:
        child.kill()
        child.wait(timeout=60)
    assert graph == "True" and int(pending) > 0, "the kill must land during the build"
    again = Tenant.open("grow", root, embedding_dim=DIM)
    try:
        with again.log.reader() as r:
            assert r.count() == 3100
        assert again.vectors.count() == 3100
        written = events(3000, seed=9, start=100)
        for e in written[::250]:
            assert e.embedding is not None
            assert again.vectors.search(np.asarray(e.embedding), 1)[0][1] == pytest.approx(1.0)
    finally:
        again.close()


def watcher_threads() -> int:
    """Tantivy's meta.json watchers (one per open Tantivy index; the kernel keeps 15 characters
    of a thread's name)."""
    return sum(1 for name in native_threads() if name.startswith("thread-tantivy"))


def test_an_idle_open_tenant_lets_its_tantivy_index_go_and_searches_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from storage.index.held import held

    monkeypatch.setattr(held(), "linger", 0.2)
    before = watcher_threads()
    tenant = Tenant.open("idle", tmp_path / "idle", embedding_dim=DIM)
    try:
        tenant.submit_append(events(50, seed=3)).result(timeout=60)
        tenant.keyword.flush()
        first = tenant.keyword.search("parcels", limit=10)
        wait_until(lambda: tenant.keyword._index is None, "the idle index let go")
        wait_until(lambda: watcher_threads() <= before, "its watcher thread ended")
        assert tenant.keyword.memory_bytes() == 0
        assert tenant.keyword.search("parcels", limit=10) == first  # opened again to answer
        assert tenant.keyword._index is not None
        tenant.submit_append(events(1, seed=4, start=50)).result(timeout=60)
        assert len(tenant.keyword.search("parcels", limit=100)) == 51
    finally:
        tenant.close()


def test_at_most_held_max_tantivy_indexes_stay_open_across_tenants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from storage.index.held import held

    monkeypatch.setattr(held(), "limit", 3)
    before = watcher_threads()
    opened = []
    try:
        for i in range(8):
            tenant = Tenant.open(f"t{i}", tmp_path / f"t{i}", embedding_dim=DIM)
            opened.append(tenant)
            tenant.submit_append(events(5, seed=10 + i)).result(timeout=60)
            assert len(tenant.keyword.search("parcels", limit=10)) == 5
        wait_until(lambda: len(held()) <= 3, "the least recently used let go")
        wait_until(lambda: watcher_threads() <= before + 3, "their watcher threads ended")
        for tenant in opened:  # each answers still, opening its index again
            assert len(tenant.keyword.search("parcels", limit=10)) == 5
    finally:
        for tenant in opened:
            tenant.close()


def test_a_reopened_small_index_searches_its_file_mapped_appends_beside_it_copies_on_delete(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v.hnsw"
    index = VectorIndex.create_empty(path, DIM)
    rows = np.random.default_rng(6).standard_normal((300, DIM), dtype=np.float32)
    index.add(list(range(1, 301)), rows.tolist())
    query = rows[17]
    before = index.search(query, 10)
    index.save()
    index.close()
    fds = len(os.listdir("/proc/self/fd"))
    again = VectorIndex.open(path, DIM)
    try:
        flat = again._tail
        assert flat.mapped() == 300  # the file's pages, not a copy
        assert len(os.listdir("/proc/self/fd")) == fds  # the map holds no descriptor
        held = flat.nbytes()
        assert again.search(query, 10) == before
        again.add([5], [rows[0].tolist()])  # a replaced mapped row: dead there, appended
        again.add([301], [rows[1].tolist()])
        assert flat.mapped() == 300 and again.count() == 301
        assert flat.nbytes() < held + 300 * DIM * 4 // 2  # the appended rows, not a copy of all
        expected = {lb: r for lb, r in zip(range(1, 301), rows, strict=True)}
        expected[5], expected[301] = rows[0], rows[1]
        assert [label for label, _sim in again.search(query, 10)] == exact(expected, query, 10)
        again.delete([18])  # a deleted vector stays mapped nowhere: the live rows are copied
        del expected[18]
        assert flat.mapped() == 0 and again.count() == 300
        found = [label for label, _sim in again.search(query, 10)]
        assert found == exact(expected, query, 10)
        assert np.allclose(
            flat.rows([5, 301, 2]), [unit_of(rows[0]), unit_of(rows[1]), unit_of(rows[1])]
        )
        again.delete(list(range(1, 250)))
        assert [label for label, _sim in again.search(query, 5)] == exact(
            {lb: r for lb, r in expected.items() if lb >= 250}, query, 5
        )
        again.save()
    finally:
        again.close()
    reopened = VectorIndex.open(path, DIM)
    try:
        assert reopened.count() == 52 and reopened._tail.mapped() == 52
    finally:
        reopened.close()


def unit_of(row: np.ndarray) -> np.ndarray:
    """A row scaled to length 1."""
    return row / np.linalg.norm(row)

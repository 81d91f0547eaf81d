"""How the background embedder runs and writes its vectors (storage/tenants/embedding.py) with
the real local model and a real tenant: a batch goes to the tenant's writer a chunk at a time, so
appends queued behind it wait for one chunk, and each chunk reaches the vector index from memory,
giving the index catch_up would have built from the log; the model's work on a batch runs on
threads of the priority of the thread that asked for it, whoever embedded first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from storage import files
from storage.embedders.base import Embedder
from storage.embedders.local import LocalEmbedder
from storage.model import NewEvent
from storage.read.recall import RecallQuery
from storage.tenants.embedding import EmbeddingWorker
from storage.tenants.manager import TenantManager
from storage.tenants.tenant import Tenant
from tests.support.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000_000_000
HOUR = 3_600_000_000  # notes an hour apart: no chain between them, each vector its text's own
TEXTS = [
    "Lena wants status notes as three bullets",
    "no tables in the weekly report",
    "the deploy runs every Tuesday at nine",
    "Marco prefers tea to coffee",
    "the staging database was moved to Frankfurt",
    "release notes go to the #launch channel",
    "the on-call rota changes on Mondays",
    "budgets are reviewed at the end of each quarter",
]


@pytest.fixture(scope="module")
def model() -> Iterator[Embedder]:
    """The real local model (all-MiniLM-L6-v2 on onnxruntime), loaded once for the module, in
    this process: its graph built once per test process (tests/conftest.py), where the server's
    child process (tests/storage/test_embedder_child.py) would build it again."""
    embedder = LocalEmbedder()
    yield embedder
    embedder.close()


def notes() -> list[NewEvent]:
    """Text-only notes an hour apart."""
    return [NewEvent(kind="note", ts=T0 + i * HOUR, text=t) for i, t in enumerate(TEXTS)]


def drained(t: Tenant) -> None:
    """Wait until no event of the tenant awaits its vector."""
    deadline = time.monotonic() + 60
    while t.unembedded_count():
        assert time.monotonic() < deadline, "the embedder did not finish"
        time.sleep(0.02)


def test_a_batch_is_written_a_chunk_per_writer_turn(tmp_path: Path, model: Embedder) -> None:
    worker = EmbeddingWorker(model, default_dim=384, batch=len(TEXTS), write_chunk=3)
    left: list[int] = []  # events still awaiting a vector after each writer turn, once counted
    counted: list[Tenant] = []

    def turn(_size: int) -> None:
        if counted:
            left.append(counted[0].unembedded_count())

    manager = TenantManager(tmp_path, embedding_dim=384, embedding=worker, on_batch=turn)
    try:
        with manager.use("t") as t:
            t.submit_append(notes()).result()  # the worker is not started: all of it waits
            assert t.unembedded_count() == len(TEXTS)
            counted.append(t)
            worker.start()
            drained(t)
            assert model.loaded  # type: ignore[attr-defined]
        # One embed call of eight texts, written in three turns of the writer (3, 3, 2): an
        # append that arrives meanwhile is committed after at most one of them. (A turn is
        # noted after its jobs are answered: the last note may come a moment after the drain.)
        wait_until(lambda: len(left) >= 3, "every writer turn noted")
        assert left == [5, 2, 0]
    finally:
        worker.stop()
        manager.close_all()


def test_vectors_written_in_chunks_are_those_a_rebuild_reads_from_the_log(
    tmp_path: Path, model: Embedder
) -> None:
    worker = EmbeddingWorker(model, default_dim=384, batch=len(TEXTS), write_chunk=3)
    manager = TenantManager(tmp_path, embedding_dim=384, embedding=worker)
    own = model.embed(TEXTS)
    worker.start()
    try:
        with manager.use("t") as t:
            ids = [r.event_id for r in t.submit_append(notes()).result()]
            read_back = t.catch_ups
            drained(t)
            t.vectors.flush()
            # Projected from memory, not read back from the log; the indexes' marks are the
            # log's newest op, so the next append batch is projected too.
            assert t.catch_ups == read_back
            assert t.vector_seq == t.keyword_seq == t.last_seq()
            with t.log.reader() as r:
                stored = [r.get(e).embedding for e in ids]  # type: ignore[union-attr]
            assert np.allclose(np.asarray(stored, dtype=np.float32), own, atol=1e-5)
            found = [t.recall(RecallQuery(embedding=v.tolist(), k=1)).hits for v in own]
            assert [h[0].event.event_id for h in found] == ids
            t.submit_append([NewEvent(kind="note", ts=T0, text="one more")]).result()
            assert t.catch_ups == read_back
    finally:
        worker.stop()
        manager.close_all()
    # The vector file gone, the reopen builds the graph from the log: the same nearest events.
    root = manager.path_of("t")
    (root / files.VECTORS).unlink()
    t = Tenant.open("t", root, embedding_dim=384)
    try:
        rebuilt = [t.recall(RecallQuery(embedding=v.tolist(), k=1)).hits for v in own]
        assert [h[0].event.event_id for h in rebuilt] == ids
    finally:
        t.close()


# In a process of its own: which threads the tokenizer and onnxruntime start is process-wide.
NICE_PROBE = """
import json, os, threading
from storage.embedders.local import LocalEmbedder

def nices():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = open(f"/proc/self/task/{tid}/stat").read()
        except FileNotFoundError:  # a thread that ended since the listing holds no priority
            continue
        out[tid] = int(stat[stat.rindex(")") + 2 :].split()[16])
    return out

e = LocalEmbedder(threads=2)
e.load()
before = nices()
e.embed_query("how does Lena want status notes written?")  # a request's, at nice 0, first

def background():
    me = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, me, os.getpriority(os.PRIO_PROCESS, me) + 10)
    e.embed([f"note {i}: " + "three bullets, no tables " * (i % 7) for i in range(96)])

t = threading.Thread(target=background)
t.start()
t.join()
# A joined thread can still be listed for a moment while the kernel ends it: not one it made.
gone = {str(t.native_id)}
print(json.dumps(sorted(v for k, v in nices().items() if k not in before and k not in gone)))
"""


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="per-thread nice is Linux's")
def test_a_query_embedded_first_leaves_no_thread_at_its_priority_for_batches() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", NICE_PROBE], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    started = json.loads(proc.stdout)  # the nice values of the threads the two calls started
    # The local model's two workers, niced as the thread that made them; no tokenizer pool
    # made at the query's priority that every later batch would run on. (Relative to this
    # process's own nice: make test may run niced.)
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert started == [mine + 10, mine + 10]

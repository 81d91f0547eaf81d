"""Recall after crashes and lost indexes: the log is the truth, and both indexes are rebuilt from it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import hnswlib
import msgspec
import numpy as np
import pytest

from storage.index.flat import unit
from storage.index.vecfile import read_vectors
from storage.model import AppendResult, NewEvent
from storage.read.recall import RecallQuery, RecallResult, recall
from storage.tenants.tenant import Tenant
from tests.support.wait import remove_tree

REPO = Path(__file__).resolve().parents[2]
WORDS = (
    "parcel",
    "invoice",
    "ledger",
    "refund",
    "carrier",
    "street",
    "copy",
    "freeze",
    "door",
    "case",
)


def corpus(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """N events with distinct unit embeddings and texts of three words each."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, 4))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [
        {
            "kind": "turn" if i % 3 else "fact",
            "ts": 1_791_208_939_000_000 + i,  # µs in 2026: the API refuses times before 2000
            "text": " ".join(rng.choice(WORDS, size=3)) + f" item{i}",
            "embedding": [float(x) for x in vectors[i]],
        }
        for i in range(n)
    ]


QUERIES: list[dict[str, Any]] = [
    {"text": "parcel refund", "k": 20},
    {"text": "ledger", "kind": "fact", "k": 10},
    {"embedding": [1.0, 0.0, 0.0, 0.0], "k": 20},
    {"text": "copy freeze door", "embedding": [0.0, 1.0, 0.5, 0.0], "k": 15},
]


def answers(t: Tenant) -> list[list[tuple[str, float]]]:
    """Every query's hits as (id, score), for comparing a tenant before and after a rebuild."""
    out = []
    for q in QUERIES:
        with t.log.reader() as r:
            result: RecallResult = recall(r, t.keyword, t.vectors, RecallQuery(**q))
        out.append([(h.event.event_id, round(h.score, 12)) for h in result.hits])
    return out


def filled_tenant(root: Path, n: int = 120) -> tuple[Tenant, list[str]]:
    """A tenant holding corpus(n), some of it deleted; returns it open with the live ids."""
    t = Tenant.open("t1", root, embedding_dim=4)
    events = [NewEvent(**e) for e in corpus(n)]
    results = t.submit_append(events).result()
    ids = [r.event_id for r in results if isinstance(r, AppendResult)]
    t.submit_delete(ids[::10]).result()
    return t, [e for i, e in enumerate(ids) if i % 10]


# -- lost or damaged indexes ----------------------------------------------------------------------


def _remove_keyword(root: Path) -> None:
    remove_tree(root / "keyword")


def _damage_keyword(root: Path) -> None:
    (root / "keyword" / "meta.json").write_text("{ not json")


def _remove_vectors(root: Path) -> None:
    for p in root.glob("vectors.hnsw*"):
        p.unlink()


def _truncate_vectors(root: Path) -> None:
    p = root / "vectors.hnsw"
    p.write_bytes(p.read_bytes()[:100])


def _remove_vector_sidecar(root: Path) -> None:
    (root / "vectors.hnsw.live.npy").unlink()


@pytest.mark.parametrize(
    "damage",
    [
        _remove_keyword,
        _damage_keyword,
        _remove_vectors,
        _truncate_vectors,
        _remove_vector_sidecar,
    ],
)
def test_a_lost_or_damaged_index_is_rebuilt_on_open_and_answers_the_same(
    tmp_path: Path, damage: Any
) -> None:
    root = tmp_path / "t1"
    t, live = filled_tenant(root)
    before = answers(t)
    assert all(before), "every query should find something"
    t.close()
    damage(root)
    t = Tenant.open("t1", root, embedding_dim=4)
    try:
        assert answers(t) == before
        assert t.keyword.doc_count() == len(live)
        assert t.vectors.count() == len(live)
    finally:
        t.close()


# -- a crash between the log commit and the index updates ------------------------------------------

CRASH_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import msgspec
    from pathlib import Path
    from storage.index.keyword import KeywordDoc
    from storage.model import NewEvent
    from storage.tenants.tenant import Tenant

    root, stage = Path(sys.argv[1]), sys.argv[2]
    events = [NewEvent(**e) for e in msgspec.json.decode(sys.stdin.buffer.read())]
    t = Tenant.open("t1", root, embedding_dim=4)
    half = len(events) // 2
    t.submit_append(events[:half]).result()  # acknowledged: log, keyword, vector tail
    # The rest is committed to the log and, for "keyword", to the keyword index only:
    # the process dies before any further projection work, as a crash would leave it.
    t.log.append_batch(events[half:])
    if stage == "keyword":
        with t.log.reader() as r:
            docs = [KeywordDoc(ev.event_id, ev.kind, ev.text, ev.filterable, ev.seq)
                    for ev in (r.get(e) for _s, _op, e in r.ops_after(t.keyword_seq)) if ev]
        t.keyword.add(docs)
        t.keyword.commit()
    sys.stdout.write("committed\\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("stage", ["log", "keyword"])
def test_events_committed_to_the_log_before_a_kill_are_recallable_after_restart(
    tmp_path: Path, stage: str
) -> None:
    root = tmp_path / "t1"
    events = corpus(60)
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT, str(root), stage],
        input=msgspec.json.encode(events),
        capture_output=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert proc.stdout == b"committed\n"
    t = Tenant.open("t1", root, embedding_dim=4)
    try:
        assert t.keyword.doc_count() == 60 and t.vectors.count() == 60
        for e in events[30:]:
            result = _one(t, {"embedding": e["embedding"], "k": 1})
            assert result.hits[0].event.text == e["text"]
            by_text = _one(t, {"text": e["text"].split()[-1], "k": 5})  # the unique itemN word
            assert [h.event.text for h in by_text.hits] == [e["text"]]
            assert by_text.hits[0].score == pytest.approx(1 / 61)  # indexed once, not twice
    finally:
        t.close()


def _one(t: Tenant, q: dict[str, Any]) -> RecallResult:
    with t.log.reader() as r:
        return recall(r, t.keyword, t.vectors, RecallQuery(**q))


def test_a_server_killed_right_after_acknowledging_appends_recalls_them_after_restart(
    start_server: Any, tmp_path: Path
) -> None:
    events = corpus(80, seed=11)
    server = start_server()
    with server.client("crashy") as c, ThreadPoolExecutor(8) as pool:
        # Eight clients at once, so acknowledged batches hold several events.
        responses = list(pool.map(lambda e: c.post("/v1/memory/event", json=e), events))
        assert all(r.status_code == 201 for r in responses)
        ids = [r.json()["event_id"] for r in responses]
        assert c.delete(f"/v1/memory/event/{ids[0]}").json()["deleted"] is True
    # The HNSW graph fills in the background and is saved only on a clean close: kill -9 now.
    server.stop(signal.SIGKILL)
    server = start_server(data_dir=server.data_dir)
    with server.client("crashy") as c:
        for i in range(1, 80, 3):
            body = {"embedding": events[i]["embedding"], "k": 1}
            hits = c.post("/v1/memory/recall", json=body).json()["hits"]
            assert [h["event_id"] for h in hits] == [ids[i]]
            word = events[i]["text"].split()[-1]
            hits = c.post("/v1/memory/recall", json={"text": word, "k": 5}).json()["hits"]
            assert [h["event_id"] for h in hits] == [ids[i]]
        gone = c.post("/v1/memory/recall", json={"text": events[0]["text"], "k": 100}).json()
        assert ids[0] not in {h["event_id"] for h in gone["hits"]}
        gone = c.post("/v1/memory/recall", json={"embedding": events[0]["embedding"], "k": 100})
        assert ids[0] not in {h["event_id"] for h in gone.json()["hits"]}
        assert len(gone.json()["hits"]) == 79


def test_a_saved_index_gives_back_the_vectors_hnswlib_holds(tmp_path: Path) -> None:
    index = hnswlib.Index(space="cosine", dim=5)
    index.init_index(max_elements=300, M=16, ef_construction=100)
    data = np.random.default_rng(3).standard_normal((200, 5)).astype(np.float32)
    data[7] = 0.0  # a zero vector stays zero
    index.add_items(
        data, np.arange(1000, 1200), num_threads=2
    )  # threads: file order != label order
    index.mark_deleted(1010)
    index.save_index(str(tmp_path / "v.hnsw"))
    labels, vectors = read_vectors(tmp_path / "v.hnsw", 5)
    assert sorted(labels.tolist()) == list(range(1000, 1200))
    np.testing.assert_allclose(vectors, unit(data[labels - 1000]), atol=1e-6)
    live = [lb for lb in labels.tolist() if lb != 1010]
    np.testing.assert_array_equal(vectors[labels != 1010], np.asarray(index.get_items(live)))
    (tmp_path / "short.hnsw").write_bytes((tmp_path / "v.hnsw").read_bytes()[:500])
    with pytest.raises(ValueError, match="truncated"):
        read_vectors(tmp_path / "short.hnsw", 5)

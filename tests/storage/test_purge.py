"""Purge on real LMDB, Tantivy and hnswlib files: no byte of a purged event left under the tenant
directory, writes during a purge kept, failures and crashes leaving a tenant that opens."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import hnswlib
import lmdb
import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import files
from storage.erasure import apart, swap
from storage.erasure.compact import rewrite, sync_delta
from storage.erasure.purge import PurgeStats
from storage.index.keyword import KeywordDoc, KeywordIndex
from storage.index.vecfile import VectorFileError, count_labels, erase_labels
from storage.log.eventlog import EventLog
from storage.model import NewEvent
from storage.tenants.tenant import Tenant
from tests.support.erasure import (
    DIM,
    ROLL_STEPS,
    VOCAB,
    append,
    check_tenant,
    embedding_patterns,
    index_terms,
    last_tokens,
    neighbour,
    rare_token,
    record,
    scan,
    text_of,
    text_patterns,
)
from tests.support.wait import wait_until

REPO = Path(__file__).resolve().parents[2]

# -- the forensic scan -----------------------------------------------------------------------


def terms_of(texts: list[str], scratch: Path) -> set[str]:
    """The terms the keyword index makes of these texts (its own tokenizer and stemmer)."""
    index = KeywordIndex.open(scratch)
    index.add(KeywordDoc(f"d{i}", "k", text, {}, i) for i, text in enumerate(texts))
    index.commit()
    index.close()
    return index_terms(scratch)  # scratch stays: a let-go index's watcher may still touch it


# -- building tenants --------------------------------------------------------------------------


def stored_vector(t: Tenant, event_id: str) -> bytes:
    """The bytes hnswlib keeps for an event's vector (cosine space: normalised by its own code)."""
    ev = record(t, event_id)
    assert ev is not None
    if t.vectors.index is None:  # a small index: its rows, as its file holds them
        return bytes(np.asarray(t.vectors._tail.rows([ev.seq]), dtype="<f4").tobytes())
    return bytes(np.asarray(t.vectors.index.get_items([ev.seq]), dtype="<f4").tobytes())


@pytest.fixture
def rng() -> random.Random:
    return random.Random(20261130)


@pytest.fixture(params=["thread", "child"])
def copier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where the purge copies the log: on its own thread, or (whatever the tenant's size) in a
    child process as a large tenant's is (storage/erasure/apart.py)."""
    if request.param == "child":
        monkeypatch.setattr(apart, "APART_FROM_RECORDS", 0)
    return str(request.param)


# -- the forensic test -----------------------------------------------------------------------


def test_purge_leaves_no_byte_of_the_victim(
    tmp_path: Path, rng: random.Random, copier: str
) -> None:
    root = tmp_path / "t1"
    t = Tenant.open("t1", root, embedding_dim=DIM)
    ids = append(t, [neighbour(rng, i) for i in range(20)])
    rare = [rare_token(rng) for _ in range(3)]
    text = f"Customer: the door code is 4471, {rare[0]} {rare[1]} leave parcels with {rare[2]}"
    vector = [rng.uniform(-1, 1) for _ in range(DIM)]
    secret = "gate-" + rare_token(rng)
    body = msgspec.json.encode({"text": text})
    victim_event = NewEvent(
        kind="turn",
        ts=1_000_500,
        text=text,
        embedding=vector,
        properties_raw=msgspec.json.encode({"speaker": "customer", "gate": secret}),
        source_ids=(ids[3], ids[7]),
        event_id="6f1c2a55-0d53-4c2e-9a3e-3a0b7d9e2f10",
        body_hash=hashlib.sha256(body).digest(),
    )
    # One batch: the victim shares LMDB pages and a Tantivy segment with its neighbours.
    batch = [neighbour(rng, i) for i in range(20, 300)]
    batch.insert(140, victim_event)
    written = append(t, batch)
    victim = written.pop(140)
    ids += written
    derived = append(t, [NewEvent(kind="fact", ts=1_000_600, text="a fact", source_ids=(victim,))])
    t.save_vectors()
    patterns = (
        text_patterns(text, rare) | embedding_patterns(vector) | {"property": secret.encode()}
    )
    patterns["as hnswlib holds it"] = stored_vector(t, victim)

    # The scan can fail: before the delete every kind of pattern is on disk somewhere.
    before = scan(root, patterns)
    for label in ("text", f"token {rare[0]}", "as hnswlib holds it", "float32", "property"):
        assert label in before, label
    gone = last_tokens(t, rng.sample(ids, 20))  # more deletes, so pages and segments were shared
    survivors = [e for e in ids if e not in gone]
    live_terms = terms_of([t_ for e in survivors if (t_ := text_of(t, e))], tmp_path / "live")
    victim_terms = terms_of([text], tmp_path / "victim") - live_terms
    assert {"door", "code", "4471", rare[1].lower()} <= victim_terms

    assert t.submit_delete([victim]).result() == [victim]
    t.submit_delete(list(gone)).result()
    t.keyword.flush()  # the background fold commits within 250 ms; read its files now
    assert victim_terms <= index_terms(root / "keyword")  # deleted is not yet erased
    stats = t.purge()
    assert stats.purged == 21 and stats.pending == 0

    assert scan(root, patterns) == {}
    assert index_terms(root / "keyword") & victim_terms == set()
    assert sorted(p.name for p in root.iterdir()) == sorted(files.STORES)
    gone[victim] = rare[0].lower()
    check_tenant(t, survivors, gone)
    assert record(t, derived[0]) is not None
    # The idempotency record kept what a retry needs: the same body replays, nothing more.
    [replay] = t.submit_append([victim_event]).result()
    assert replay.replayed and replay.event_id == victim
    t.close()

    reopened = Tenant.open("t1", root, embedding_dim=DIM)
    check_tenant(reopened, survivors, gone)
    reopened.close()
    assert scan(root, patterns) == {}
    assert index_terms(root / "keyword") & victim_terms == set()


def test_the_rebuilt_keyword_index_answers_like_the_one_it_replaces(
    tmp_path: Path, rng: random.Random
) -> None:
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=DIM)
    ids = append(t, [neighbour(rng, i) for i in range(120)])
    filters: list[dict[str, Any]] = [
        {},
        {"speaker": "agent"},
        {"n": 7},
        {"n": 7.0, "speaker": "customer"},
    ]
    queries = [
        (w, k, f) for w in [*VOCAB[:3], "nb00007"] for k in (None, "turn", "fact") for f in filters
    ]

    def answers() -> list[set[str]]:
        return [
            {e for e, _s in t.keyword.search(w, limit=500, kind=k, filters=f)}
            for w, k, f in queries
        ]

    before = answers()
    t.submit_delete([ids[7]]).result()
    t.purge()
    assert answers() == [found - {ids[7]} for found in before]
    assert any(before) and any(ids[7] in found for found in before)
    t.close()


def test_erasing_labels_in_a_saved_vector_file_is_what_hnswlib_reads(tmp_path: Path) -> None:
    gen = np.random.default_rng(5)
    data = gen.standard_normal((300, DIM)).astype(np.float32)
    index = hnswlib.Index(space="cosine", dim=DIM)
    index.init_index(max_elements=400, M=16, ef_construction=50)
    index.add_items(data, np.arange(1000, 1300))
    index.mark_deleted(1001)
    path = tmp_path / "v.hnsw"
    index.save_index(str(path))
    doomed = {1000, 1001, 1150, 1299, 99999}  # one already deleted, one never there
    before = path.read_bytes()
    stored = {
        lb: np.asarray(index.get_items([lb]), dtype="<f4").tobytes() for lb in (1000, 1150, 1299)
    }
    assert all(v in before for v in stored.values())

    assert count_labels(path, doomed, DIM) == 4
    assert erase_labels(path, doomed, DIM) == 4
    after = path.read_bytes()
    assert len(after) == len(before) and not any(v in after for v in stored.values())
    loaded = hnswlib.Index(space="cosine", dim=DIM)
    loaded.load_index(str(path))
    for label in (1000, 1001, 1150, 1299):
        with pytest.raises(RuntimeError):
            loaded.get_items([label])  # marked deleted
    kept = [lb for lb in range(1000, 1300) if lb not in doomed]
    assert np.allclose(loaded.get_items(kept), index.get_items(kept))
    labels, _d = loaded.knn_query(data[150], k=5)
    assert 1150 not in labels[0]
    with pytest.raises(VectorFileError):
        erase_labels(path, {1002}, DIM * 4)  # the records cannot hold that many floats


def test_a_vector_file_without_the_purged_vectors_stays(tmp_path: Path, rng: random.Random) -> None:
    root = tmp_path / "t1"
    t = Tenant.open("t1", root, embedding_dim=DIM)
    ids = append(t, [neighbour(rng, i) for i in range(40)])
    t.save_vectors()
    saved = (root / "vectors.hnsw").stat().st_ino
    later = append(t, [neighbour(rng, 99)])  # after the save: only in memory
    t.submit_delete(later).result()
    assert t.purge().purged == 1
    assert (root / "vectors.hnsw").stat().st_ino == saved
    check_tenant(t, ids, last_tokens(t, []))
    t.close()


def test_a_vector_file_it_cannot_read_is_saved_anew(tmp_path: Path, rng: random.Random) -> None:
    root = tmp_path / "t1"
    t = Tenant.open("t1", root, embedding_dim=DIM)
    ids = append(t, [neighbour(rng, i) for i in range(60)])
    t.save_vectors()
    victim = ids[5]
    hidden = stored_vector(t, victim)
    (root / "vectors.hnsw").write_bytes(b"not an index" + hidden)  # damaged after the open
    gone = last_tokens(t, [victim])
    t.submit_delete([victim]).result()
    assert t.purge().purged == 1
    assert scan(root, {"vector": hidden}) == {}
    check_tenant(t, ids[6:], gone)
    t.close()
    reopened = Tenant.open("t1", root, embedding_dim=DIM)  # the fresh save opens cleanly
    check_tenant(reopened, ids[6:], gone)
    reopened.close()


# -- writes during a purge ---------------------------------------------------------------------


def test_writes_during_the_purge_are_kept(tmp_path: Path, rng: random.Random, copier: str) -> None:
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=DIM)
    ids = append(t, [neighbour(rng, i) for i in range(200)])
    early = last_tokens(t, ids[:10])
    t.submit_delete(list(early)).result()
    added: list[str] = []
    late: list[str] = []
    stop = threading.Event()

    def write_meanwhile() -> None:
        wrng = random.Random(7)
        i = 1000
        while not stop.is_set():
            new = append(t, [neighbour(wrng, i), neighbour(wrng, i + 1)])
            fact = NewEvent(
                kind="fact", ts=2_000_000 + i, text=f"derived nd{i}", source_ids=(new[0], ids[50])
            )
            added.extend(new + append(t, [fact]))
            late.extend(t.submit_delete([new[1], ids[100 + i % 50]]).result())
            i += 2

    def after_snapshot(name: str) -> None:
        if name == "copied":  # let writes and deletes land between the snapshot and the swap
            seen = len(added)
            while len(added) < seen + 30 and thread.is_alive():
                time.sleep(0.01)

    thread = threading.Thread(target=write_meanwhile)
    thread.start()
    try:
        stats = t.purge(after_snapshot)
    finally:
        stop.set()
        thread.join()
    assert added and late
    live = [e for e in ids + added if e not in early and e not in late]
    with t.log.reader() as r:
        assert [e for e in live if r.get(e) is None] == []
        # Every delete was purged (those before the snapshot) or is left for the next purge.
        pending = set(r.tombstone_ids())
        assert pending <= set(late)
        assert stats.purged - len(early) == len(set(late) - pending)
        assert r.count() == len(live)
        # Links written during the purge survived the swap, in both directions.
        facts = [e for e in added if (ev := r.get(e)) is not None and ev.text.startswith("derived")]
        for f in facts:
            assert r.links_out(f, "SOURCE_FROM")[-1] == ids[50]
            assert f in r.links_in(ids[50], "SOURCE_FROM")
    assert t.purge().purged == len(pending)
    check_tenant(t, live, early)
    t.close()


# -- the log copy equals the live log ----------------------------------------------------------


def dump(log: EventLog) -> dict[str, dict[bytes, bytes]]:
    """Every key and value of every database."""
    with log.reader() as r:
        return {name: dict(r.txn.cursor(db=db).iternext()) for name, db in r.dbs.items()}


def random_ops(log: EventLog, ids: list[str], data: st.DataObject, label: str) -> None:
    """A drawn sequence of appends (with links, properties, idempotency keys) and deletes, in one
    transaction (the copy cannot tell, and one fsync keeps the test fast)."""
    ops: list[NewEvent | str] = []
    known = list(ids)
    for _ in range(data.draw(st.integers(0, 20), label=f"{label} ops")):
        if known and data.draw(st.booleans(), label="delete?"):
            ops.append(data.draw(st.sampled_from(known)))
            continue
        pick = st.lists(st.sampled_from(known), max_size=3) if known else st.just([])
        key = str(data.draw(st.uuids(), label="id"))
        idempotent = data.draw(st.booleans(), label="idempotent?")
        ops.append(
            NewEvent(
                kind=data.draw(st.sampled_from(["turn", "fact"])),
                ts=data.draw(st.integers(0, 50)),
                text=data.draw(st.text(max_size=20)),
                properties_raw=msgspec.json.encode(
                    {"p": data.draw(st.integers(0, 3) | st.text(max_size=5))}
                ),
                source_ids=tuple(data.draw(pick)),
                supersedes=tuple(data.draw(pick)),
                event_id=key,  # fixed ids so later draws can name them
                body_hash=b"h" if idempotent else None,
            )
        )
        known.append(key)

    def apply(txn: lmdb.Transaction) -> None:
        for op in ops:
            if isinstance(op, str):
                log.delete_in(txn, [op])
            else:
                result = log.append_one(txn, op)
                assert not isinstance(result, Exception)

    log.write(apply)
    ids[:] = known


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_copy_plus_delta_equals_the_live_log(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        live = EventLog.open(Path(tmp, "live"), embedding_dim=4)
        ids: list[str] = []
        random_ops(live, ids, data, "before")
        with live.reader() as r:
            since = r.last_seq()
            rewrite(r, Path(tmp, "copy"), live.map_size())
        random_ops(live, ids, data, "after")
        copy = EventLog.open(Path(tmp, "copy"), embedding_dim=4)
        with live.reader() as r:
            changed = copy.write(lambda txn: sync_delta(r, copy.view(txn), since))
        assert dump(copy) == dump(live)
        with live.reader() as r:
            assert changed == {e for _s, _op, e in r.ops_after(since)}
        copy.close()
        live.close()


# -- one purge at a time, shared by whoever asked before it began ----------------------------


def test_concurrent_purges_share_one(tmp_path: Path, rng: random.Random) -> None:
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=DIM)
    ids = append(t, [neighbour(rng, i) for i in range(60)])
    t.submit_delete(ids[:5]).result()
    held, release = threading.Event(), threading.Event()
    stages: list[str] = []

    def hold(name: str) -> None:
        if name == "copied":
            held.set()
            release.wait()

    def count(name: str) -> None:
        if name == "stage":
            stages.append(name)

    results: list[PurgeStats] = []
    first = threading.Thread(target=lambda: results.append(t.purge(hold)))
    first.start()
    assert held.wait(10)
    t.submit_delete([ids[10]]).result()  # after the first purge's snapshot
    others = [threading.Thread(target=lambda: results.append(t.purge(count))) for _ in range(2)]
    for th in others:
        th.start()
    time.sleep(0.3)  # both have asked and wait for the first purge
    release.set()
    for th in [first, *others]:
        th.join()
    assert len(stages) == 1  # one of the two purged; the other was answered by that purge
    assert sorted(r.purged for r in results) == [0, 1, 5]
    assert t.log.tombstones() == []
    t.close()


def test_nothing_to_purge_touches_no_file(tmp_path: Path, rng: random.Random) -> None:
    root = tmp_path / "t1"
    t = Tenant.open("t1", root, embedding_dim=DIM)
    append(t, [neighbour(rng, i) for i in range(10)])
    swap.mark_pending(root)
    inode = (root / "events" / "data.mdb").stat().st_ino
    assert t.purge().purged == 0
    assert (root / "events" / "data.mdb").stat().st_ino == inode
    assert not (root / swap.PENDING).exists()  # a stale marker is dropped
    t.close()


def test_after_a_purge_a_reopen_replays_nothing(tmp_path: Path, rng: random.Random) -> None:
    root = tmp_path / "t1"
    t = Tenant.open("t1", root, embedding_dim=DIM)
    ids = append(t, [neighbour(rng, i) for i in range(50)])
    t.save_vectors()
    t.submit_delete(ids[:2]).result()
    t.purge()
    append(t, [neighbour(rng, 77)])
    t.close()
    log = EventLog.open(root / "events")
    with log.reader() as r:
        last = r.last_seq()
        assert (r.meta_int("keyword_seq"), r.meta_int("vector_seq")) == (last, last)
    log.close()


# -- failures and crashes ----------------------------------------------------------------------


class Boom(Exception):
    """A failure injected at one step of a purge."""


def test_a_full_disk_in_the_copying_child_is_a_full_disk_here(
    tmp_path: Path, rng: random.Random, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(apart, "APART_FROM_RECORDS", 0)
    monkeypatch.setenv("MEMSPINE_FAILPOINTS", "purge.copy=enospc")  # armed in the child only
    root = tmp_path / "t1"
    t = Tenant.open("t1", root, embedding_dim=DIM)
    ids = append(t, [neighbour(rng, i) for i in range(40)])
    t.submit_delete(ids[:3]).result()
    with pytest.raises(OSError) as failed:
        t.purge()
    assert failed.value.errno == errno.ENOSPC  # what storage/space.py recognises as a full disk
    assert not (root / swap.STAGING).exists() and sorted(t.log.tombstones()) == sorted(ids[:3])
    monkeypatch.delenv("MEMSPINE_FAILPOINTS")
    assert t.purge().purged == 3
    t.close()


def test_a_kill_9_mid_copy_ends_the_copying_child_and_the_purge_is_redone(
    tmp_path: Path, rng: random.Random
) -> None:
    root, gates = tmp_path / "t1", tmp_path / "gates"
    gates.mkdir()
    t = Tenant.open("t1", root, embedding_dim=DIM)
    ids = append(t, [neighbour(rng, i) for i in range(40)])
    t.submit_delete(ids[:3]).result()
    t.close()
    purging = (
        "import sys; from pathlib import Path; from storage.erasure import apart; "
        "apart.APART_FROM_RECORDS = 0; from storage.tenants.tenant import Tenant; "
        f"Tenant.open('t1', Path(sys.argv[1]), embedding_dim={DIM}).purge()"
    )
    env = {**os.environ, "MEMSPINE_FAILPOINTS": "purge.copy=pause"}
    env["MEMSPINE_FAILPOINT_GATES"] = str(gates)  # the child stops in its copy, at purge.copy
    parent = subprocess.Popen([sys.executable, "-c", purging, str(root)], env=env, cwd=REPO)
    try:
        wait_until(lambda: (gates / "purge.copy.reached").exists(), "the child copying")
        children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
        [child] = [int(c) for c in children]
    finally:
        parent.kill()
        parent.wait()
    wait_until(lambda: not _running(child), "the child ended with its parent")
    assert (root / swap.STAGING).exists()  # the copy the kill interrupted
    t = Tenant.open("t1", root, embedding_dim=DIM)
    assert not (root / swap.STAGING).exists()  # discarded by the open (swap.recover)
    assert sorted(t.log.tombstones()) == sorted(ids[:3])
    assert t.purge().purged == 3
    check_tenant(t, ids[3:], {})
    t.close()


def _running(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("at", ["copied", "indexed", "synced", "vectors", "fsynced"])
def test_a_purge_failing_before_its_commit_leaves_the_tenant_as_it_was(
    tmp_path: Path, rng: random.Random, at: str
) -> None:
    root = tmp_path / "t1"
    t = Tenant.open("t1", root, embedding_dim=DIM)
    ids = append(t, [neighbour(rng, i) for i in range(80)])
    gone = last_tokens(t, ids[:4])
    t.submit_delete(list(gone)).result()

    def fail(name: str) -> None:
        if name == at:
            raise Boom(name)

    with pytest.raises(Boom):
        t.purge(fail)
    assert not any((root / n).exists() for n in (swap.STAGING, swap.READY, swap.OLD))
    assert sorted(t.log.tombstones()) == sorted(gone)  # nothing was purged
    more = append(t, [neighbour(rng, 500)])  # the writer carries on
    assert record(t, more[0]) is not None
    assert t.purge().purged == 4
    check_tenant(t, ids[4:] + more, gone)
    t.close()


@pytest.mark.parametrize("at", ["swap:events", "swap:keyword", "swap:vectors.hnsw"])
def test_a_purge_failing_after_its_commit_still_swaps(
    tmp_path: Path, rng: random.Random, at: str
) -> None:
    root = tmp_path / "t1"
    t = Tenant.open("t1", root, embedding_dim=DIM)
    ids = append(t, [neighbour(rng, i) for i in range(80)])
    t.save_vectors()  # so there is a vector file to swap
    gone = last_tokens(t, ids[:4])
    t.submit_delete(list(gone)).result()

    def fail(name: str) -> None:
        if name == at:
            raise Boom(name)

    with pytest.raises(Boom):
        t.purge(fail)
    assert not any((root / n).exists() for n in (swap.STAGING, swap.READY, swap.OLD))
    check_tenant(t, ids[4:], gone)  # the new files, swapped in whole
    t.close()


@pytest.mark.parametrize("at", range(len(ROLL_STEPS)))
def test_recover_finishes_a_committed_swap_from_any_point(tmp_path: Path, at: int) -> None:
    root = tmp_path / "t"
    (root / swap.READY).mkdir(parents=True)
    for name in files.STORES:
        for base, content in ((root, b"old"), (root / swap.READY, b"new")):
            path = base / name
            if name in ("events", "keyword"):
                path.mkdir()
                (path / "f").write_bytes(content)
            else:
                path.write_bytes(content)

    def crash(name: str) -> None:
        if name == ROLL_STEPS[at]:
            raise Boom(name)

    with pytest.raises(Boom):
        swap.roll_forward(root, crash)
    swap.recover(root)
    assert sorted(p.name for p in root.iterdir()) == sorted(files.STORES)
    for name in files.STORES:
        path = root / name / "f" if name in ("events", "keyword") else root / name
        assert path.read_bytes() == b"new"


def test_recover_between_the_two_renames_of_one_store(tmp_path: Path) -> None:
    root = tmp_path / "t"
    for base in (root / swap.READY, root / swap.OLD):
        (base / "events").mkdir(parents=True)
    (root / swap.READY / "events" / "f").write_bytes(b"new")
    (root / "keyword").mkdir()
    swap.recover(root)
    assert (root / "events" / "f").read_bytes() == b"new"
    assert sorted(p.name for p in root.iterdir()) == ["events", "keyword"]


def test_recover_discards_an_uncommitted_stage(tmp_path: Path) -> None:
    root = tmp_path / "t"
    (root / swap.STAGING / "events").mkdir(parents=True)
    (root / swap.STAGING / "events" / "data.mdb").write_bytes(b"new")
    (root / "events").mkdir()
    (root / "events" / "data.mdb").write_bytes(b"old")
    (root / "vectors.hnsw.tmp").write_bytes(b"a save a crash interrupted")
    swap.recover(root)
    assert (root / "events" / "data.mdb").read_bytes() == b"old"
    assert sorted(p.name for p in root.iterdir()) == ["events"]

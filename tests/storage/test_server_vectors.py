"""Server vectors in the log: the vector-space rules, the list of events awaiting a vector, the
vectors written into records (and the vector index, a restart, a rebuild, an export, a purge),
the chain of turns after a delete, and the migration of format-2 logs."""

from __future__ import annotations

import hashlib
import io
import shutil
from pathlib import Path

import lmdb
import numpy as np
import pytest

from storage import files
from storage.errors import EmbeddingMismatch
from storage.log import layout
from storage.log.eventlog import EventLog
from storage.model import (
    CHAIN_WEIGHT,
    ItemRefused,
    NewEvent,
    ServerSpace,
    StoredEvent,
    StoredVector,
)
from storage.read.recall import RecallQuery
from storage.tenants.embedding import chain
from storage.tenants.tenant import Tenant
from storage.transfer.export import export_lines
from storage.transfer.format import FORMAT_VERSION, Reader, end_line
from storage.transfer.load import lines_of, load, read_header
from tests.support.erasure import embedding_patterns, scan
from tests.support.oldlog import make_v6

T0 = 1_800_000_000_000_000
MINUTE = 60_000_000
MODEL = "test/server-model"
OFFER = ServerSpace(model=MODEL, dim=4)


def open_tenant(root: Path, offer: ServerSpace | None = OFFER) -> Tenant:
    """A tenant of dimension 4 offered OFFER (or nothing)."""
    return Tenant.open("t", root, embedding_dim=4, offer=(lambda: offer))


def append(t: Tenant, *events: NewEvent) -> list[object]:
    """Each event's result or error, appended in one job."""
    return list(t.submit_append(list(events)).result())


def note(text: str | None, i: int = 0, **kw: object) -> NewEvent:
    """A note at T0 + i minutes."""
    return NewEvent(kind="note", ts=T0 + i * MINUTE, text=text, **kw)  # type: ignore[arg-type]


def listed(t: Tenant) -> list[str]:
    """Ids of the events awaiting their server vector, oldest first."""
    with t.log.reader() as r:
        return [e for _seq, e in r.unembedded(1000)]


def give_vectors(t: Tenant, vectors: dict[str, list[float]]) -> int | None:
    """Write server vectors for listed events, as the background embedder does."""
    events, _before, deletes, model = t.to_embed(1000)
    items = [StoredVector(ev.event_id, ev.seq, vectors[ev.event_id]) for ev in events]
    assert model is not None
    return t.store_vectors(items, model, deletes).result()


def ids(results: list[object]) -> list[str]:
    """The event ids of append results."""
    return [r.event_id for r in results]  # type: ignore[attr-defined]


# -- the rules ------------------------------------------------------------------------------


def test_a_text_only_first_event_makes_the_tenant_server_space(tmp_path: Path) -> None:
    t = open_tenant(tmp_path / "t")
    a, empty = ids(append(t, note("three bullets, no tables"), note(None, 1)))
    assert t.space == layout.SPACE_SERVER
    assert listed(t) == [a]  # an event without text gets no vector
    space, waiting = t.vector_space()
    assert (space.made_by, space.model, space.dim, waiting) == ("server", MODEL, 4, 1)
    # A client vector must name the server's model ...
    refused = append(t, note("mine", 2, embedding=[1.0, 0, 0, 0]))
    assert isinstance(refused[0], EmbeddingMismatch)
    assert MODEL in refused[0].detail
    other = append(t, note("mine", 2, embedding=[1.0, 0, 0, 0], embedding_model="other"))
    assert isinstance(other[0], EmbeddingMismatch)
    # ... and is taken as it is when it does, not listed for the embedder.
    (same,) = ids(append(t, note("mine", 2, embedding=[1.0, 0, 0, 0], embedding_model=MODEL)))
    assert listed(t) == [a]
    with t.log.reader() as r:
        assert r.get(same).embedding == [1.0, 0, 0, 0]  # type: ignore[union-attr]
        assert r.get(empty).embedding is None  # type: ignore[union-attr]
    t.close()


def test_a_client_vector_first_makes_the_tenant_client_space_for_good(tmp_path: Path) -> None:
    t = open_tenant(tmp_path / "t")
    append(t, note("with a vector", embedding=[0, 1.0, 0, 0]))
    append(t, note("text only", 1))
    assert t.space == layout.SPACE_CLIENT
    assert listed(t) == []  # a client-space tenant is never embedded by the server
    assert t.vector_space()[0].made_by == "client"
    t.close()


def test_an_embedder_of_another_dimension_leaves_new_tenants_to_clients(tmp_path: Path) -> None:
    t = open_tenant(tmp_path / "t", ServerSpace(model=MODEL, dim=384))
    append(t, note("text only"))
    assert t.space is None and listed(t) == []
    append(t, note("then a vector", 1, embedding=[0, 0, 1.0, 0]))
    assert t.space == layout.SPACE_CLIENT
    t.close()


def test_text_appended_before_the_space_is_fixed_is_embedded_too(tmp_path: Path) -> None:
    t = open_tenant(tmp_path / "t", None)  # no embedder: the space stays nobody's
    (early,) = ids(append(t, note("before the embedder")))
    assert t.space is None and listed(t) == []
    t.close()
    t = open_tenant(tmp_path / "t")
    (late,) = ids(append(t, note("after", 1)))
    assert listed(t) == [early, late]
    t.close()


def test_an_atomic_batch_that_fails_lists_nothing(tmp_path: Path) -> None:
    t = open_tenant(tmp_path / "t")
    bad = note("bad vector", 1, embedding=[1.0, 2.0])  # wrong length: the batch is refused
    with pytest.raises(ItemRefused):
        t.submit_append([note("first"), bad], atomic=True).result()
    assert t.space is None and listed(t) == []
    t.close()


# -- vectors in the log --------------------------------------------------------------------


def test_server_vectors_are_recorded_indexed_and_survive_a_rebuild(tmp_path: Path) -> None:
    root = tmp_path / "t"
    t = open_tenant(root)
    a, b = ids(append(t, note("alpha"), note("beta", 1)))
    with t.log.reader() as r:
        before = r.meta_int(layout.LIVE_BYTES)
    assert give_vectors(t, {a: [1.0, 0, 0, 0], b: [0, 1.0, 0, 0]}) == 2
    assert listed(t) == []
    with t.log.reader() as r:
        ev = r.get(a)
        assert ev is not None and ev.embedding == [1.0, 0, 0, 0] and ev.embedding_model == MODEL
        assert (
            r.meta_int(layout.LIVE_BYTES)
            == sum(len(r.record(e) or b"") for e in (a, b))
            > (before or 0)
        )
    hit = t.recall(RecallQuery(embedding=[0, 0.9, 0.1, 0], k=1)).hits[0]
    assert hit.event.event_id == b
    t.close()
    # The vector file gone: the reopen rebuilds the graph from the log, vectors and all.
    (root / files.VECTORS).unlink()
    t = open_tenant(root)
    assert t.recall(RecallQuery(embedding=[0.9, 0.1, 0, 0], k=1)).hits[0].event.event_id == a
    t.close()


def test_the_list_survives_a_close_and_a_deleted_event_leaves_it(tmp_path: Path) -> None:
    root = tmp_path / "t"
    t = open_tenant(root)
    a, b = ids(append(t, note("alpha"), note("beta", 1)))
    t.close()
    t = open_tenant(root)
    assert listed(t) == [a, b]
    t.submit_delete([a]).result()
    assert listed(t) == [b]
    t.close()


def test_vectors_made_before_a_delete_are_made_again(tmp_path: Path) -> None:
    t = open_tenant(tmp_path / "t")
    (a,) = ids(append(t, note("alpha")))
    events, _before, deletes, model = t.to_embed(10)
    t.submit_delete([ids(append(t, note("other", 1)))[0]]).result()
    items = [StoredVector(a, events[0].seq, [1.0, 0, 0, 0])]
    assert model is not None
    assert t.store_vectors(items, model, deletes).result() is None  # stale: nothing written
    assert listed(t) == [a]
    t.close()


def test_purge_erases_a_server_vector(tmp_path: Path) -> None:
    root = tmp_path / "t"
    t = open_tenant(root)
    a, _b = ids(append(t, note("erase me"), note("keep me", 1)))
    secret = [0.123456789, -0.987654321, 0.5550001, 0.25]
    give_vectors(t, {a: secret, _b: [0, 0, 0, 1.0]})
    t.save_vectors()
    assert scan(root, embedding_patterns(secret))  # on disk, as expected
    t.submit_delete([a]).result()
    t.purge()
    t.close()
    assert scan(root, embedding_patterns(secret)) == {}


def test_deleting_a_turn_clears_the_vectors_chained_on_it(tmp_path: Path) -> None:
    t = open_tenant(tmp_path / "t")
    turns = [NewEvent(kind="turn", ts=T0 + i * MINUTE, text=f"turn {i}") for i in range(3)]
    far = NewEvent(kind="turn", ts=T0 + 90 * MINUTE, text="next session")
    a, b, c, d = ids(append(t, *turns, far))
    vecs = {e: list(np.eye(4)[i]) for i, e in enumerate((a, b, c, d))}
    give_vectors(t, vecs)
    t.submit_delete([a]).result()
    # b and c chained on a (within 30 minutes of each other); d starts a new chain.
    assert listed(t) == [b, c]
    with t.log.reader() as r:
        assert r.get(d).embedding is not None  # type: ignore[union-attr]
        assert r.get(b).embedding is None  # type: ignore[union-attr]
    hits = t.recall(RecallQuery(embedding=[0, 1.0, 0, 0], k=4)).hits
    assert b not in [h.event.event_id for h in hits]  # its old vector left the index
    t.close()


def test_the_chain_folds_each_turn_onto_the_one_before() -> None:
    own = np.eye(4, dtype=np.float32)[:3]
    events = [
        StoredEvent(event_id=f"e{i}", seq=i + 1, kind=kind, ts=T0 + ts * MINUTE)
        for i, (kind, ts) in enumerate((("turn", 0), ("turn", 10), ("turn", 60)))
    ]
    out = chain(events, own, None)
    assert np.allclose(out[0], own[0])
    expected = own[1] + CHAIN_WEIGHT * own[0]
    assert np.allclose(out[1], expected / np.linalg.norm(expected))
    assert np.allclose(out[2], own[2])  # 50 minutes later: a new chain


# -- export ---------------------------------------------------------------------------------


def test_an_export_carries_server_vectors_and_the_space(tmp_path: Path) -> None:
    src = open_tenant(tmp_path / "src")
    a, b = ids(append(src, note("alpha"), note("beta", 1)))
    events, _before, deletes, model = src.to_embed(1)  # a gets its vector, b still waits
    assert model is not None
    src.store_vectors(
        [StoredVector(a, events[0].seq, [0.1, 0.2, 0.3, 0.4])], model, deletes
    ).result()
    with src.log.reader() as r:
        data = b"".join(export_lines(r, "src"))
    src.close()
    assert b'"vectors_by":"server"' in data and f'"version":{FORMAT_VERSION}'.encode() in data
    dst = open_tenant(tmp_path / "dst", None)  # no embedder here: the file decides
    reader = Reader()
    lines = lines_of(io.BytesIO(data))
    read_header(lines, reader)
    load(dst, lines, reader)
    assert dst.space == layout.SPACE_SERVER
    with dst.log.reader() as r:
        assert r.meta_str(layout.MODEL) == MODEL
        # stored as float32s, given back as sent (storage/floats.py)
        assert r.get(a).embedding_out() == [0.1, 0.2, 0.3, 0.4]  # type: ignore[union-attr]
    assert listed(dst) == [b]  # the one still awaiting its vector awaits it here
    dst.close()


def test_an_export_of_version_1_still_loads(tmp_path: Path) -> None:
    src = open_tenant(tmp_path / "src", None)
    (a,) = ids(append(src, note("client", embedding=[1.0, 0, 0, 0])))
    with src.log.reader() as r:
        data = b"".join(export_lines(r, "src"))
    src.close()
    header, *body, _end = data.rstrip(b"\n").split(b"\n")
    old = header.replace(f'"version":{FORMAT_VERSION}'.encode(), b'"version":1').replace(
        b',"vectors_by":"client"', b""
    )
    assert b"vectors_by" not in old
    kept = [old + b"\n", *(line + b"\n" for line in body)]
    digest = hashlib.sha256(b"".join(kept)).hexdigest()
    file = b"".join(kept) + end_line(len(body), 0, digest)
    dst = open_tenant(tmp_path / "dst")
    reader = Reader()
    lines = lines_of(io.BytesIO(file))
    read_header(lines, reader)
    load(dst, lines, reader)
    assert dst.space == layout.SPACE_CLIENT  # from its vector, as version 1 always did
    with dst.log.reader() as r:
        assert r.get(a).embedding == [1.0, 0, 0, 0]  # type: ignore[union-attr]
    dst.close()


# -- migration ------------------------------------------------------------------------------


def as_format_2(path: Path) -> None:
    """Make the log at path look as version 2 wrote it: no space, no "unembedded" database
    (its records in the legacy database by raw id)."""
    make_v6(path)
    env = lmdb.open(str(path), max_dbs=len(layout.DB_NAMES) + 2)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        txn.put(layout.meta_key(layout.SCHEMA), layout.u64(2), db=meta)
        txn.delete(layout.meta_key(layout.SPACE), db=meta)
        txn.drop(env.open_db(b"unembedded", txn=txn), delete=True)
    env.close()


@pytest.mark.parametrize(
    ("event", "made_by"),
    [
        (note("a vector", embedding=[1.0, 0, 0, 0]), "client"),
        (note("a named vector", embedding=[1.0, 0, 0, 0], embedding_model="m"), "client"),
        (note("text only"), "none"),
    ],
)
def test_a_format_2_log_is_migrated_on_open(tmp_path: Path, event: NewEvent, made_by: str) -> None:
    path = tmp_path / "events"
    log = EventLog.open(path, embedding_dim=4)
    log.append_batch([event])
    log.close()
    as_format_2(path)
    log = EventLog.open(path, embedding_dim=4)
    with log.reader() as r:
        assert r.meta_int(layout.SCHEMA) == layout.SCHEMA_VERSION  # through every later step too
        space = {layout.SPACE_CLIENT: "client", None: "none"}[r.space()]
        assert space == made_by
        assert r.unembedded_count() == 0
    log.close()


def test_a_format_2_log_reads_read_only_before_its_migration(tmp_path: Path) -> None:
    from storage.log.eventlog import read_only

    path = tmp_path / "events"
    log = EventLog.open(path, embedding_dim=4)
    log.append_batch([note("old")])
    log.close()
    as_format_2(path)
    with read_only(path) as r:
        assert r.unembedded_count() == 0 and r.unembedded(5) == [] and r.count() == 1
    shutil.rmtree(path)


# -- re-embedding (the real local model, a handful of texts) --------------------------------------


def test_reembed_switches_a_tenant_to_the_current_model(tmp_path: Path) -> None:
    from storage.embedders.local import LocalEmbedder
    from storage.tenants.reembed import reembed

    root = tmp_path / "t"
    old = ServerSpace(model="old-model", dim=384)
    t = Tenant.open("t", root, embedding_dim=384, offer=lambda: old)
    texts = ["Lena wants three bullets, no tables.", "The parcel was signed for.", "no vector"]
    a, b, c = ids(append(t, note(texts[0]), note(texts[1], 1), note(texts[2], 2)))
    events, _before, deletes, model = t.to_embed(10)
    assert model == "old-model"
    stale = [StoredVector(e.event_id, e.seq, [1.0] + [0.0] * 383) for e in events[:2]]
    t.store_vectors(stale, model, deletes).result()  # c still awaits its vector
    t.close()
    embedder = LocalEmbedder()  # in this process: its graph built once (tests/conftest.py)
    seen: list[tuple[int, int]] = []
    stats = reembed(root, embedder, progress=lambda done, total: seen.append((done, total)))
    assert (stats.events, stats.model, stats.dim, stats.previous_model) == (
        3,
        embedder.name,
        384,
        "old-model",
    )
    assert seen[0] == (0, 3) and seen[-1] == (3, 3)
    t = Tenant.open("t", root, embedding_dim=384)
    assert listed(t) == []
    with t.log.reader() as r:
        assert r.meta_str(layout.MODEL) == embedder.name
        got = r.get(a)
        assert got is not None and got.embedding_model == embedder.name
        assert np.allclose(got.embedding, embedder.embed([texts[0]])[0], atol=1e-5)
    query = embedder.embed_query("who signed for the parcel?").tolist()
    assert t.recall(RecallQuery(embedding=query, k=1)).hits[0].event.event_id == b
    t.close()
    embedder.close()
    assert not (root / "reembed").exists()
    del c


def old_model_tenant(root: Path, texts: list[str]) -> None:
    """A closed server-space tenant of `texts`, its vectors made by "old-model"."""
    t = Tenant.open(
        "t", root, embedding_dim=384, offer=lambda: ServerSpace(model="old-model", dim=384)
    )
    append(t, *(note(text, i) for i, text in enumerate(texts)))
    events, _before, deletes, model = t.to_embed(len(texts))
    stale = [StoredVector(e.event_id, e.seq, [1.0] + [0.0] * 383) for e in events]
    t.store_vectors(stale, str(model), deletes).result()
    t.close()


def test_reembed_goes_on_when_the_models_process_is_killed(tmp_path: Path) -> None:
    import os
    import signal

    from storage.embedders.child import ChildEmbedder
    from storage.tenants.reembed import BATCH, reembed

    root = tmp_path / "t"
    texts = [f"note {i}: the parcel for number {i} was signed for" for i in range(BATCH + 40)]
    old_model_tenant(root, texts)
    embedder = ChildEmbedder()
    killed: list[int] = []

    def progress(done: int, total: int) -> None:
        if 0 < done < total and not killed:  # between the first batch and the second
            assert embedder.pid is not None
            killed.append(embedder.pid)
            os.kill(embedder.pid, signal.SIGKILL)

    try:
        stats = reembed(root, embedder, progress=progress)
        assert killed and (embedder.deaths, embedder.starts) == (1, 2)
        assert stats.events == len(texts) and stats.model == embedder.name
        t = Tenant.open("t", root, embedding_dim=384)
        with t.log.reader() as r:
            assert r.meta_str(layout.MODEL) == embedder.name
        assert listed(t) == []  # none awaits a vector
        hits = t.recall(RecallQuery(embedding=embedder.embed([texts[-1]])[0].tolist(), k=1)).hits
        assert hits[0].event.text == texts[-1]  # the last batch, made by the second process
        t.close()
    finally:
        embedder.close()
    assert not (root / "reembed").exists()


def test_a_reembed_that_cannot_embed_leaves_the_tenant_as_it_was(tmp_path: Path) -> None:
    from storage.embedders.base import EmbedderError
    from storage.embedders.child import ChildEmbedder
    from storage.tenants.reembed import TRIES, reembed

    root = tmp_path / "t"
    old_model_tenant(root, ["Lena wants three bullets, no tables."])
    embedder = ChildEmbedder(model_dir=tmp_path)  # no model there: every call fails
    with pytest.raises(EmbedderError):
        reembed(root, embedder)
    assert embedder.starts == TRIES
    embedder.close()
    assert not (root / "reembed").exists()
    t = Tenant.open("t", root, embedding_dim=384)
    with t.log.reader() as r:
        assert r.meta_str(layout.MODEL) == "old-model"
    assert listed(t) == []
    t.close()


def test_a_backup_restores_server_vectors_without_recomputing_them(tmp_path: Path) -> None:
    from storage.transfer import backup as bk

    data = tmp_path / "data"
    t = open_tenant(data / "acme")
    a, b = ids(append(t, note("alpha"), note("beta", 1)))
    events, _before, deletes, model = t.to_embed(1)
    assert model is not None
    t.store_vectors([StoredVector(a, events[0].seq, [0.1, 0.2, 0.3, 0.4])], model, deletes).result()
    t.close()
    bk.backup(data, tmp_path / "bk")
    bk.restore(tmp_path / "bk", tmp_path / "new", default_dim=4)
    t = open_tenant(tmp_path / "new" / "acme", None)  # no embedder: nothing is recomputed
    assert t.space == layout.SPACE_SERVER and listed(t) == [b]
    hit = t.recall(RecallQuery(embedding=[0.1, 0.2, 0.3, 0.4], k=1)).hits[0]
    assert hit.event.event_id == a
    t.close()


def test_work_left_by_an_evicted_tenant_is_done_when_it_opens_again(tmp_path: Path) -> None:
    import time

    from storage.embedders.local import LocalEmbedder
    from storage.tenants.embedding import EmbeddingWorker
    from storage.tenants.manager import TenantManager

    embedder = LocalEmbedder()  # in this process: its graph built once (tests/conftest.py)
    worker = EmbeddingWorker(embedder, default_dim=384)
    manager = TenantManager(tmp_path, embedding_dim=384, max_open=1, embedding=worker)
    with manager.use("a") as a:  # the worker is not started yet: the work waits in the log
        a.submit_append([note("Lena wants three bullets"), note("no tables", 1)]).result()
        assert worker.pending() == 2
    with manager.use("b"):  # one slot: a is closed to make room, its work with it
        assert worker.pending() == 0
    worker.start()
    try:
        with manager.use("a") as a:
            deadline = time.monotonic() + 60
            while a.unembedded_count():
                assert time.monotonic() < deadline
                time.sleep(0.02)
            with a.log.reader() as r:
                assert all(ev.embedding is not None for ev in r.newest_first(None, None, None))
    finally:
        worker.stop()
        manager.close_all()
        embedder.close()

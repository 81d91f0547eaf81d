"""A full disk loses no acknowledged event: refusals are 503 with Retry-After, and once space
returns every event acknowledged is back in every read route, without a restart and after one.

Two ways to fill the disk: a real small filesystem (tmpfs, where this process may mount one)
under a real server, and the storage failpoints (storage/failpoints.py), armed through a real
server's environment or in-process, so that CI without root makes the same commits fail.
"""

from __future__ import annotations

import errno
import os
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import hnswlib
import httpx
import numpy as np
import pytest

from storage import failpoints, space
from storage.errors import DiskFull
from storage.index.vecfile import check_saved
from storage.model import AppendResult, NewEvent
from storage.read.recall import RecallQuery, recall
from storage.tenants.tenant import Tenant
from tests.support.disk_full import check_refusal, listed_ids, recall_ids
from tests.support.servers import ServerProcess

TENANT = "acme"
DIM = 4
TERMS_PER_QUERY = (
    64  # storage/index/keyword.py MAX_QUERY_WORDS: one recall looks for 64 events' words
)


# -- the events -------------------------------------------------------------------


def word(i: int) -> str:
    """The one word event i alone holds (letters and digits: a single keyword token)."""
    return f"tok{i}q"


def vector(i: int) -> list[float]:
    """Event i's embedding: distinct for every i, so its own vector recalls it first."""
    v = np.random.default_rng(i).standard_normal(DIM)
    return [float(x) for x in v / np.linalg.norm(v)]


VOCABULARY = [f"w{n}x" for n in range(3000)]  # padding words, none of them an event's own


def body(i: int, pad_words: int = 0) -> dict[str, Any]:
    """Event i over HTTP; padding words make it fill a disk."""
    rng = random.Random(i)
    pad = " ".join(rng.choices(VOCABULARY, k=pad_words))
    return {
        "kind": "note",
        "ts": 1_791_208_939_000_000 + i,
        "text": f"{word(i)} {pad}",
        "embedding": vector(i),
    }


def event(i: int) -> NewEvent:
    """Event i for storage directly."""
    return NewEvent(kind="note", ts=1_791_208_939_000_000 + i, text=word(i), embedding=vector(i))


# -- the read routes over HTTP ------------------------------------------------------------


def wait_recall_works(c: httpx.Client, secs: float = 30.0) -> None:
    """Keyword recall answers 503 while its index cannot commit; wait until it answers again."""
    deadline = time.monotonic() + secs
    while True:
        r = c.post("/v1/memory/recall", json={"text": word(0), "k": 1})
        if r.status_code == 200:
            return
        assert r.status_code == 503 and r.headers.get("retry-after"), (r.status_code, r.text)
        assert time.monotonic() < deadline, f"recall still refused after {secs} s: {r.text}"
        time.sleep(0.2)


def each_event(
    c: httpx.Client, acked: dict[str, int], check: Callable[[httpx.Client, str, int], bool]
) -> list[str]:
    """The acknowledged events for which check(client, id, i) is false, asked from 4 clients."""
    items = list(acked.items())

    def run(part: int) -> list[str]:
        with httpx.Client(base_url=c.base_url, headers=c.headers, timeout=60) as own:
            return [e for e, i in items[part::4] if not check(own, e, i)]

    with ThreadPoolExecutor(4) as pool:
        return [e for failed in pool.map(run, range(4)) for e in failed]


def check_every_route(c: httpx.Client, acked: dict[str, int]) -> None:
    """Every acknowledged event is in GET, the listing, keyword recall, vector recall and Cypher."""
    wait_recall_works(c)
    missing = each_event(
        c, acked, lambda c, e, _i: c.get(f"/v1/memory/event/{e}").status_code == 200
    )
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged events 404 on GET"
    listed = listed_ids(c)
    assert not set(acked) - listed, f"{len(set(acked) - listed)} acknowledged events not listed"
    by_word = {word(i): e for e, i in acked.items()}
    words = sorted(by_word)
    found: set[str] = set()
    for lo in range(0, len(words), TERMS_PER_QUERY):
        chunk = words[lo : lo + TERMS_PER_QUERY]
        found.update(recall_ids(c, {"text": " ".join(chunk), "k": 100}))
    lost = [e for e in acked if e not in found]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged events lost to keyword recall"
    lost = each_event(
        c, acked, lambda c, e, i: recall_ids(c, {"embedding": vector(i), "k": 1}) == [e]
    )
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged events lost to vector recall"
    r = c.post("/v1/memory/cypher", json={"query": "MATCH (e:Event) RETURN count(*) AS n"})
    assert r.status_code == 200, r.text
    assert r.json()["rows"] == [[len(listed)]]


def append_all(
    c: httpx.Client, ids: range, pad_words: int = 0
) -> tuple[dict[str, int], list[httpx.Response]]:
    """Append events one request each; (acknowledged id -> i, refusals)."""
    acked: dict[str, int] = {}
    refused: list[httpx.Response] = []
    for i in ids:
        r = c.post("/v1/memory/event", json=body(i, pad_words))
        if r.status_code == 201:
            acked[r.json()["event_id"]] = i
        else:
            refused.append(r)
    return acked, refused


# -- a real small filesystem ----------------------------------------------------


def fill(url: str, *, workers: int = 6) -> tuple[dict[str, int], list[httpx.Response]]:
    """Append big events from several clients until the disk refuses a few dozen of them."""
    acked: dict[str, int] = {}
    refused: list[httpx.Response] = []
    stop = False

    def run(worker: int) -> None:
        nonlocal stop
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {TENANT}"}, timeout=60
        ) as c:
            i = worker
            while not stop and i < 40_000:
                r = c.post("/v1/memory/event", json=body(i, pad_words=3000))
                if r.status_code == 201:
                    acked[r.json()["event_id"]] = i
                else:
                    refused.append(r)
                    stop = stop or len(refused) >= 40
                i += workers

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, range(workers)))
    return acked, refused


@pytest.fixture
def small_fs_server(small_fs: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server (not yet started) whose data directory is on the small filesystem and whose
    log is not."""
    server = ServerProcess(small_fs / "data")
    server.log_path = tmp_path / "server.log"
    try:
        yield server
    finally:
        server.stop()


def test_a_small_filesystem_that_fills_and_is_freed_loses_no_event(
    small_fs: Path, small_fs_server: ServerProcess
) -> None:
    ballast = small_fs / "ballast"
    ballast.write_bytes(os.urandom(6 << 20))  # the space an operator frees later
    server = small_fs_server.start()
    with server.client(TENANT) as c:
        acked, refused = fill(server.url)
        assert refused, "the disk never filled"
        statuses = sorted({r.status_code for r in refused})
        assert statuses == [503], f"refusals of a full disk: {statuses}"
        for r in refused:
            check_refusal(r)
        # Reads go on meanwhile; a keyword recall either sees every acknowledged event or is
        # refused until its index can commit them (a search once dropped them when it could not).
        for e, i in list(acked.items())[-5:]:
            assert c.get(f"/v1/memory/event/{e}").status_code == 200
            assert recall_ids(c, {"embedding": vector(i), "k": 1}) == [e]
            r = c.post("/v1/memory/recall", json={"text": word(i), "k": 1})
            if r.status_code == 503:
                check_refusal(r)
            else:
                assert r.status_code == 200 and [h["event_id"] for h in r.json()["hits"]] == [e]

        ballast.unlink()
        more, still = append_all(c, range(100_000, 100_050))
        assert not still, [r.text for r in still]
        acked.update(more)
        check_every_route(c, acked)

    server.stop()
    server.start()
    with server.client(TENANT) as c:
        check_every_route(c, acked)


# -- failpoints through a real server's environment --------------------------------------


def test_failed_commits_in_a_server_lose_no_event(
    start_server: Callable[..., ServerProcess],
) -> None:
    # One request at a time, so one group commit each: the tenant's creation is the first write,
    # appends 0-8 the next nine, and appends 9, 10 and 11 fail.
    env = {failpoints.ENV: "log.commit=enospc:3@10,keyword.commit=enospc:4"}
    server = start_server(env=env)
    with server.client(TENANT) as c:
        acked, refused = append_all(c, range(0, 60))
        assert sorted(acked.values()) == [i for i in range(60) if i not in (9, 10, 11)]
        for r in refused:
            check_refusal(r)
        # The keyword index fails its first four commits: recall is refused meanwhile, never
        # answered without the events acknowledged before it.
        r = c.post("/v1/memory/recall", json={"text": word(10), "k": 1})
        assert r.status_code in (200, 503), r.text
        if r.status_code == 503:
            check_refusal(r)
        more, _ = append_all(c, range(60, 120))
        acked.update(more)
        check_every_route(c, acked)  # after a restart too: the in-process tests below reopen


# -- failpoints in-process -------------------------------------------------------------


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    """No test leaves a failpoint armed for the next."""
    failpoints.disarm_all()
    yield
    failpoints.disarm_all()


def append_events(t: Tenant, ids: range) -> dict[str, int]:
    """Append events i in ids in one batch; acknowledged id -> i."""
    results = t.submit_append([event(i) for i in ids]).result()
    return {r.event_id: i for r, i in zip(results, ids, strict=True) if isinstance(r, AppendResult)}


def keyword_hits(t: Tenant, i: int) -> list[str]:
    """Ids keyword recall returns for event i's word."""
    with t.log.reader() as r:
        return [
            h.event.event_id
            for h in recall(r, t.keyword, t.vectors, RecallQuery(text=word(i), k=3)).hits
        ]


def vector_hits(t: Tenant, i: int) -> list[str]:
    """Ids vector recall returns first for event i's embedding."""
    with t.log.reader() as r:
        return [
            h.event.event_id
            for h in recall(r, t.keyword, t.vectors, RecallQuery(embedding=vector(i), k=1)).hits
        ]


def check_tenant(t: Tenant, acked: dict[str, int]) -> None:
    """Every acknowledged event is stored and recalled by its word and by its vector."""
    with t.log.reader() as r:
        assert all(r.get(e) is not None for e in acked)
    assert [e for e, i in acked.items() if keyword_hits(t, i) != [e]] == []
    assert [e for e, i in acked.items() if vector_hits(t, i) != [e]] == []


def wait_until(done: Callable[[], bool], secs: float = 20.0) -> None:
    """Poll until done() holds."""
    deadline = time.monotonic() + secs
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_failed_keyword_commit_keeps_its_documents_and_recovers(tmp_path: Path) -> None:
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=DIM)
    try:
        failpoints.arm("keyword.commit", "enospc", 3)
        acked = append_events(t, range(0, 40))
        wait_until(t.keyword.failing)  # searches never wait for a commit: once it has failed
        with pytest.raises(DiskFull):  # refused, not answered without what was acknowledged
            keyword_hits(t, 0)
        acked.update(append_events(t, range(40, 80)))
        # Meanwhile the durable watermark stays behind every document not committed.
        assert t.keyword.committed_seq == 0
        assert (t.log.meta_int("keyword_seq") or 0) == 0
        wait_until(lambda: t.keyword.settled())  # the retries succeed once the fault is gone
        assert failpoints.hits["keyword.commit"] == 3
        check_tenant(t, acked)
    finally:
        t.close()
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=DIM)
    try:
        check_tenant(t, acked)
    finally:
        t.close()


def test_a_keyword_index_closed_while_failing_replays_from_the_log(tmp_path: Path) -> None:
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=DIM)
    acked = append_events(t, range(0, 30))
    t.keyword.flush()
    committed = t.keyword.committed_seq
    failpoints.arm("keyword.commit", "eio")  # every commit fails, on a disk with room
    acked.update(append_events(t, range(30, 60)))
    wait_until(t.keyword.failing)
    with pytest.raises(RuntimeError):  # not a full disk: an internal error, not a 503
        keyword_hits(t, 40)
    t.close()  # its last commit fails too: close gives up on it, and says where it stopped
    failpoints.disarm_all()
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=DIM)
    try:
        assert t.log.meta_int("keyword_seq") == committed  # never past what was committed
        check_tenant(t, acked)
    finally:
        t.close()


def test_a_failed_log_commit_is_refused_as_disk_full_and_writes_nothing(tmp_path: Path) -> None:
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=DIM)
    try:
        acked = append_events(t, range(0, 10))
        failpoints.arm("log.commit", "enospc", 2)
        with pytest.raises(DiskFull, match="disk is full: nothing was written"):
            t.submit_append([event(10)]).result()
        victim = next(iter(acked))
        with pytest.raises(DiskFull):
            t.submit_delete([victim]).result()
        acked.update(append_events(t, range(11, 20)))
        with t.log.reader() as r:
            assert r.get(victim) is not None  # the refused delete deleted nothing
            assert r.last_seq() == 19  # the refused append wrote no op
        assert keyword_hits(t, 10) == []
        check_tenant(t, acked)
    finally:
        t.close()


def test_an_io_error_on_a_disk_with_room_is_not_called_full(tmp_path: Path) -> None:
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=DIM)
    try:
        failpoints.arm("log.commit", "eio", 1)
        with pytest.raises(OSError) as info:
            t.submit_append([event(0)]).result()
        assert info.value.errno == errno.EIO and not isinstance(info.value, DiskFull)
        check_tenant(t, append_events(t, range(1, 5)))
    finally:
        t.close()


def test_a_panicked_environment_is_reopened_and_the_write_retried(tmp_path: Path) -> None:
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=DIM)
    try:
        acked = append_events(t, range(0, 5))
        env = t.log.env
        failpoints.arm("log.commit", "panic", 1)
        acked.update(append_events(t, range(5, 10)))  # acknowledged after the reopen
        assert t.log.env is not env
        check_tenant(t, acked)
    finally:
        t.close()
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=DIM)
    try:
        check_tenant(t, acked)
    finally:
        t.close()


def test_a_failed_vector_save_keeps_the_old_file_and_its_watermark(tmp_path: Path) -> None:
    root = tmp_path / "t1"
    t = Tenant.open("t1", root, embedding_dim=DIM)
    acked = append_events(t, range(0, 20))
    t.save_vectors()
    saved = t.log.meta_int("vector_seq")
    before = (root / "vectors.hnsw").read_bytes()
    acked.update(append_events(t, range(20, 40)))
    failpoints.arm("vectors.save", "enospc")
    with pytest.raises(DiskFull):
        t.save_vectors()
    assert (root / "vectors.hnsw").read_bytes() == before
    assert not (root / "vectors.hnsw.tmp").exists()  # no partial copy holds the space
    assert t.log.meta_int("vector_seq") == saved
    t.close()  # its save fails too; the close completes
    failpoints.disarm_all()
    t = Tenant.open("t1", root, embedding_dim=DIM)
    try:
        assert t.log.meta_int("vector_seq") == saved
        check_tenant(t, acked)  # what the saved file lacks was replayed from the log
    finally:
        t.close()


def test_a_vector_file_cut_short_is_caught(tmp_path: Path) -> None:
    # hnswlib does not check its writes: on a full disk its save ends early without a word.
    index = hnswlib.Index(space="cosine", dim=DIM)
    index.init_index(max_elements=600, M=16, ef_construction=50)
    index.add_items(np.random.default_rng(1).standard_normal((500, DIM)).astype(np.float32))
    path = tmp_path / "v.hnsw"
    index.save_index(str(path))
    check_saved(path)
    whole = path.read_bytes()
    for cut in (1, 4, len(whole) // 3, len(whole) - 10):
        path.write_bytes(whole[:-cut])
        with pytest.raises(OSError):
            check_saved(path)


def test_the_ways_stores_say_the_disk_is_full(tmp_path: Path) -> None:
    tantivy_error = ValueError("An IO error occurred: 'No space left on device (os error 28)'")
    assert space.disk_full(tantivy_error, tmp_path)
    assert space.disk_full(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), tmp_path)
    assert not space.disk_full(OSError(errno.EIO, os.strerror(errno.EIO)), tmp_path)  # room here
    assert not space.disk_full(RuntimeError("a bug"), tmp_path)


def test_failpoint_specs_are_checked() -> None:
    failpoints.load({failpoints.ENV: " keyword.commit=enospc:2 , log.commit=eio@1 "})
    assert failpoints.armed() == {"keyword.commit": 2, "log.commit": None}
    failpoints.hit("log.commit")  # let through
    with pytest.raises(OSError):
        failpoints.hit("log.commit")
    bad_specs = ("keyword.comit=enospc", "log.commit=full", "log.commit", "log.commit=eio:x")
    for bad in (*bad_specs, "log.commit=eio:0", "log.commit=eio@-1"):
        with pytest.raises(ValueError, match=failpoints.ENV):
            failpoints.load({failpoints.ENV: bad})

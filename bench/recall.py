"""Recall at 10,000 and 100,000 events: latency over HTTP, the raw floor, vector recall@10, build
time, recall while 8 clients append, and appends from 32 clients into the tenant of 100,000.

The corpus is made of real MiniLM embeddings and texts: LoCoMo's 5,882 turns
(`../shared/data`, evaluation only), each event a turn's text with an embedding mixed from that
turn's vector, a second turn's and a little noise (renormalised), so that 100,000 vectors keep
the shape of real ones without repeating. 70 % turns, 20 % facts (each naming two earlier events
as sources, so `hops: 1` has links to walk), 10 % tool calls. Queries are LoCoMo's 1,536 questions
with their embeddings.

Each size is built in process through `Tenant.submit_append` in batches of 1,000 (timed: until
acknowledged, then until the HNSW graph holds every vector), closed, and served by
memspine-server. A scenario is a function `(Setup) -> dict` in SCENARIOS; each runs against the
same server and tenant, in order. Latency is one client sending the next request when the last
is answered; the raw floor is hnswlib `knn_query` (ef 64, k 10) on the saved index file and a
Tantivy top-10 search on the tenant's keyword directory, called directly in this process.

Targets (issue 4): fused recall at 100,000 p50 <= 5 ms, p99 <= 20 ms and p50 <= 3x the raw
floor; vector recall@10 >= 0.95; appends from 32 clients into 100,000 events >= 2,000 events/s.
Targets (issue 17), with --base (another checkout served beside this one, rounds interleaved):
fused recall while 8 clients append p50 <= 5 ms, p99 <= 20 ms, appends/s >= 0.9x the base's in
the same rounds; `tail_merge` checks the keyword tail's ranking against a commit's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hnswlib
import msgspec
import numpy as np
import tantivy

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import (
    OUT,
    Process,
    free_port,
    http_request,
    load,
    median,
    percentile,
    serve_memspine,
    write_json,
)

from storage.index.keyword import query_terms
from storage.index.vectors import VectorIndex
from storage.model import NewEvent
from storage.read.listing import ListQuery
from storage.tenants.tenant import Tenant

# Beside the checkout (a clone in /work), or one level further up (a worktree in /work/wt).
DATA = next(
    (
        p / "shared" / "data" / "locomo10-minilm.npz"
        for p in Path(__file__).resolve().parents[2:4]
        if (p / "shared" / "data" / "locomo10-minilm.npz").exists()
    ),
    Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo10-minilm.npz",
)
DIM = 384
SEED = 20261004
BATCH = 1000
SIZES, QUICK_SIZES = (10_000, 100_000), (2_000,)
TENANT = "recall-bench"
T0 = 1_791_208_939_000_000


@dataclass
class Corpus:
    """The real texts and embeddings everything is made from."""

    texts: list[str]
    vectors: np.ndarray  # (n_turns, 384), unit length
    q_texts: list[str]
    q_vectors: np.ndarray  # (n_questions, 384), unit length


@dataclass
class Setup:
    """What every scenario gets: the served tenant, its directory and what it was built from."""

    size: int
    root: Path  # the tenant's directory
    server: Process
    corpus: Corpus
    vectors: np.ndarray  # the tenant's vectors in append order
    quick: bool
    rounds: int
    notes: dict[str, Any] = field(default_factory=dict)
    base: Process | None = None  # with --base: another checkout's server over a copy of the tenant
    appenders_in_thread: bool = False  # --appenders-in-thread: the entries before 2026-12-02 16:00
    base_tree: Path | None = None  # --base: the other checkout, for the scenarios run in process


def load_corpus() -> Corpus:
    """LoCoMo's turns and questions with their MiniLM vectors, all ten conversations."""
    if not DATA.exists():
        raise SystemExit(f"bench/recall.py needs {DATA} (LoCoMo with MiniLM vectors)")
    z = np.load(DATA)
    texts: list[str] = []
    vecs, qtexts, qvecs = [], [], []
    for c in range(10):
        texts += [str(x) for x in z[f"turn_texts_{c}"]]
        vecs.append(z[f"turn_emb_{c}"].astype(np.float32))
        qtexts += [str(x) for x in z[f"q_texts_{c}"]]
        qvecs.append(z[f"q_emb_{c}"].astype(np.float32))
    return Corpus(texts, _unit(np.concatenate(vecs)), qtexts, _unit(np.concatenate(qvecs)))


def _unit(m: np.ndarray) -> np.ndarray:
    return np.asarray(m / np.linalg.norm(m, axis=1, keepdims=True), dtype=np.float32)


def make_events(corpus: Corpus, n: int, seed: int = SEED) -> tuple[list[NewEvent], np.ndarray]:
    """N events (ids fixed in advance so facts can name earlier ones) and their vectors."""
    events, vectors = stream_events(corpus, n, seed)
    return list(events), vectors


def stream_events(
    corpus: Corpus, n: int, seed: int = SEED
) -> tuple[Iterator[NewEvent], np.ndarray]:
    """make_events' events made one at a time as they are taken (a million of them as one list
    of 384-float embeddings would take about 12 GB), and their vectors."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, len(corpus.texts), n)
    b = rng.integers(0, len(corpus.texts), n)
    noise = rng.standard_normal((n, DIM)).astype(np.float32) * 0.02
    vectors = _unit(0.8 * corpus.vectors[a] + 0.3 * corpus.vectors[b] + noise)
    del noise
    kinds = rng.choice(["turn", "fact", "tool_call"], size=n, p=[0.7, 0.2, 0.1])
    ids = [str(uuid.UUID(int=int(x), version=4)) for x in rng.integers(0, 2**63, n)]

    def events() -> Iterator[NewEvent]:
        for i in range(n):
            props: dict[str, Any] = {"speaker": ["agent", "user"][i % 2], "n": i}
            sources: tuple[str, ...] = ()
            if kinds[i] == "fact" and i > 2:
                sources = tuple(ids[j] for j in rng.integers(0, i, 2))
                props["source_event_ids"] = list(sources)
            yield NewEvent(
                kind=str(kinds[i]),
                ts=T0 + i * 1_000_000,
                text=corpus.texts[a[i]],
                embedding=vectors[i].tolist(),
                properties_raw=msgspec.json.encode(props),
                source_ids=sources,
                event_id=ids[i],
            )

    return events(), vectors


def build(root: Path, events: Iterable[NewEvent]) -> dict[str, float]:
    """Append in batches through the tenant's writer; seconds to acknowledged and to a full graph."""
    shutil.rmtree(root, ignore_errors=True)
    started = time.perf_counter()
    tenant = Tenant.open(TENANT, root, embedding_dim=DIM)
    n, stream = 0, iter(events)
    while batch := list(itertools.islice(stream, BATCH)):
        tenant.submit_append(batch).result()
        n += len(batch)
    acknowledged = time.perf_counter() - started
    tenant.vectors.flush()
    graph = time.perf_counter() - started
    tenant.close()
    return {
        "acknowledged_s": round(acknowledged, 2),
        "hnsw_graph_s": round(graph, 2),
        "closed_s": round(time.perf_counter() - started, 2),
        "events_per_s_acknowledged": round(n / acknowledged, 1),
    }


def serve(data: Path, tree: Path | None = None) -> Process:
    """memspine-server in local mode over data as it is, 384-float embeddings; from the
    checkout at tree (its memspine/ and storage/ first on the path) if given."""
    if tree is None:
        return serve_memspine(data, {"MEMSPINE_EMBEDDING_DIM": str(DIM)})
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
    env.update(
        MEMSPINE_BIND=f"127.0.0.1:{port}",
        MEMSPINE_DATA_DIR=str(data),
        MEMSPINE_LOG_LEVEL="WARNING",
        MEMSPINE_EMBEDDING_DIM=str(DIM),
    )
    # `-m` would put the working directory (this checkout) first on the path.
    run = f"import runpy, sys; sys.path.insert(0, {str(tree)!r}); runpy.run_module('memspine.server', run_name='__main__')"
    return Process([sys.executable, "-c", run], env, port, "/health")


# -- measurement helpers -------------------------------------------------------------------------


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 50) * 1000, 3),
        "p99_ms": round(percentile(values, 99) * 1000, 3),
        "n": len(values),
    }


def _timed(fn: Callable[[int], object], n: int) -> list[float]:
    """Seconds for fn(i), i = 0..n-1, one after another."""
    out = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def _recall_requests(setup: Setup, shape: str, hops: int, kind: str | None) -> list[bytes]:
    """Pre-encoded POST /v1/memory/recall requests, one per question."""
    c = setup.corpus
    out = []
    for i, text in enumerate(c.q_texts):
        body: dict[str, Any] = {"k": 10, "hops": hops}
        if shape in ("text", "fused"):
            body["text"] = text
        if shape in ("embedding", "fused"):
            body["embedding"] = [round(float(x), 6) for x in c.q_vectors[i]]
        if kind is not None:
            body["kind"] = kind
        headers = {"Authorization": f"Bearer {TENANT}", "Content-Type": "application/json"}
        out.append(http_request("POST", "/v1/memory/recall", msgspec.json.encode(body), headers))
    return out


# -- scenarios -------------------------------------------------------------------------------------

RECALL_SHAPES = [
    ("text", 0, None),
    ("embedding", 0, None),
    ("fused", 0, None),
    ("text", 1, None),
    ("embedding", 1, None),
    ("fused", 1, None),
    ("fused", 0, "turn"),
]


def scenario_latency(setup: Setup) -> dict[str, Any]:
    """Recall p50/p99 (and server CPU per request) over HTTP for each query shape, one client,
    closed loop; ROUNDS rounds of every shape in turn (so load from elsewhere falls on all alike),
    medians across rounds."""
    seconds = 1.5 if setup.quick else 5.0
    per: dict[str, list[dict[str, Any]]] = {}
    for _round in range(setup.rounds):
        for shape, hops, kind in RECALL_SHAPES:
            name = f"{shape}{'+hops1' if hops else ''}{'+kind' if kind else ''}"
            requests = _recall_requests(setup, shape, hops, kind)
            result = load(setup.server, requests, 1, warmup=0.3, seconds=seconds)
            assert not result["errors"], result
            per.setdefault(name, []).append(result)
    # Server CPU per request moves less than latency when other work shares the machine.
    keys = ("p50_ms", "p99_ms", "server_cpu_ms_per_req", "loop_cpu_ms_per_req")
    return {name: _medians(runs, keys) for name, runs in per.items()}


def _medians(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """Each key's median over runs, and every run's value."""
    out: dict[str, Any] = {k: round(median([r[k] for r in runs]), 3) for k in keys}
    out["runs"] = {k: [r[k] for r in runs] for k in keys}
    return out


def scenario_raw_floor(setup: Setup) -> dict[str, Any]:
    """Hnswlib knn_query (ef 64, k 10) and a Tantivy top-10 search, called directly in this
    process on the tenant's own files; medians over ROUNDS passes of every question."""
    index = hnswlib.Index(space="cosine", dim=DIM)
    index.load_index(str(setup.root / "vectors.hnsw"))
    index.set_ef(64)
    index.set_num_threads(1)
    q = setup.corpus.q_vectors
    kw = tantivy.Index.open(str(setup.root / "keyword"))  # no writer: the server holds its lock
    searcher = kw.searcher()
    texts = setup.corpus.q_texts

    def search(i: int) -> None:
        query, _errors = kw.parse_query_lenient(" ".join(query_terms(texts[i])), ["text"])
        hits = searcher.search(query, 10).hits
        [searcher.doc(addr)["id"][0] for _s, addr in hits]

    n = min(len(q), 400 if setup.quick else len(q))
    rounds = []
    for _round in range(setup.rounds):
        knn = _timed(lambda i: index.knn_query(q[i][None, :], k=10, num_threads=1), n)
        bm25 = _timed(search, n)
        rounds.append({"knn": _ms(knn), "bm25": _ms(bm25)})
    return {
        "hnswlib_knn": _medians([r["knn"] for r in rounds], ("p50_ms", "p99_ms")),
        "tantivy_top10": _medians([r["bm25"] for r in rounds], ("p50_ms", "p99_ms")),
        "queries": n,
    }


def scenario_vector_recall(setup: Setup) -> dict[str, Any]:
    """The vector index's top 10 against exact cosine top 10, over every question."""
    vec = VectorIndex.open(setup.root / "vectors.hnsw", DIM)
    try:
        q = setup.corpus.q_vectors
        exact = np.argsort(-(q @ setup.vectors.T), axis=1)[:, :10]  # labels are seqs, from 1
        found = 0
        for i in range(len(q)):
            labels = {label for label, _s in vec.search(q[i].tolist(), 10)}
            found += len(labels & {int(j) + 1 for j in exact[i]})
    finally:
        vec.close()
    return {"recall_at_10": round(found / (10 * len(q)), 4), "queries": len(q)}


WHILE_APPENDING = (
    "recall_alone_p50_ms",
    "recall_p50_ms",
    "recall_p99_ms",
    "appends_per_sec",
    "recalls_per_sec",
    "server_cpu_ms_per_req",
    "loop_cpu_ms_per_req",
    "load_average",
)


def scenario_recall_while_appending(setup: Setup) -> dict[str, Any]:
    """Fused recall from one client while 8 others append (384-float events), ROUNDS rounds of
    4 s: what a recall costs under sustained writes; the same recall alone, in the same round,
    beside it. With --base, both servers in turn each round (which goes first alternates), so
    the machine's load falls on both alike."""
    recalls = _recall_requests(setup, "fused", 0, None)
    appends = _append_requests(setup, 2000, setup.size + 10_000, seed=SEED + 2)
    seconds = 1.5 if setup.quick else 4.0
    servers = (
        {"new": setup.server} if setup.base is None else {"base": setup.base, "new": setup.server}
    )
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    for n in range(setup.rounds):
        for name in sorted(servers, reverse=n % 2 == 1):
            rounds[name].append(
                _while_appending(
                    servers[name], recalls, appends, seconds, setup.appenders_in_thread
                )
            )
    out = {name: _medians(runs, WHILE_APPENDING) for name, runs in rounds.items()}
    return out["new"] if setup.base is None else out


def _while_appending(
    server: Process, recalls: list[bytes], appends: list[bytes], seconds: float, in_thread: bool
) -> dict[str, Any]:
    """One round: recall alone, then recall while 8 clients append.

    The 8 appenders run in a process of their own, as real clients do: run from a thread of
    this process (in_thread, the entries before 2026-12-02 16:00), their work held this
    process's interpreter lock while the recall client's answer waited for it, and that wait
    was counted as the server's latency."""
    alone = load(server.port, recalls, 1, warmup=0.3, seconds=seconds / 2)
    out: dict[str, dict[str, Any]] = {}
    cpu_before, loop_before = server.cpu_seconds(), server.main_thread_cpu_seconds()
    if in_thread:

        def write(out: dict[str, dict[str, Any]] = out) -> None:
            out["appends"] = _append_load(server.port, appends, seconds)

        writers: Any = threading.Thread(target=write)
        writers.start()
    else:
        ctx = multiprocessing.get_context("spawn")
        results: Any = ctx.Queue()
        started = ctx.Event()
        writers = ctx.Process(
            target=_append_process, args=(server.port, appends, seconds, started, results)
        )
        writers.start()
        if not started.wait(60):
            raise RuntimeError("the appenders' process did not start")
    together = load(server.port, recalls, 1, warmup=0.7, seconds=seconds)
    if not in_thread:
        out["appends"] = results.get(timeout=60)
    writers.join()
    cpu = server.cpu_seconds() - cpu_before
    loop = server.main_thread_cpu_seconds() - loop_before
    assert not together["errors"] and not out["appends"]["errors"], (together, out)
    requests = together["all_requests"] + out["appends"]["all_requests"]
    return {
        "recall_alone_p50_ms": alone["p50_ms"],
        "recall_p50_ms": together["p50_ms"],
        "recall_p99_ms": together["p99_ms"],
        "appends_per_sec": out["appends"]["per_sec"],
        "recalls_per_sec": together["per_sec"],
        # every thread's CPU while the 9 clients ran (warm-ups included), over their requests
        "server_cpu_ms_per_req": round(cpu * 1000 / max(requests, 1), 3),
        "loop_cpu_ms_per_req": round(loop * 1000 / max(requests, 1), 3),
        "load_average": round(os.getloadavg()[0], 2),
    }


def _append_load(port: int, appends: list[bytes], seconds: float) -> dict[str, Any]:
    """The 8 appenders' closed loop, long enough to cover the recall client's warm-up and run."""
    return load(port, appends, 8, warmup=0.5, seconds=seconds + 0.5)


def _append_process(
    port: int, appends: list[bytes], seconds: float, started: Any, results: Any
) -> None:
    """The appenders in a process of their own: say so, run, send back what they measured."""
    started.set()
    results.put(_append_load(port, appends, seconds))


def scenario_fused_ab(setup: Setup) -> dict[str, Any]:
    """With --base: idle fused recall (k 10) on both servers, ROUNDS rounds of 5 s each,
    alternating which goes first; without it, skipped (the latency scenario has it)."""
    if setup.base is None:
        return {"skipped": "no --base"}
    requests = _recall_requests(setup, "fused", 0, None)
    seconds = 1.5 if setup.quick else 5.0
    servers = {"base": setup.base, "new": setup.server}
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    for n in range(setup.rounds):
        for name in sorted(servers, reverse=n % 2 == 1):
            result = load(servers[name], requests, 1, warmup=0.3, seconds=seconds)
            assert not result["errors"], result
            result["load_average"] = round(os.getloadavg()[0], 2)
            rounds[name].append(result)
    keys = ("p50_ms", "p99_ms", "server_cpu_ms_per_req", "loop_cpu_ms_per_req", "load_average")
    return {name: _medians(runs, keys) for name, runs in rounds.items()}


def _append_requests(setup: Setup, n: int, first: int, *, seed: int) -> list[bytes]:
    """N pre-encoded POST /v1/memory/event requests: LoCoMo turns with their vectors, drawn
    with seed, stamped as events first, first + 1, ..."""
    rng = np.random.default_rng(seed)
    c = setup.corpus
    headers = {"Authorization": f"Bearer {TENANT}", "Content-Type": "application/json"}
    requests = []
    for i in range(n):
        j = int(rng.integers(0, len(c.texts)))
        body = {
            "kind": "turn",
            "ts": T0 + (first + i) * 1_000_000,
            "text": c.texts[j],
            "embedding": [round(float(x), 6) for x in c.vectors[j]],
            "properties": {"speaker": "user"},
        }
        requests.append(
            http_request("POST", "/v1/memory/event", msgspec.json.encode(body), headers)
        )
    return requests


def scenario_appends(setup: Setup) -> dict[str, Any]:
    """POST /v1/memory/event from 32 closed-loop clients into this tenant (384-float embeddings),
    ROUNDS rounds (the tenant grows by each round's events); fused recall right after each; and,
    in this process, what one synchronous hnswlib insert into a copy of the graph costs."""
    requests = _append_requests(setup, 4000, setup.size, seed=SEED + 1)
    seconds = 3.0 if setup.quick else 10.0
    recalls = _recall_requests(setup, "fused", 0, None)
    rounds, after = [], []
    for _round in range(setup.rounds):
        before = _batch_metrics(setup.server.port)
        rounds.append(load(setup.server.port, requests, 32, warmup=1.0, seconds=seconds))
        done = _batch_metrics(setup.server.port)
        batches = done[1] - before[1]
        rounds[-1]["mean_batch"] = round((done[0] - before[0]) / batches, 1) if batches else 0.0
        after.append(load(setup.server.port, recalls, 1, warmup=0.2, seconds=2.0))
    return {
        "clients_32": _medians(rounds, ("per_sec", "p50_ms", "p99_ms", "mean_batch")),
        "errors": [r["errors"] for r in rounds],
        "fused_recall_right_after": _medians(after, ("p50_ms", "p99_ms")),
        "sync_hnsw_insert": _sync_insert_cost(setup),
    }


def _batch_metrics(port: int) -> tuple[float, float]:
    """(sum, count) of memspine_group_commit_batch_size from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        for part in found:
            if line.startswith(f"memspine_group_commit_batch_size_{part} "):
                found[part] = float(line.split()[1])
    return found["sum"], found["count"]


def _sync_insert_cost(setup: Setup) -> dict[str, float]:
    """Milliseconds per hnswlib insert, one at a time, into the saved graph (what acknowledging
    after a graph insert would cost), and the vectors/s that caps one thread at."""
    index = hnswlib.Index(space="cosine", dim=DIM)
    index.load_index(str(setup.root / "vectors.hnsw"), max_elements=setup.size + 1000)
    index.set_num_threads(1)
    rows = setup.vectors[:300]
    times = _timed(lambda i: index.add_items(rows[i][None, :], [10**9 + i], num_threads=1), 300)
    per = median(times) * 1000
    return {"p50_ms": round(per, 3), "vectors_per_s_one_thread": round(1000 / per, 1)}


TAILS = (100, 400, 1600)
DEPTH = 20  # the keyword arm's search for k 10 (recall.py: twice the depth), compared whole
DEEP = 70  # the committed search goes this deep, so a run of ties at the cut is whole


def scenario_tail_merge(setup: Setup) -> dict[str, Any]:
    """In process, on a copy of the tenant: T events appended with the keyword fold held, so
    they are the queued tail; each question's keyword top 10 searched merged (the tail beside
    the committed index, keyword_tail.py) and, once the fold has committed them, again. Reports
    how often the merged ranking is not the committed one (scores place by place to float32's
    precision, the same ids within each run of equal scores), how often scoring the tail with
    the committed statistics alone would not be (how far the tail moves BM25), and what a
    keyword search costs with the tail and without it."""
    questions = setup.corpus.q_texts[: 300 if setup.quick else len(setup.corpus.q_texts)]
    pristine = setup.root.parent.with_name(setup.root.parent.name + "-pristine") / TENANT
    out: dict[str, Any] = {}
    for tail in TAILS:
        copy = setup.root.parent.parent / f"tail-{tail}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(pristine, copy)
        tenant = Tenant.open(TENANT, copy, embedding_dim=DIM)
        try:
            events, _v = make_events(setup.corpus, tail, seed=SEED + 3 + tail)
            events = [msgspec.structs.replace(e, event_id=None, source_ids=()) for e in events]
            tenant.keyword.flush()
            tenant.keyword.writer_lock.acquire()  # the fold waits for it: the events stay queued
            try:
                tenant.submit_append(events).result()
                merged, merged_s = _keyword_tops(tenant, questions, DEPTH)
                naive = _committed_stats_tops(tenant, questions)
            finally:
                tenant.keyword.writer_lock.release()
            tenant.keyword.flush()
            _tops, committed_s = _keyword_tops(tenant, questions, DEPTH)
            committed, _s = _keyword_tops(tenant, questions, DEEP)
        finally:
            tenant.close()
            shutil.rmtree(copy, ignore_errors=True)
        out[str(tail)] = {
            "questions": len(questions),
            "merged_differs_from_commit": sum(
                not same_head(a, b) for a, b in zip(merged, committed, strict=True)
            ),
            "committed_stats_alone_differs": sum(
                not same_head(_rescored(a, b), b) for a, b in zip(naive, committed, strict=True)
            ),
            "search_cpu_us_with_tail_p50": round(percentile(merged_s, 50) * 1e6, 1),
            "search_cpu_us_with_tail_p99": round(percentile(merged_s, 99) * 1e6, 1),
            "search_cpu_us_committed_p50": round(percentile(committed_s, 50) * 1e6, 1),
        }
    return out


def _keyword_tops(
    tenant: Tenant, questions: list[str], limit: int
) -> tuple[list[list[tuple[str, float]]], list[float]]:
    """Each question's keyword top (id, score) pairs and the CPU seconds each search took,
    texts read from one snapshot as recall reads them."""
    from storage.read.current import Moment
    from storage.read.recall import Admission, RecallQuery

    tops, took = [], []
    with tenant.log.reader() as r:
        for text in questions:
            adm = Admission(r, RecallQuery(text=text), Moment(r, current=True, as_of=None))
            # CPU time of this thread: on a shared machine it moves much less than the wall clock
            start = time.thread_time()
            found = list(tenant.keyword.ranked(text, limit=limit, text_of=adm.text_for_label))
            took.append(time.thread_time() - start)
            tops.append(found)
    return tops, took


def _rescored(
    hits: list[tuple[str, float]], after: list[tuple[str, float]]
) -> list[tuple[str, float]]:
    """Hits in their order with the scores after gives them (-1 where it has none): whether
    they are its head is then a question of order and membership alone."""
    final = dict(after)
    return [(e, final.get(e, -1.0)) for e, _s in hits]


def _same_score(a: float, b: float) -> bool:
    """Equal to float32's precision (Tantivy's)."""
    return abs(a - b) <= 1e-5 * max(abs(a), abs(b))


def same_head(merged: list[tuple[str, float]], after: list[tuple[str, float]]) -> bool:
    """Whether merged is the head of after: the same scores place by place, the same ids within
    each run of equal scores (Tantivy breaks ties by where a document sits in its segments), a
    run the cut splits taken from the run (tests/storage/test_keyword_tail.py, same_ranking)."""
    if len(merged) > len(after) or (len(merged) < DEPTH and len(merged) != len(after)):
        return False
    if not all(_same_score(m, a) for (_e, m), (_f, a) in zip(merged, after, strict=False)):
        return False
    i = 0
    while i < len(merged):
        j = i
        while j < len(after) and _same_score(after[j][1], after[i][1]):
            j += 1
        ours = {e for e, _s in merged[i:j]}
        theirs = {e for e, _s in after[i:j]}
        if not ours <= theirs or (j <= len(merged) and ours != theirs):
            return False
        i = j
    return True


def _committed_stats_tops(tenant: Tenant, questions: list[str]) -> list[list[tuple[str, float]]]:
    """What a merge would rank if it scored the tail with the committed index's statistics and
    kept Tantivy's scores for the committed hits (no statistics moved by the tail)."""
    from storage.index.keyword import query_terms
    from storage.index.keyword_tail import Scorer, query_tokens

    kw = tenant.keyword
    view = kw._view
    stats = view.stats()
    assert stats is not None
    tail = list(kw._tail.docs)
    tops = []
    for text in questions:
        terms = query_tokens(query_terms(text)) or []
        # A term no committed document holds is counted in the tail (the least it can be).
        df = {t: int(view.searcher.doc_freq("text", t)) for t in terms}
        df = {t: n or sum(1 for d in tail if t in d.tf) for t, n in df.items()}
        scorer = Scorer(terms, df, stats)
        hits = (
            [
                (str(view.searcher.doc(addr).get_first("id")), float(score))
                for score, addr in view.searcher.search(
                    view.query(query_terms(text), None, None), DEPTH
                ).hits
            ]
            if terms
            else []
        )
        hits += [(d.event_id, scorer.score(d.tf, d.length)) for d in tail if set(d.tf) & set(terms)]
        hits.sort(key=lambda h: -h[1])
        tops.append(hits[:DEPTH])
    return tops


# Run by a checkout's own interpreter path (argv: tree, tenant root, questions file, rounds):
# the keyword arm's search alone, this thread's CPU per search (KeywordIndex.ranked, k 10, as
# the arm asks, seqs read from their column); no writer is made, the server keeps its own.
KEYWORD_ARM = """
import json, sys, time
from pathlib import Path
tree, root, questions, rounds = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
sys.path.insert(0, tree)
from storage.index.keyword import KeywordIndex
kw = KeywordIndex.open(root / "keyword")
texts = json.loads(Path(questions).read_text())
runs = []
for _round in range(rounds):
    took = []
    for text in texts:
        start = time.thread_time()
        kw.ranked(text, limit=10).seqs
        took.append(time.thread_time() - start)
    runs.append(took)
kw.close()
print(json.dumps(runs))
"""

# The same for a reopen: Tenant.open and one get (the first answer after a reopen), or and one
# vector search too (what the first recall waits for); wall and this thread's CPU seconds.
REOPEN = """
import json, sys, time
from pathlib import Path
tree, root, event_id, search = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
sys.path.insert(0, tree)
import numpy as np
from storage.tenants.tenant import Tenant
query = np.random.default_rng(1).standard_normal(384).astype(np.float32)
wall, cpu = time.perf_counter(), time.thread_time()
tenant = Tenant.open("recall-bench", root, embedding_dim=384)
assert tenant.get(event_id) is not None
if search:
    tenant.vectors.search(query, 10)
out = [time.perf_counter() - wall, time.thread_time() - cpu]
tenant.close()
print(json.dumps(out))
"""


def _in_tree(tree: Path, code: str, *args: str) -> Any:
    """What code prints (JSON, last line) run by a fresh interpreter with tree first on the path."""
    run = subprocess.run(
        [sys.executable, "-c", code, str(tree), *args], capture_output=True, text=True, check=False
    )
    if run.returncode:
        raise RuntimeError(f"{tree}: {run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _trees(setup: Setup) -> dict[str, Path]:
    """This checkout, and with --base the other one."""
    here = {"new": Path(__file__).resolve().parent.parent}
    return here if setup.base_tree is None else {"base": setup.base_tree, **here}


def scenario_keyword_arm(setup: Setup) -> dict[str, Any]:
    """The keyword arm's search alone (k 10, every question, ROUNDS passes) on the tenant's own
    index, CPU per search, in a process of each checkout, which goes first alternating."""
    questions = setup.root.parent.parent / "questions.json"  # beside the data, not in it
    questions.write_text(json.dumps(setup.corpus.q_texts))
    out: dict[str, Any] = {}
    trees = _trees(setup)
    for n in range(2):
        for name in sorted(trees, reverse=n % 2 == 1):
            runs = _in_tree(trees[name], KEYWORD_ARM, str(setup.root), str(questions), "1")
            out.setdefault(name, []).extend(runs)
    keys = ("p50_ms", "p99_ms")
    return {name: _medians([_ms(r) for r in runs], keys) for name, runs in out.items()}


def scenario_reopen(setup: Setup) -> dict[str, Any]:
    """Reopen of a copy of the tenant in a fresh process of each checkout (alternating), ROUNDS
    times: open and one get (the first answer), open, get and one vector search (the first
    recall's graph); wall and CPU milliseconds, medians."""
    copy = setup.root.parent.with_name(setup.root.parent.name + "-reopen") / TENANT
    shutil.rmtree(copy.parent, ignore_errors=True)
    shutil.copytree(setup.root, copy)
    tenant = Tenant.open(TENANT, copy, embedding_dim=DIM)
    try:
        event_id = tenant.list_events(ListQuery(limit=1))[0][0].event_id
    finally:
        tenant.close()
    trees = _trees(setup)
    out: dict[str, dict[str, list[list[float]]]] = {name: {} for name in trees}
    try:
        for n in range(setup.rounds):
            for name in sorted(trees, reverse=n % 2 == 1):
                for part, search in (("open_get", "0"), ("open_get_search", "1")):
                    took = _in_tree(trees[name], REOPEN, str(copy), event_id, search)
                    out[name].setdefault(part, []).append(took)
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)
    return {
        name: {
            part: {
                "wall_ms": round(median([w for w, _c in runs]) * 1000, 1),
                "cpu_ms": round(median([c for _w, c in runs]) * 1000, 1),
                "runs": runs,
            }
            for part, runs in parts.items()
        }
        for name, parts in out.items()
    }


# Run in this order against one server and tenant; add a scenario by adding a function here.
SCENARIOS: dict[str, Callable[[Setup], dict[str, Any]]] = {
    "latency": scenario_latency,
    "raw_floor": scenario_raw_floor,
    "vector_recall": scenario_vector_recall,
    "tail_merge": scenario_tail_merge,
    "fused_ab": scenario_fused_ab,
    "keyword_arm": scenario_keyword_arm,
    "reopen": scenario_reopen,
    "recall_while_appending": scenario_recall_while_appending,  # adds events to the tenant
    "appends": scenario_appends,  # adds events to the tenant
}


def run_size(size: int, corpus: Corpus, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Build (or reuse) one tenant, serve it, run the scenarios."""
    data = work / f"data-{size}"
    root = data / TENANT
    events, vectors = stream_events(corpus, size)
    stamp = root.parent / f".built-{size}-{SEED}"
    result: dict[str, Any] = {"events": size}
    if (args.keep or args.cache) and stamp.exists():
        result["build"] = json.loads(stamp.read_text())
    else:
        result["build"] = build(root, events)
        stamp.write_text(json.dumps(result["build"]))
    del events
    pristine = data.with_name(data.name + "-pristine")
    # Appends change the tenant: a pristine copy is put back after them (and tail_merge copies
    # it); the scenarios that only read need none (a million events are several GB to copy).
    changes = {"tail_merge", "recall_while_appending", "appends"} & set(args.only or SCENARIOS)
    if changes:
        shutil.rmtree(pristine, ignore_errors=True)
        shutil.copytree(data, pristine)
    base_data = data.with_name(data.name + "-base")
    base = None
    if args.base is not None:
        shutil.rmtree(base_data, ignore_errors=True)
        shutil.copytree(data, base_data)
        base = serve(base_data, args.base)
    server = serve(data)
    try:
        setup = Setup(
            size,
            root,
            server,
            corpus,
            vectors,
            args.quick,
            args.rounds,
            base=base,
            appenders_in_thread=args.appenders_in_thread,
            base_tree=args.base,
        )
        for name, scenario in SCENARIOS.items():
            if args.only and name not in args.only:
                continue
            started = time.perf_counter()
            result[name] = scenario(setup)
            result[name]["took_s"] = round(time.perf_counter() - started, 1)
            print(size, name, json.dumps(result[name]), flush=True)
    finally:
        server.stop()
        if base is not None:
            base.stop()
            shutil.rmtree(base_data)
        if changes:
            shutil.rmtree(data)
            pristine.rename(data)
    return result


def summary(sizes: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets checked against the largest size measured."""
    top = sizes[max(sizes)]
    out: dict[str, Any] = {"events": max(sizes)}
    if "latency" in top and "raw_floor" in top:
        fused = top["latency"]["fused"]
        floor = (
            top["raw_floor"]["hnswlib_knn"]["p50_ms"] + top["raw_floor"]["tantivy_top10"]["p50_ms"]
        )
        out["fused_p50_ms"], out["fused_p99_ms"] = fused["p50_ms"], fused["p99_ms"]
        out["raw_floor_p50_ms"] = round(floor, 3)
        out["fused_over_floor"] = round(fused["p50_ms"] / floor, 2)
    if "vector_recall" in top:
        out["vector_recall_at_10"] = top["vector_recall"]["recall_at_10"]
    if "appends" in top:
        out["appends_per_sec_32"] = top["appends"]["clients_32"]["per_sec"]
    while_appending = top.get("recall_while_appending", {})
    if "new" in while_appending:  # with --base: both servers, same rounds
        new, base = while_appending["new"], while_appending["base"]
        out["while_appending_p50_ms"] = new["recall_p50_ms"]
        out["while_appending_p99_ms"] = new["recall_p99_ms"]
        out["while_appending_appends_over_base"] = round(
            new["appends_per_sec"] / max(base["appends_per_sec"], 1e-9), 3
        )
    checks = {
        "fused_p50_ms <= 5": out.get("fused_p50_ms", 1e9) <= 5,
        "fused_p99_ms <= 20": out.get("fused_p99_ms", 1e9) <= 20,
        "fused_over_floor <= 3": out.get("fused_over_floor", 1e9) <= 3,
        "vector_recall_at_10 >= 0.95": out.get("vector_recall_at_10", 0) >= 0.95,
        "appends_per_sec_32 >= 2000": out.get("appends_per_sec_32", 0) >= 2000,
    }
    if "while_appending_p50_ms" in out:  # issue 17
        checks["while_appending_p50_ms <= 5"] = out["while_appending_p50_ms"] <= 5
        checks["while_appending_p99_ms <= 20"] = out["while_appending_p99_ms"] <= 20
        checks["while_appending_appends_over_base >= 0.9"] = (
            out["while_appending_appends_over_base"] >= 0.9
        )
    out["targets_met"] = checks
    return out


def main(argv: list[str] | None = None) -> int:
    """Run every size and scenario; write bench/out/recall.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 events, one short round")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON output (bench/out/recall.json)"
    )
    parser.add_argument("--sizes", type=int, nargs="*", help="event counts (default 10000 100000)")
    parser.add_argument("--only", nargs="*", default=[], choices=list(SCENARIOS), help="scenarios")
    parser.add_argument("--keep", action="store_true", help="reuse tenants built by an earlier run")
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="build tenants here (outside the checkout) and reuse them from here (implies --keep)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds, medians (3; quick: 1)")
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        help="another checkout (e.g. a git archive of main) served beside this one, rounds "
        "interleaved, in fused_ab and recall_while_appending",
    )
    parser.add_argument(
        "--appenders-in-thread",
        action="store_true",
        help="recall_while_appending's appenders in a thread of this process (the old way)",
    )
    args = parser.parse_args(argv)
    sizes = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    corpus = load_corpus()
    work = args.cache or OUT / "tmp" / "recall"  # default: the scratch area of bench/common.py
    work.mkdir(parents=True, exist_ok=True)
    results = {n: run_size(n, corpus, work, args) for n in sizes}
    if not args.keep and args.cache is None:
        shutil.rmtree(work, ignore_errors=True)
    config = {"dim": DIM, "seed": SEED, "batch": BATCH, "quick": args.quick, "rounds": args.rounds}
    out = write_json(
        "recall", {"config": config, "summary": summary(results), "sizes": results}, args.out
    )
    print(json.dumps(summary(results), indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

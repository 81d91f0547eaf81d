"""Tenant reopen latency, throughput through the LRU cap, and open/close cycles without leaks.

- reopen: tenants of 10,000 and 100,000 events (384-float embeddings, ~120 characters of text),
  built in process through `Tenant.submit_append` in batches of 1,000. The figure is the first
  request after eviction to its answer: in process (a TenantManager with a cap of 1: lease,
  close the victim, open, one read), with the open split into its parts, and over HTTP
  (memspine-server with MEMSPINE_MAX_OPEN_TENANTS=1, GET of one event). Page cache warm.
- churn: 1,000 tenants (copies of one 20-event tenant) read round-robin over HTTP from
  8 connections through a cap of 50, so nearly every request reopens a tenant; and 50 tenants
  through the same cap (nothing reopens) as the ceiling.
- cycles: 10,000 open/close cycles in process through a cap of 1 over three tenants: file
  descriptors, threads and LMDB reader slots before and after.
- cold: 2,000 tenants of 200 events through a cap of 100, recalled round-robin (every request
  a cold tenant), in a fresh process: cold recall p50/p99, warm p50, the RSS and threads an open
  tenant adds (read only, then written), against what the manager accounts; beside the same
  events in a SQLite file per tenant with sqlite-vec and FTS5 (bench/sqlite_tenants.py), in the
  same run; and the cold recall over HTTP (MEMSPINE_MAX_OPEN_TENANTS=100).
- many: 10,000 tenants of 200 events open at once (quick: 1,000), each recalled once, in a fresh
  process: what an open tenant adds once idle (RSS, anonymous and file-backed, threads, file
  descriptors, memory mappings), its open time, and the accounted bytes.
- memory: the accounted memory of open tenants (storage/tenants/footprint.py) against the RSS they add,
  in a fresh process, at several sizes; then 12 tenants of 10,000 events recalled round-robin
  over HTTP, three rounds, by a server with MEMSPINE_MAX_OPEN_BYTES=96M and by one whose
  budget holds them all (the baseline): VmRSS before, at its peak and after each round,
  latency, evictions.

Targets (issue 7): reopen <= 50 ms at 10,000 events and <= 300 ms at 100,000 (the original:
437 ms and 3.3 s).
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import lmdb
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
# BENCH_CODE: the tree whose storage/ a spawned child measures (the baseline's, a `git archive`
# of main, for the cold part's pairs: --baseline); this tree's by default.
sys.path.insert(0, os.environ.get("BENCH_CODE") or str(Path(__file__).resolve().parent.parent))
import sqlite_tenants
from common import (
    SUPPORT_WORDS as WORDS,
)
from common import (
    Process,
    http_request,
    load,
    parse_args,
    scratch_dir,
    serve_memspine,
    write_json,
)

from storage.errors import Unavailable
from storage.heap import pin_mmap_threshold
from storage.index.keyword import KeywordIndex
from storage.index.vectors import VectorIndex
from storage.log.eventlog import EventLog
from storage.model import NewEvent
from storage.read.recall import RecallQuery
from storage.tenants.footprint import (
    closed_tenant_bytes,
    give_back_memory,
    tenant_bytes,
)
from storage.tenants.manager import TenantManager
from storage.tenants.tenant import Tenant

DIM = 384
BATCH = 1000
SEED = 20261007


def corpus(n: int, seed: int = SEED) -> tuple[list[str], np.ndarray]:
    """The texts and vectors `build` appends (n <= BATCH), for the other stores to hold too."""
    rng = np.random.default_rng(seed)
    words = random.Random(seed)
    vectors = rng.standard_normal((n, DIM), dtype=np.float32)
    texts = [" ".join(words.choice(WORDS) for _ in range(18)) for _ in range(n)]
    return texts, vectors


def build(root: Path, tenant_id: str, n: int, seed: int = SEED) -> tuple[float, list[str]]:
    """Append n events to a new tenant in batches, close it; returns seconds and some event ids."""
    rng = np.random.default_rng(seed)
    words = random.Random(seed)
    started = time.perf_counter()
    tenant = Tenant.open(tenant_id, root / tenant_id, embedding_dim=DIM)
    ids: list[str] = []
    for lo in range(0, n, BATCH):
        vectors = rng.standard_normal((min(BATCH, n - lo), DIM), dtype=np.float32)
        events = [
            NewEvent(
                kind="turn",
                ts=1_791_208_939_000_000 + lo + i,
                text=" ".join(words.choice(WORDS) for _ in range(18)),
                embedding=row.tolist(),
            )
            for i, row in enumerate(vectors)
        ]
        results = tenant.submit_append(events).result()
        ids.append(results[0].event_id)
    tenant.close()
    return time.perf_counter() - started, ids


def timed(fn: Any) -> float:
    """Milliseconds fn takes."""
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def open_parts(root: Path) -> dict[str, float]:
    """Milliseconds to open (and close) each part of a tenant on its own."""

    def log_part() -> None:
        EventLog.open(root / "events", embedding_dim=DIM).close()

    def keyword_part() -> None:
        KeywordIndex.open(root / "keyword").close()

    def vector_part() -> None:
        VectorIndex.open(root / "vectors.hnsw", DIM).close()

    def sidecar_part() -> None:
        {int(x) for x in np.load(root / "vectors.hnsw.live.npy")}

    parts = {"lmdb": log_part, "tantivy": keyword_part, "hnswlib": vector_part}
    parts["live_sidecar"] = sidecar_part
    return {name: round(timed(fn), 2) for name, fn in parts.items()}


def reopen_in_process(data: Path, big: str, event_id: str, runs: int) -> dict[str, Any]:
    """First request after eviction to answer, through a manager with a cap of 1."""
    manager = TenantManager(data, embedding_dim=DIM, max_open=1)
    totals, cpus, closes, searches = [], [], [], []
    query = np.random.default_rng(1).standard_normal(DIM).tolist()

    def touch_small() -> None:
        with manager.use("small"):
            pass

    touch_small()
    for _ in range(runs):
        started, cpu = time.perf_counter(), time.process_time()
        with manager.use(big) as t, t.log.reader() as r:  # evicts small, reopens big
            assert r.get(event_id) is not None
            totals.append((time.perf_counter() - started) * 1000)
            cpus.append((time.process_time() - cpu) * 1000)
            searches.append(timed(lambda t=t: t.vectors.search(query, 10)))
        closes.append(timed(touch_small))  # closes big (and opens small)
    manager.close_all()
    parts = [open_parts(data / big) for _ in range(max(3, runs // 2))]
    return {
        "first_request_ms": round(statistics.median(totals), 2),
        "first_request_ms_all": [round(x, 2) for x in totals],
        # CPU time of the whole process: what the figure would be on an otherwise idle machine
        "first_request_cpu_ms": round(statistics.median(cpus), 2),
        "evicting_it_ms": round(statistics.median(closes), 2),
        "first_vector_search_ms": round(statistics.median(searches), 2),
        "parts_ms": {k: statistics.median(p[k] for p in parts) for k in parts[0]},
    }


def server(data: Path, cap: int) -> Process:
    """memspine-server on data (kept as is) with the given cap and 384-float embeddings."""
    return serve_memspine(
        data, {"MEMSPINE_EMBEDDING_DIM": str(DIM), "MEMSPINE_MAX_OPEN_TENANTS": str(cap)}
    )


def reopen_over_http(data: Path, big: str, event_id: str, runs: int) -> dict[str, Any]:
    """GET of one event of a just-evicted tenant, over loopback HTTP, through a cap of 1."""
    proc = server(data, cap=1)
    url = f"http://127.0.0.1:{proc.port}"
    totals = []
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            for _ in range(runs):
                small = c.get("/v1/memory/events", headers={"Authorization": "Bearer small"})
                assert small.status_code == 200, small.text
                started = time.perf_counter()
                r = c.get(
                    f"/v1/memory/event/{event_id}", headers={"Authorization": f"Bearer {big}"}
                )
                totals.append((time.perf_counter() - started) * 1000)
                assert r.status_code == 200, r.text
    finally:
        proc.stop()
    return {
        "first_request_ms": round(statistics.median(totals), 2),
        "first_request_ms_all": [round(x, 2) for x in totals],
    }


def metric(text: str, name: str) -> float:
    """An unlabelled series from /metrics."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def churn(root: Path, tenants: int, cap: int, seconds: float, clients: int = 8) -> dict[str, Any]:
    """Round-robin reads over `tenants` copies of a small tenant through `cap` open slots."""
    data = root / f"churn-{tenants}"
    template = root / "template"
    if not template.exists():
        build(root / "template-build", "t", 20)
        shutil.move(root / "template-build" / "t", template)
    for i in range(tenants):
        shutil.copytree(template, data / f"t{i:04d}")
    proc = server(data, cap)
    try:
        requests = [
            http_request(
                "GET", "/v1/memory/events?limit=10", b"", {"Authorization": f"Bearer t{i:04d}"}
            )
            for i in range(tenants)
        ]
        result = load(proc, requests, clients, warmup=min(3.0, seconds / 3), seconds=seconds)
        with httpx.Client(base_url=f"http://127.0.0.1:{proc.port}") as c:
            text = c.get("/metrics").text
    finally:
        proc.stop()
        shutil.rmtree(data, ignore_errors=True)
    result.update(
        tenants=tenants,
        cap=cap,
        opens=metric(text, "memspine_tenant_opens_total"),
        evictions=metric(text, "memspine_tenant_evictions_total"),
        unavailable=metric(text, "memspine_unavailable_total"),
    )
    return result


def cycles(root: Path, n: int) -> dict[str, Any]:
    """N open/close cycles through a cap of 1: what the process holds before and after."""
    data = root / "cycles"
    names = ["a", "b", "c"]
    for name in names:
        build(data, name, 10)

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def rss_mb() -> float:
        return (
            int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
        )

    before = {"fds": fds(), "threads": threading.active_count(), "rss_mb": round(rss_mb(), 1)}
    manager = TenantManager(data, embedding_dim=DIM, max_open=1)
    started = time.perf_counter()
    for i in range(n):
        with manager.use(names[i % 3]) as t, t.log.reader() as r:
            assert r.last_seq() == 10
    per_cycle = (time.perf_counter() - started) * 1000 / n
    manager.close_all()
    after = {"fds": fds(), "threads": threading.active_count(), "rss_mb": round(rss_mb(), 1)}
    slots = []
    for name in names:
        env = lmdb.open(str(data / name / "events"), max_dbs=16, readonly=True)
        slots.append({"stale_cleared": env.reader_check(), "active": env.readers().strip()})
        env.close()
    return {"cycles": n, "per_cycle_ms": round(per_cycle, 3), "before": before, "after": after,
            "reader_slots": slots}  # fmt: skip


def proc_status(field: str, pid: int | str = "self") -> int:
    """A size field of /proc/<pid>/status (VmRSS, RssAnon), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def accuracy_child(dirs: list[str]) -> dict[str, Any]:
    """In a fresh process: the anonymous RSS that opening these tenants adds, against what the
    manager accounts for them, and what it estimated from their files before opening."""
    paths = [Path(d) for d in dirs]
    warm = Tenant.open("warm", paths[0], embedding_dim=DIM)  # libraries and first-use caches
    warm.close()
    del warm
    estimated = sum(closed_tenant_bytes(p, DIM) for p in paths)
    gc.collect()
    give_back_memory()
    before = proc_status("RssAnon")
    tenants = [Tenant.open(p.name, p, embedding_dim=DIM) for p in paths]
    gc.collect()
    give_back_memory()
    time.sleep(0.3)
    measured = proc_status("RssAnon") - before
    accounted = sum(tenant_bytes(t) for t in tenants)
    for t in tenants:
        t.close()
    n = len(paths)
    return {
        "tenants": n,
        "measured_mb_each": round(measured / n / 1e6, 2),
        "accounted_mb_each": round(accounted / n / 1e6, 2),
        "estimated_before_open_mb_each": round(estimated / n / 1e6, 2),
        "accounted_over_measured": round(accounted / measured, 3),
    }


def accuracy(dirs: list[Path]) -> dict[str, Any]:
    """accuracy_child in a spawned process (this one's heap is fragmented by earlier parts)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        result: dict[str, Any] = pool.apply(accuracy_child, ([str(d) for d in dirs],))
    return result


def cycle_server(data: Path, names: list[str], budget: str, rounds: int) -> dict[str, Any]:
    """Recall each tenant in turn, `rounds` times, on a server with MEMSPINE_MAX_OPEN_BYTES=budget."""
    proc = serve_memspine(
        data, {"MEMSPINE_EMBEDDING_DIM": str(DIM), "MEMSPINE_MAX_OPEN_BYTES": budget}
    )
    pid = proc.proc.pid
    query = np.random.default_rng(5).standard_normal(DIM).tolist()
    body = {"text": "alpha beta", "embedding": query, "k": 10}
    latencies: list[float] = []
    after_round: list[float] = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{proc.port}", timeout=120) as c:
            warm = c.post("/v1/memory/recall", json=body, headers={"Authorization": "Bearer none"})
            assert warm.status_code == 200, warm.text
            base = peak = proc_status("VmRSS", pid)
            for _ in range(rounds):
                for name in names:
                    started = time.perf_counter()
                    r = c.post("/v1/memory/recall", json=body,
                               headers={"Authorization": f"Bearer {name}"})  # fmt: skip
                    latencies.append((time.perf_counter() - started) * 1000)
                    assert r.status_code == 200, r.text
                    peak = max(peak, proc_status("VmRSS", pid))
                after_round.append(proc_status("VmRSS", pid) / 1e6)
            text = c.get("/metrics").text
    finally:
        proc.stop()

    def reason(name: str, why: str) -> float:
        return metric(text, f'{name}{{reason="{why}"}}')

    return {
        "budget": budget,
        "rss_base_mb": round(base / 1e6, 1),
        "rss_peak_mb": round(peak / 1e6, 1),
        "rss_after_round_mb": [round(x, 1) for x in after_round],
        "peak_growth_mb": round((peak - base) / 1e6, 1),
        "p50_ms": round(statistics.median(latencies), 1),
        "p99_ms": round(float(np.percentile(latencies, 99)), 1),
        "open_tenants": metric(text, "memspine_open_tenants"),
        "open_tenant_mb": round(metric(text, "memspine_open_tenant_bytes") / 1e6, 1),
        "budget_mb": round(metric(text, "memspine_open_bytes_budget") / 1e6, 1),
        "opens": metric(text, "memspine_tenant_opens_total"),
        "evictions_memory": reason("memspine_tenant_evictions_by_reason_total", "memory_budget"),
        "unavailable": metric(text, "memspine_unavailable_total"),
    }


def memory(root: Path, n: int, tenants: int, budget: str, rounds: int,
           extra: list[Path]) -> dict[str, Any]:  # fmt: skip
    """Accounted against measured memory, then the budget against a server that keeps all open."""
    data = root / "memory"
    names = [f"m{i:02d}" for i in range(tenants)]
    build(root / "memory-template", "tpl", n)
    for name in names:
        shutil.copytree(root / "memory-template" / "tpl", data / name)
    for small, copies_of in ((0, 8), (2_000, 6)):
        build(root / "memory-template", f"s{small}", small)
        for i in range(copies_of):
            shutil.copytree(root / "memory-template" / f"s{small}", data / f"s{small}-{i}")
    out: dict[str, Any] = {"events_per_tenant": n, "tenants": tenants, "rounds": rounds}
    out["accounted_vs_rss"] = {
        "0": accuracy(sorted(data.glob("s0-*"))),
        "2000": accuracy(sorted(data.glob("s2000-*"))),
        str(n): accuracy([data / name for name in names[:4]]),
        **{p.name: accuracy([p]) for p in extra},
    }
    print(f"memory accuracy: {out['accounted_vs_rss']}", file=sys.stderr, flush=True)
    out["all_fit"] = cycle_server(data, names, "100%", rounds)
    out["budgeted"] = cycle_server(data, names, budget, rounds)
    shutil.rmtree(data, ignore_errors=True)
    return out


COLD_QUERIES = 64


def cold_queries() -> list[tuple[str, np.ndarray]]:
    """Recall queries: three words of the corpus and a random vector each."""
    rng = np.random.default_rng(SEED + 1)
    words = random.Random(SEED + 1)
    return [
        (" ".join(words.choice(WORDS) for _ in range(3)), rng.standard_normal(DIM).astype("f4"))
        for _ in range(COLD_QUERIES)
    ]


def threads_now() -> int:
    """This process's native threads."""
    return len(os.listdir("/proc/self/task"))


def held_now() -> dict[str, int]:
    """What this process holds: anonymous and file-backed RSS (bytes), threads, descriptors
    and memory mappings."""
    with open("/proc/self/maps") as maps:
        mappings = sum(1 for _ in maps)
    return {
        "rss_anon": proc_status("RssAnon"),
        "rss_file": proc_status("RssFile"),
        "threads": threads_now(),
        "fds": len(os.listdir("/proc/self/fd")),
        "maps": mappings,
    }


def per_tenant(now: dict[str, int], base: dict[str, int], n: int) -> dict[str, float]:
    """What each of n open tenants adds over base (KB for the RSS figures)."""
    out: dict[str, float] = {}
    for key, value in now.items():
        delta = (value - base[key]) / n
        out[key + ("_kb_each" if key.startswith("rss") else "_each")] = round(
            delta / 1e3 if key.startswith("rss") else delta, 2
        )
    return out


def linger_secs() -> float:
    """How long an idle keyword index keeps its Tantivy index (storage/index/held.py); 0 for
    code without it."""
    try:
        from storage.index.held import held
    except ImportError:
        return 0.0
    return held().linger


def raise_nofile(want: int) -> int:
    """Raise this process's descriptor limit toward want (the hard one too, where allowed);
    the soft limit now."""
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in ((want, max(hard, want)), (min(want, hard), hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, target)
            break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def settle(tenants: list[Tenant]) -> None:
    """Wait until every tenant's keyword fold is done and its writer closed."""
    deadline = time.monotonic() + 120
    while not all(t.keyword.settled() and t.keyword._writer is None for t in tenants):
        assert time.monotonic() < deadline, "folds did not settle"
        time.sleep(0.05)


def cold_child(data: str, names: list[str], cap: int) -> dict[str, Any]:
    """In a fresh process: round-robin recalls through a manager with this cap (each request a
    cold tenant), warm recalls, and the RSS, threads and accounted bytes open tenants add."""
    pin_mmap_threshold()  # as memspine/app.py does for the server
    queries = cold_queries()
    warming = TenantManager(Path(data), embedding_dim=DIM, max_open=cap)
    with warming.use(names[0], create=False) as t:  # libraries, first-use caches, the pool
        text, vector = queries[0]
        t.recall(RecallQuery(text=text, embedding=vector.tolist(), k=10), embeddings=False)
    warming.close_all()
    manager = TenantManager(Path(data), embedding_dim=DIM, max_open=cap)

    def ask(name: str, i: int) -> float:
        text, vector = queries[i % len(queries)]
        query = RecallQuery(text=text, embedding=vector.tolist(), k=10)
        started = time.perf_counter()
        with manager.use(name, create=False) as t:
            assert t.recall(query, embeddings=False).hits
        return (time.perf_counter() - started) * 1000

    gc.collect()
    give_back_memory()
    base_rss, base_threads = proc_status("RssAnon"), threads_now()
    cold = [ask(names[i % len(names)], i) for i in range(len(names))]
    gc.collect()
    give_back_memory()
    time.sleep(0.3)
    open_now = manager.open_tenants()
    held = {
        "open_tenants": len(open_now),
        "rss_kb_each": round((proc_status("RssAnon") - base_rss) / len(open_now) / 1e3, 1),
        "threads_each": round((threads_now() - base_threads) / len(open_now), 2),
        "accounted_kb_each": round(sum(map(tenant_bytes, open_now)) / len(open_now) / 1e3, 1),
    }
    time.sleep(linger_secs() + 1.0)  # idle: keyword indexes let go (storage/index/held.py)
    gc.collect()
    give_back_memory()
    held["idle_after_s"] = round(linger_secs() + 1.0, 1)
    held["idle_rss_kb_each"] = round((proc_status("RssAnon") - base_rss) / len(open_now) / 1e3, 1)
    held["idle_threads_each"] = round((threads_now() - base_threads) / len(open_now), 2)
    held["idle_accounted_kb_each"] = round(
        sum(map(tenant_bytes, open_now)) / len(open_now) / 1e3, 1
    )
    event = NewEvent(kind="turn", ts=1_800_000_000_000_000, text="a written tenant",
                     embedding=queries[0][1].tolist())  # fmt: skip
    for t in open_now:
        t.submit_append([event]).result()
    settle(open_now)
    gc.collect()
    give_back_memory()
    time.sleep(0.3)
    written = {
        "rss_kb_each": round((proc_status("RssAnon") - base_rss) / len(open_now) / 1e3, 1),
        "threads_each": round((threads_now() - base_threads) / len(open_now), 2),
        "accounted_kb_each": round(sum(map(tenant_bytes, open_now)) / len(open_now) / 1e3, 1),
    }
    few = names[: cap // 2]
    warm = [ask(few[i % len(few)], i) for i in range(len(few) * 4)]
    manager.close_all()
    return {
        "cold": sqlite_tenants.summary(cold),
        "warm": sqlite_tenants.summary(warm[len(few) :]),
        "open_read_only": held,
        "open_written": written,
    }


def many_child(data: str, names: list[str]) -> dict[str, Any]:
    """In a fresh process: open every tenant at once (each recalled once) through a manager
    that holds them all, then what each adds once idle."""
    pin_mmap_threshold()  # as memspine/app.py does for the server
    nofile = raise_nofile(4 * len(names) + 1024)
    queries = cold_queries()
    manager = TenantManager(Path(data), embedding_dim=DIM, max_open=len(names) + 1)

    def ask(name: str, i: int) -> float:
        text, vector = queries[i % len(queries)]
        query = RecallQuery(text=text, embedding=vector.tolist(), k=10)
        started = time.perf_counter()
        with manager.use(name, create=False) as t:
            assert t.recall(query, embeddings=False).hits
        return (time.perf_counter() - started) * 1000

    ask(names[0], 0)  # libraries, first-use caches, the pools
    gc.collect()
    give_back_memory()
    base = held_now()
    started = time.perf_counter()
    opens: list[float] = []
    refused = None
    for i, name in enumerate(names[1:], start=1):
        try:
            opens.append(ask(name, i))
        except Unavailable as exc:  # out of descriptors, say: how far it got is the figure
            refused = {"at": i, "detail": exc.detail}
            break
    fill_s = time.perf_counter() - started
    n = len(opens)
    just = per_tenant(held_now(), base, n)
    time.sleep(linger_secs() + 1.0)  # idle: keyword indexes let go (storage/index/held.py)
    gc.collect()
    give_back_memory()
    now = held_now()
    idle = per_tenant(now, base, n)
    accounted = sum(map(tenant_bytes, manager.open_tenants()))
    out = {
        "open_tenants": len(manager.open_tenants()),
        "refused": refused,
        "nofile": nofile,
        "fill_s": round(fill_s, 1),
        "open_and_recall": sqlite_tenants.summary(opens),
        "just_opened": just,
        "idle": idle,
        "accounted_kb_each": round(accounted / (n + 1) / 1e3, 1),
        "process_rss_mb": round((now["rss_anon"] + now["rss_file"]) / 1e6, 1),
        "process_rss_anon_mb": round(now["rss_anon"] / 1e6, 1),
        "process_threads": now["threads"],
        "process_fds": now["fds"],
        "process_maps": now["maps"],
    }
    manager.close_all()
    return out


def many_tenants(root: Path, tenants: int, events: int) -> dict[str, Any]:
    """`tenants` copies of one tenant open at once in a fresh process (its index files hard
    linked: only the log is copied, the one part an open writes to)."""
    build(root / "many-template", "tpl", events)
    template = root / "many-template" / "tpl"
    data = root / "many"
    names = [f"m{i:05d}" for i in range(tenants)]
    for name in names:
        shutil.copytree(template, data / name, copy_function=os.link)
        shutil.rmtree(data / name / "events")
        shutil.copytree(template / "events", data / name / "events")
    out: dict[str, Any] = {"tenants": tenants, "events": events}
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        out.update(pool.apply(many_child, (str(data), names)))
    shutil.rmtree(data, ignore_errors=True)
    return out


def cold_over_http(data: Path, names: list[str], cap: int) -> dict[str, Any]:
    """Round-robin recalls over HTTP through MEMSPINE_MAX_OPEN_TENANTS=cap, one client."""
    proc = serve_memspine(
        data, {"MEMSPINE_EMBEDDING_DIM": str(DIM), "MEMSPINE_MAX_OPEN_TENANTS": str(cap)}
    )
    queries = cold_queries()
    latencies = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{proc.port}", timeout=120) as c:
            for i in range(len(names) + cap):
                text, vector = queries[i % len(queries)]
                body = {"text": text, "embedding": vector.tolist(), "k": 10}
                headers = {"Authorization": f"Bearer {names[i % len(names)]}"}
                started = time.perf_counter()
                r = c.post("/v1/memory/recall", json=body, headers=headers)
                latencies.append((time.perf_counter() - started) * 1000)
                assert r.status_code == 200, r.text
            threads = len(os.listdir(f"/proc/{proc.proc.pid}/task"))
    finally:
        proc.stop()
    out = sqlite_tenants.summary(latencies[cap:])  # the first round-robin's warm-up left out
    out["server_threads"] = threads
    return out


def cold_in(code: str | None, data: Path, names: list[str], cap: int) -> dict[str, Any]:
    """cold_child in a fresh process running the storage/ of the tree `code` (None: this one)."""
    before = os.environ.get("BENCH_CODE")
    if code is not None:
        os.environ["BENCH_CODE"] = code  # read by this module's top in the spawned child
    try:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            result: dict[str, Any] = pool.apply(cold_child, (str(data), names, cap))
    finally:
        if before is None:
            os.environ.pop("BENCH_CODE", None)
        else:
            os.environ["BENCH_CODE"] = before
    return result


def cold_pairs(
    root: Path, data: Path, names: list[str], cap: int, baseline: str, rounds: int
) -> dict[str, Any]:
    """The baseline tree's code and this one's, alternating, each beside a sqlite-vec run: the
    tenants the child wrote to are copied afresh after each run, so both read the same files."""
    files = sorted((root / "cold-sqlite").glob("*.db"))
    queries = cold_queries()
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
    for r in range(rounds):
        order = ["baseline", "this"] if r % 2 == 0 else ["this", "baseline"]
        for side in order:
            load_before = os.getloadavg()
            child = cold_in(baseline if side == "baseline" else None, data, names, cap)
            sqlite = sqlite_tenants.cold(files, queries, len(files))
            child["sqlite_vec_cold"] = sqlite
            child["cold_over_sqlite_p50"] = round(child["cold"]["p50_ms"] / sqlite["p50_ms"], 2)
            child["loadavg"] = [round(x, 1) for x in (*load_before, *os.getloadavg())]
            runs[side].append(child)
            print(f"cold {side} round {r}: {child}", file=sys.stderr, flush=True)
            for name in names[-cap:]:  # the ones it appended to (open at the end)
                shutil.rmtree(data / name)
                shutil.copytree(root / "cold-template" / "tpl", data / name)
    return {"baseline_code": baseline, "rounds": rounds, **runs}


def cold_tenants(
    root: Path,
    tenants: int,
    events: int,
    cap: int,
    baseline: str | None = None,
    rounds: int = 2,
) -> dict[str, Any]:
    """Memspine and sqlite-vec + FTS5 with a file per tenant, the same events, in one run; with
    a baseline tree, its code and this one's in pairs (cold_pairs)."""
    build(root / "cold-template", "tpl", events)
    texts, vectors = corpus(events)
    names = [f"c{i:05d}" for i in range(tenants)]
    data = root / "cold"
    for name in names:
        shutil.copytree(root / "cold-template" / "tpl", data / name)
    disk = sum(f.stat().st_size for f in (data / names[0]).rglob("*") if f.is_file())
    sqlite_tenants.build(root / "cold-template.db", texts, vectors)
    files = sqlite_tenants.copies(root / "cold-template.db", root / "cold-sqlite", names)
    queries = cold_queries()
    out: dict[str, Any] = {"tenants": tenants, "events": events, "cap": cap}
    out["disk_bytes_per_event"] = {
        "memspine": round(disk / events),
        "sqlite_vec": round(files[0].stat().st_size / events),
    }
    if baseline is not None:
        out["pairs"] = cold_pairs(root, data, names, cap, baseline, rounds)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        out["memspine"] = pool.apply(cold_child, (str(data), names, cap))
    print(f"cold memspine: {out['memspine']}", file=sys.stderr, flush=True)
    out["sqlite_vec"] = {
        "cold": sqlite_tenants.cold(files, queries, len(files)),
        "warm": sqlite_tenants.warm(files[: cap // 2], queries, cap * 2),
    }
    print(f"cold sqlite-vec: {out['sqlite_vec']}", file=sys.stderr, flush=True)
    out["memspine_http"] = cold_over_http(data, names, cap)
    print(f"cold http: {out['memspine_http']}", file=sys.stderr, flush=True)
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(root / "cold-sqlite", ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the three parts and write bench/out/tenants.json."""
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--sizes", type=str, default=None, help="comma-separated event counts")
    extra.add_argument("--runs", type=int, default=None)
    extra.add_argument("--parts", type=str, default="reopen,churn,cycles,memory,cold,many",
                       help="comma-separated parts to run")  # fmt: skip
    extra.add_argument("--many", type=int, default=None, help="tenants open at once (many)")
    extra.add_argument(
        "--baseline",
        type=str,
        default=None,
        help="cold: a tree (git archive of main) measured in pairs with this one",
    )
    extra.add_argument("--rounds", type=int, default=2, help="cold: pairs with --baseline")
    known, rest = extra.parse_known_args(sys.argv[1:] if argv is None else argv)
    parts = set(known.parts.split(","))
    args = parse_args(__doc__.splitlines()[0], rest)
    sizes = [int(s) for s in known.sizes.split(",")] if known.sizes else (
        [2_000] if args.quick else [10_000, 100_000])  # fmt: skip
    runs = known.runs or (3 if args.quick else 7)
    root = scratch_dir("tenants")
    config = {"dim": DIM, "batch": BATCH, "sizes": sizes, "runs": runs}
    out: dict[str, Any] = {"config": config, "loadavg_start": os.getloadavg()}
    try:
        out["reopen"] = {}
        for n in sizes if "reopen" in parts else []:
            big = f"big{n}"
            seconds, ids = build(root / "data", big, n)
            print(f"built {n} events in {seconds:.1f} s", file=sys.stderr, flush=True)
            entry = {"build_s": round(seconds, 1)}
            entry["in_process"] = reopen_in_process(root / "data", big, ids[-1], runs)
            entry["http"] = reopen_over_http(root / "data", big, ids[-1], runs)
            entry["disk_mb"] = round(sum(f.stat().st_size for f in (root / "data" / big).rglob("*") if f.is_file()) / 1e6, 1)  # fmt: skip
            out["reopen"][str(n)] = entry
            print(f"reopen at {n}: {entry}", file=sys.stderr, flush=True)
        churn_secs = 4.0 if args.quick else 20.0
        many, cap = (100, 10) if args.quick else (1000, 50)
        if "churn" in parts:
            out["churn"] = {
                "round_robin": churn(root, many, cap, churn_secs),
                "all_fit": churn(root, cap, cap, churn_secs),
            }
            print(f"churn: {out['churn']}", file=sys.stderr, flush=True)
        if "cycles" in parts:
            out["cycles"] = cycles(root, 500 if args.quick else 10_000)
            print(f"cycles: {out['cycles']}", file=sys.stderr, flush=True)
        if "cold" in parts:
            tenants, cap = (200, 20) if args.quick else (2_000, 100)
            out["cold"] = cold_tenants(root, tenants, 200, cap, known.baseline, known.rounds)
        if "many" in parts:
            count = known.many or (1_000 if args.quick else 10_000)
            out["many"] = many_tenants(root, count, 200)
            print(f"many: {out['many']}", file=sys.stderr, flush=True)
        if "memory" in parts:
            # Each 10,000-event tenant accounts ~23 MB: 96M holds four; 3,000-event ones ~8 MB.
            n, budget = (3_000, "32M") if args.quick else (10_000, "96M")
            big = [root / "data" / f"big{s}" for s in sizes if (root / "data" / f"big{s}").exists()]
            out["memory"] = memory(root, n, 12, budget, 3, big)
            print(f"memory: {out['memory']}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["loadavg_end"] = os.getloadavg()
    path = write_json("tenants", out, args.out)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

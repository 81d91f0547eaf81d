"""Purge time for one deleted event, and how long the tenant's other requests wait meanwhile.

- Tenants of 10,000 and 100,000 events (384-float embeddings, 18 words of text, two filterable
  properties), built once in process through `Tenant.submit_append` in batches of 1,000 and
  closed (the HNSW graph complete and saved); kept as templates under bench/out/tmp/ and reused
  by later runs of this script (building 100,000 takes minutes: the graph inserts).
- Each run: a copy of the template is opened, one of its events (so in the saved vector file
  too) is deleted, and `Tenant.purge()` runs while two threads use the tenant: a reader looping
  over what a recall and a GET do (a log read by id, a keyword search, a vector search for 10),
  and a writer appending one event every 20 ms. Each request records when it started and how
  long it took.
- Reported per size: the purge's seconds (median of the runs), the writer pause and the swap as
  the purge measured them, and the longest read and append that overlapped the purge, beside
  their medians before it; then one more purge with no traffic, its wall and CPU seconds (the
  CPU figure does not depend on what else runs on the machine). After each run, every file is
  scanned for the two victims' embeddings (as msgpack in the log, as hnswlib holds them).

Targets (issue 6): at 100,000 events a purge finishes in under 10 s and blocks the tenant's
requests for under 1 s.
"""

from __future__ import annotations

import random
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import OUT, parse_args, percentile, write_json

from storage.model import NewEvent
from storage.tenants.tenant import Tenant

DIM = 384
BATCH = 1000
SEED = 20261130
WORDS = [f"w{i:04d}" for i in range(4000)] + ["order", "parcel", "carrier", "refund", "street"]
WRITE_EVERY = 0.02


def events(rng: np.random.Generator, words: random.Random, lo: int, n: int) -> list[NewEvent]:
    """N synthetic events numbered from lo."""
    vectors = rng.standard_normal((n, DIM), dtype=np.float32)
    return [
        NewEvent(
            kind="turn" if (lo + i) % 3 else "fact",
            ts=1_791_208_939_000_000 + (lo + i) * 1000,
            text=" ".join(words.choice(WORDS) for _ in range(18)),
            embedding=row.tolist(),
            properties_raw=msgspec.json.encode(
                {"speaker": words.choice(["agent", "customer"]), "n": lo + i}
            ),
        )
        for i, row in enumerate(vectors)
    ]


def template(n: int) -> tuple[Path, float | None]:
    """The built tenant of n events (building it if missing); seconds spent building, or None."""
    root = OUT / "tmp" / f"purge-template-{n}"
    if (root / "BUILT").exists():
        return root / "t", None
    shutil.rmtree(root, ignore_errors=True)
    started = time.perf_counter()
    rng, words = np.random.default_rng(SEED), random.Random(SEED)
    tenant = Tenant.open("t", root / "t", embedding_dim=DIM)
    for lo in range(0, n, BATCH):
        tenant.submit_append(events(rng, words, lo, min(BATCH, n - lo))).result()
    tenant.close()  # waits for the graph inserts and saves the vector index
    (root / "BUILT").write_text(str(n))
    return root / "t", time.perf_counter() - started


class Traffic:
    """A reader and a writer thread using the tenant; each request's start and duration."""

    def __init__(self, tenant: Tenant, ids: list[str], seed: int) -> None:
        self.tenant = tenant
        self.ids = ids
        self.rng = random.Random(seed)
        self.reads: list[tuple[float, float]] = []
        self.writes: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._read), threading.Thread(target=self._write)]

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

    def _read(self) -> None:
        query = np.random.default_rng(1).standard_normal(DIM).tolist()
        while not self.stop.is_set():
            started = time.perf_counter()
            with self.tenant.log.reader() as r:
                r.get(self.rng.choice(self.ids))
                self.tenant.keyword.search(self.rng.choice(WORDS), limit=10)
                self.tenant.vectors.search(query, 10)
            self.reads.append((started, time.perf_counter() - started))

    def _write(self) -> None:
        rng, words, i = np.random.default_rng(7), random.Random(7), 10_000_000
        while not self.stop.wait(WRITE_EVERY):
            started = time.perf_counter()
            self.tenant.submit_append(events(rng, words, i, 1)).result()
            self.writes.append((started, time.perf_counter() - started))
            i += 1


def waits(samples: list[tuple[float, float]], lo: float, hi: float) -> dict[str, float]:
    """Longest request overlapping [lo, hi] and the median of those that ended before lo (ms)."""
    during = [d for s, d in samples if s < hi and s + d > lo]
    before = [d for s, d in samples if s + d <= lo]
    return {
        "max_during_ms": round(max(during, default=0.0) * 1000, 1),
        "median_before_ms": round(percentile(before, 50) * 1000, 2),
        "during": len(during),
    }


def one_run(source: Path, work: Path, seed: int) -> dict[str, Any]:
    """Copy, open, delete one saved event, purge under traffic, then once more alone; the
    figures of this run, and the files still holding a victim's bytes."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(source, work)
    tenant = Tenant.open("t", work, embedding_dim=DIM)
    with tenant.log.reader() as r:
        ids = list(r.all_ids())
    rng = random.Random(seed)
    victims = rng.sample(ids, 2)  # events of the template: in the saved vector file too
    ids = [e for e in ids if e not in victims]
    patterns = [p for v in victims for p in victim_bytes(tenant, v)]
    tenant.submit_delete(victims[:1]).result()
    with Traffic(tenant, ids, seed) as traffic:
        time.sleep(1.0)  # the medians before the purge
        started = time.perf_counter()
        stats = tenant.purge()
        ended = time.perf_counter()
        time.sleep(0.2)
    tenant.submit_delete(victims[1:]).result()
    wall, cpu = time.perf_counter(), time.process_time()
    tenant.purge()
    alone = (time.perf_counter() - wall, time.process_time() - cpu)
    tenant.close()
    return {
        "purge_alone_s": round(alone[0], 3),
        "purge_alone_cpu_s": round(alone[1], 3),
        "purge_s": round(ended - started, 3),
        "writes_paused_s": round(stats.writes_paused, 3),
        "swap_s": round(stats.reads_paused, 4),
        "purged": stats.purged,
        "read": waits(traffic.reads, started, ended),
        "append": waits(traffic.writes, started, ended),
        "victim_bytes_left_in": files_holding(work, patterns),
    }


def victim_bytes(tenant: Tenant, event_id: str) -> list[bytes]:
    """A victim's embedding as the log stores it (raw float64s, storage/log/layout.py), as a msgpack
    array (what the text of a JSON copy would hold) and as hnswlib holds it."""
    with tenant.log.reader() as r:
        ev = r.get(event_id)
    assert ev is not None and ev.embedding is not None
    held = np.asarray(tenant.vectors.index.get_items([ev.seq]), dtype="<f4").tobytes()
    stored = np.asarray(ev.embedding, dtype="<f8").tobytes()
    return [stored, msgspec.msgpack.encode(ev.embedding), held]


def files_holding(root: Path, patterns: list[bytes]) -> list[str]:
    """Files under root holding any of the patterns."""
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            if any(p in data for p in patterns):
                found.append(str(path.relative_to(root)))
    return found


def measure(n: int, runs: int) -> dict[str, Any]:
    """All runs at one size, summarised."""
    source, built = template(n)
    work = OUT / "tmp" / f"purge-run-{n}"
    results = [one_run(source, work, seed) for seed in range(runs)]
    shutil.rmtree(work, ignore_errors=True)
    summary = {
        "events": n,
        "runs": runs,
        "build_s": None if built is None else round(built, 1),
        "purge_alone_s_median": statistics.median(r["purge_alone_s"] for r in results),
        "purge_alone_cpu_s_median": statistics.median(r["purge_alone_cpu_s"] for r in results),
        "purge_s_median": statistics.median(r["purge_s"] for r in results),
        "writes_paused_s_median": statistics.median(r["writes_paused_s"] for r in results),
        "swap_s_max": max(r["swap_s"] for r in results),
        "read_wait_ms_max": max(r["read"]["max_during_ms"] for r in results),
        "append_wait_ms_max": max(r["append"]["max_during_ms"] for r in results),
        "victim_bytes_left_in": sorted({f for r in results for f in r["victim_bytes_left_in"]}),
        "each": results,
    }
    print(
        msgspec.json.encode({k: v for k, v in summary.items() if k != "each"}).decode(), flush=True
    )
    return summary


def main() -> None:
    """Measure, print and write the JSON."""
    args = parse_args(__doc__.splitlines()[0])
    sizes = [(1_000, 1)] if args.quick else [(10_000, 3), (100_000, 3)]
    results = [measure(n, runs) for n, runs in sizes]
    write_json("purge", {"sizes": results}, args.out)


if __name__ == "__main__":
    main()

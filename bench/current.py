"""Benchmark: what current state costs recall — fused recall over 100,000 events with 30 % of
facts superseded, p50 with `current` (the default) against the same queries with `current=false`.

The engine is driven in process (no HTTP), so the figures are the current-state pass and nothing
else. Each query runs in both modes back to back, the order alternating, so load from other
processes falls on both alike. Run: `.venv/bin/python bench/current.py [--quick] [--out FILE]`;
writes bench/out/current.json. The acceptance bound (issue 8): p50(current) <= 1.2 x
p50(current=false); the script exits 1 past it.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import median, parse_args, percentile, scratch_dir, write_json

from storage.model import NewEvent
from storage.read.recall import RecallQuery, recall, validate
from storage.tenants.tenant import Tenant

SEED = 20261006
DIM = 384  # all-MiniLM-L6-v2, the default tenant dimension
EVENTS, QUERIES = 100_000, 400
QUICK_EVENTS, QUICK_QUERIES = 10_000, 100
SUPERSEDED_SHARE = 0.3
ROUNDS = 3  # measurement rounds over one loaded tenant (loading is most of the run)
VOCAB = 30_000
TOPIC_WORDS = 4
BATCH = 1000
BOUND = 1.2  # the acceptance: within 20 %
T0 = 1_790_000_000_000_000


@dataclass
class Corpus:
    """Events in append order (each chain's versions oldest first) and what queries need."""

    events: list[NewEvent]  # append order; a later version names the one before in `supersedes`
    topic_words: list[list[str]]
    centroids: np.ndarray
    chain_lengths: list[int]
    facts: int
    superseded: int


def _words(rng: np.random.Generator) -> list[str]:
    """A vocabulary of distinct pronounceable words."""
    sy = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "be", "da", "fi", "go", "hu", "ja", "pe"]
    words: set[str] = set()
    while len(words) < VOCAB:
        n = int(rng.integers(2, 5))
        words.add("".join(sy[int(i)] for i in rng.integers(0, len(sy), n)))
    return sorted(words)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def build_corpus(n_events: int, dim: int, superseded_share: float) -> Corpus:
    """Facts in supersession chains (lengths 1, 2 and 4) among turns, in random order; fixed seed.

    60 % of events are facts; chains of 2 and 4 hold the superseded share of them, so a query
    about a topic ranks several versions of one fact close together and recall must substitute."""
    rng = np.random.default_rng(SEED)
    vocab = _words(rng)
    n_facts = int(n_events * 0.6)
    target = int(n_facts * superseded_share)
    # Half the superseded versions sit in chains of 2 (one each), half in chains of 4 (three each).
    twos, fours = target // 2, target // 2 // 3
    ones = n_facts - 2 * twos - 4 * fours
    lengths = [1] * ones + [2] * twos + [4] * fours
    rng.shuffle(lengths)
    n_topics = len(lengths)
    centroids = _unit(rng.standard_normal((n_topics, dim)).astype(np.float32))
    topic_words = [
        [vocab[int(i)] for i in rng.integers(0, VOCAB, TOPIC_WORDS)] for _ in range(n_topics)
    ]
    # Append order: a random key per event, sorted within each chain so versions come in order.
    slots = [
        (float(k), t, v)
        for t, n in enumerate(lengths)
        for v, k in enumerate(np.sort(rng.random(n)))
    ]
    slots += [(float(k), -1, 0) for k in rng.random(n_events - n_facts)]
    slots.sort()
    background = iter(np.minimum(rng.zipf(1.3, size=n_events * 14), VOCAB) - 1)
    # Ids are fixed up front so a version can name one appended earlier in the same batch.
    ids = [str(uuid.UUID(bytes=rng.bytes(16), version=4)) for _ in slots]
    position: dict[tuple[int, int], int] = {}
    events: list[NewEvent] = []
    for i, (_key, topic, version) in enumerate(slots):
        if topic < 0:  # a turn: background words, a vector loosely near some topic
            text = " ".join(vocab[int(next(background))] for _ in range(14))
            near = centroids[int(rng.integers(0, n_topics))]
            emb = _unit(near + 0.8 * rng.standard_normal(dim).astype(np.float32))
            events.append(
                NewEvent(kind="turn", ts=T0 + i, text=text, embedding=emb.tolist(), event_id=ids[i])
            )
            continue
        words = topic_words[topic] + [vocab[int(next(background))] for _ in range(8)]
        emb = _unit(centroids[topic] + 0.35 * rng.standard_normal(dim).astype(np.float32))
        position[(topic, version)] = i
        older = (ids[position[(topic, version - 1)]],) if version else ()
        text = " ".join(words)
        events.append(
            NewEvent(
                kind="fact",
                ts=T0 + i,
                text=text,
                embedding=emb.tolist(),
                event_id=ids[i],
                supersedes=older,
            )
        )
    superseded = sum(n - 1 for n in lengths)
    return Corpus(events, topic_words, centroids, lengths, n_facts, superseded)


def load(tenant: Tenant, corpus: Corpus) -> float:
    """Append every event in batches through the tenant's writer; returns seconds taken."""
    start = time.perf_counter()
    for lo in range(0, len(corpus.events), BATCH):
        results = tenant.submit_append(corpus.events[lo : lo + BATCH]).result(timeout=600)
        assert not any(r.unlinked for r in results), "a version named an event not yet appended"
    tenant.vectors.flush()  # measure the graph, not the exact tail
    return time.perf_counter() - start


def queries(corpus: Corpus, n: int, dim: int) -> list[dict[str, Any]]:
    """Fused queries about random chains: three of the topic's words and a nearby vector."""
    rng = np.random.default_rng(SEED + 1)
    out = []
    for topic in rng.integers(0, len(corpus.chain_lengths), n):
        words = [corpus.topic_words[int(topic)][int(i)] for i in rng.permutation(TOPIC_WORDS)[:3]]
        emb = _unit(
            corpus.centroids[int(topic)] + 0.35 * rng.standard_normal(dim).astype(np.float32)
        )
        out.append({"text": " ".join(words), "embedding": emb.tolist(), "kind": "fact", "k": 10})
    return out


def one_round(tenant: Tenant, qs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Each query with current=true and current=false back to back (order alternating)."""
    times: dict[bool, list[float]] = {True: [], False: []}
    paired: list[float] = []
    substituted = replaced = 0
    for i, body in enumerate(qs):
        modes = (True, False) if i % 2 == 0 else (False, True)
        for current in modes:
            q = RecallQuery(**body, current=current)
            start = time.perf_counter()
            with tenant.log.reader() as r:
                validate(q, tenant.dim, r.meta_str("model"))
                hits = recall(r, tenant.keyword, tenant.vectors, q).hits
            elapsed = time.perf_counter() - start
            if i >= warmup:
                times[current].append(elapsed * 1000)
                if current:
                    n = sum(len(h.replaces) for h in hits)
                    substituted += n > 0
                    replaced += n
        if i >= warmup:
            paired.append(times[True][-1] / times[False][-1])

    def summary(ms: list[float]) -> dict[str, float]:
        return {
            "p50_ms": round(median(ms), 3),
            "p95_ms": round(percentile(ms, 95), 3),
            "mean_ms": round(sum(ms) / len(ms), 3),
        }

    on, off = summary(times[True]), summary(times[False])
    measured = len(qs) - warmup
    return {
        "current_true": on,
        "current_false": off,
        "p50_ratio": round(on["p50_ms"] / off["p50_ms"], 3),
        "median_paired_ratio": round(median(paired), 3),
        "queries_with_substitution": round(substituted / measured, 3),
        "versions_replaced_per_query": round(replaced / measured, 2),
    }


def measure(tenant: Tenant, qs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """ROUNDS rounds over the same tenant; the headline figures are the medians of the rounds."""
    rounds = [one_round(tenant, qs, warmup) for _ in range(ROUNDS)]

    def mid(key: str, sub: str | None = None) -> float:
        return round(median([r[key][sub] if sub else r[key] for r in rounds]), 3)

    return {
        "p50_ms_current_true": mid("current_true", "p50_ms"),
        "p50_ms_current_false": mid("current_false", "p50_ms"),
        "p50_ratio": mid("p50_ratio"),
        "median_paired_ratio": mid("median_paired_ratio"),
        "queries_with_substitution": rounds[0]["queries_with_substitution"],
        "versions_replaced_per_query": rounds[0]["versions_replaced_per_query"],
        "rounds": rounds,
    }


def run(n_events: int, n_queries: int, dim: int, share: float) -> dict[str, Any]:
    """Build the tenant in a temporary directory, load it, measure, clean up."""
    corpus = build_corpus(n_events, dim, share)
    root = scratch_dir("current")
    tenant = Tenant.open("bench", root / "bench", embedding_dim=dim)
    try:
        load_secs = load(tenant, corpus)
        result = measure(tenant, queries(corpus, n_queries, dim), warmup=min(20, n_queries // 5))
    finally:
        tenant.close()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "events": len(corpus.events),
        "facts": corpus.facts,
        "superseded_facts": corpus.superseded,
        "superseded_share": round(corpus.superseded / corpus.facts, 3),
        "dim": dim,
        "queries": n_queries,
        "rounds_measured": ROUNDS,
        "query": "fused (text + embedding), kind=fact, k=10",
        "load_secs": round(load_secs, 1),
        **result,
        "bound": BOUND,
        "within_bound": result["p50_ratio"] <= BOUND,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print its JSON and write it to bench/out; exit 1 past the bound."""
    args = parse_args(__doc__.splitlines()[0], argv)
    events, n_queries = (QUICK_EVENTS, QUICK_QUERIES) if args.quick else (EVENTS, QUERIES)
    result = run(events, n_queries, DIM, SUPERSEDED_SHARE)
    path = write_json("current", result, args.out)
    print(json.dumps(result, indent=2))
    print(f"written to {path}", file=sys.stderr)
    return 0 if result["within_bound"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The keyword search at a million events without building a whole tenant: a keyword index alone
of bench/recall.py's first N events (the same texts, from the same seed, seqs 1..N, committed
every 10,000), then every LoCoMo question searched at k 10 (KeywordIndex's search of the
committed index, seqs read) with main's tie chain (21, 42, 84, ... up to limit + 1,024, written
out here as it stood) and with this checkout's, passes interleaved; CPU time of this thread per
search, and whether the two give the same hits.

    python bench/keyword_ties.py --events 1000000 --dir /work/cache/kw-1M
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import recall as rb  # bench/recall.py
from common import write_json

from storage.index import keyword as kwm
from storage.index.keyword import KeywordDoc, KeywordIndex

LIMIT = 10
COMMIT_EVERY = 10_000


def build(path: Path, n: int) -> float:
    """The keyword index of bench/recall.py's first n events; seconds taken."""
    corpus = rb.load_corpus()
    a = np.random.default_rng(rb.SEED).integers(0, len(corpus.texts), n)  # make_events' texts
    started = time.perf_counter()
    kw = KeywordIndex.create_empty(path)
    for lo in range(0, n, COMMIT_EVERY):
        kw.add(
            KeywordDoc(f"e{i}", "turn", corpus.texts[a[i]], {}, i + 1)
            for i in range(lo, min(n, lo + COMMIT_EVERY))
        )
        kw.commit()
    kw.close()
    return time.perf_counter() - started


def main_chain(view: kwm.View, words: list[str]) -> list[int]:
    """The search as main had it before this change (storage/index/keyword.py, _search)."""
    searcher = view.searcher
    query = view.query(words, None, None)
    hits = searcher.search(query, 2 * LIMIT + 1, count=False).hits
    while len(hits) > LIMIT and hits[-1][0] == hits[LIMIT - 1][0] and len(hits) < LIMIT + 1024:
        more = searcher.search(query, min(2 * len(hits), LIMIT + 1024), count=False).hits
        if len(more) == len(hits):
            break
        hits = more
    return kwm.Ranked(searcher, hits, limit=LIMIT).seqs


def measure(path: Path, rounds: int) -> dict[str, Any]:
    """CPU ms per search, p50/p99 over every question, medians over rounds."""
    kw = KeywordIndex.open(path)
    view, ties = kw._view, kwm.Ties()
    questions = [w for w in map(kwm.query_terms, rb.load_corpus().q_texts) if w]
    ways = {
        "main": lambda w: main_chain(view, w),
        "new": lambda w: kwm._search(view, w, LIMIT, None, None, ties).seqs,
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in ways}
    for n in range(rounds):
        for name in sorted(ways, reverse=n % 2 == 1):
            took = []
            for words in questions:
                start = time.thread_time()
                ways[name](words)
                took.append(time.thread_time() - start)
            runs[name].append(
                {
                    p: float(np.percentile(took, q)) * 1000
                    for p, q in (("p50_ms", 50), ("p99_ms", 99))
                }
            )
    same = sum(main_chain(view, w) == ways["new"](w) for w in questions)
    shallow = view.query
    tied = sum(
        1
        for w in questions
        if (h := view.searcher.search(shallow(w, None, None), 2 * LIMIT + 1, count=False).hits)
        and len(h) > LIMIT
        and h[-1][0] == h[LIMIT - 1][0]
    )
    kw.close()
    out: dict[str, Any] = {
        name: {k: round(float(np.median([r[k] for r in rs])), 3) for k in ("p50_ms", "p99_ms")}
        for name, rs in runs.items()
    }
    out.update(questions=len(questions), same_hits=same, cut_tied_after_21=tied)
    return out


def main(argv: list[str] | None = None) -> int:
    """Build the index if it is missing, measure, write bench/out/keyword_ties.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, required=True, help="the index (built if missing)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="bench/out/keyword_ties.json")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"events": args.events}
    if not (args.dir / "meta.json").exists():
        result["build_s"] = round(build(args.dir, args.events), 1)
    result.update(measure(args.dir, args.rounds))
    print(json.dumps(result))
    write_json("keyword_ties", result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

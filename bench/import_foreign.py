"""Import speed from other servers' files (issue 37): memories per second, text only, into an
empty tenant, for each of AutoMem, Mem0 and Zep/Graphiti.

- The files: made here with a fixed seed, as tests/support/foreign_files.py builds them from each
  source's schema, N memories each (20,000; 2,000 with --quick), 18 words of text:
  - automem: a FalkorDB backup (gzipped JSON); a quarter of the memories invalidated by the next
    one (INVALIDATED_BY), one RELATES_TO per ten memories;
  - mem0: get_all with history; a quarter of the memories with an ADD and two UPDATE rows (three
    versions, so more events than memories), one memory in fifty deleted;
  - zep: N/2 episodes and N/2 entity edges, each edge from one episode, one in ten expired.
- **foreign**: `memspine-admin import-from`'s path, the file's bytes to a closed tenant: convert
  (read, check, order) and land (memspine's export lines, loaded by storage/transfer/landing.py
  into a new data directory); memories of the file per second.
- **native** (baseline, same round): memspine's own import of the same events as an export file
  (`import_tenant` alone); events per second. The difference is what conversion costs.
- Each round makes both on fresh directories; the figures are the medians of the rounds.

Target: >= 2,000 memories/s for each format.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import parse_args, scratch_dir, write_json

from storage.transfer.foreign import convert, land
from storage.transfer.foreign.lines import DEFAULT_DIM, export_lines
from storage.transfer.landing import import_tenant

SEED = 37
WORDS = "billing invoice region cutover latency database cache session token deploy rollback "
WORDS += "customer refund parcel address schema index replica backup restore migration"
VOCAB = WORDS.split()


def sentence(rng: random.Random) -> str:
    """18 words of the vocabulary."""
    return " ".join(rng.choice(VOCAB) for _ in range(18))


def iso(i: int) -> str:
    """A time i minutes after 2025-01-01."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_735_689_600 + 60 * i))


def automem(n: int, rng: random.Random) -> bytes:
    """A FalkorDB backup of n memories."""
    nodes = [
        {
            "id": i,
            "labels": ["Memory"],
            "properties": {
                "id": f"am-{i}",
                "content": sentence(rng),
                "timestamp": iso(i),
                "type": rng.choice(["Decision", "Pattern", "Insight"]),
                "tags": ["bench", f"t{i % 7}"],
                "tag_prefixes": ["bench"],
                "importance": 0.5,
                "metadata": json.dumps({"n": i}),
            },
        }
        for i in range(n)
    ]
    rels = [
        {"source_id": i, "type": "INVALIDATED_BY", "target_id": i + 1, "properties": {}}
        for i in range(0, n - 1, 4)
    ]
    rels += [
        {"source_id": i, "type": "RELATES_TO", "target_id": i + 2, "properties": {"strength": 0.5}}
        for i in range(1, n - 2, 10)
    ]
    doc = {"timestamp": "20250601_120000", "graph_name": "memories", "nodes": nodes}
    return gzip.compress(json.dumps({**doc, "relationships": rels}).encode(), compresslevel=1)


def mem0(n: int, rng: random.Random) -> bytes:
    """get_all of n memories with their history."""
    results: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    for i in range(n):
        mid = f"m0-{i}"
        if i % 50 == 49:  # deleted: its rows only
            history += [
                {"id": f"h{i}a", "memory_id": mid, "new_memory": "x", "event": "ADD"},
                {"id": f"h{i}d", "memory_id": mid, "old_memory": "x", "event": "DELETE"},
            ]
            continue
        text = sentence(rng)
        item: dict[str, Any] = {"id": mid, "memory": text, "hash": "0" * 32, "user_id": "u1"}
        item |= {"created_at": iso(i), "updated_at": iso(i + 2)}
        if i % 4 == 0:
            versions = [sentence(rng), sentence(rng), text]
            item["history"] = [
                {
                    "id": f"h{i}{j}",
                    "memory_id": mid,
                    "new_memory": v,
                    "event": "UPDATE" if j else "ADD",
                    "updated_at": iso(i + j),
                }
                for j, v in enumerate(versions)
            ]
        results.append(item)
    return json.dumps({"results": results, "history": history}).encode()


def zep(n: int, rng: random.Random) -> bytes:
    """n/2 episodes and n/2 entity edges."""
    half = n // 2
    episodes = [
        {
            "uuid": f"ep-{i}",
            "name": f"m{i}",
            "group_id": "g",
            "source": "message",
            "content": sentence(rng),
            "valid_at": iso(i),
            "created_at": iso(i),
        }
        for i in range(half)
    ]
    edges = [
        {
            "uuid": f"ed-{i}",
            "group_id": "g",
            "source_node_uuid": f"n{i % 100}",
            "target_node_uuid": f"n{(i + 1) % 100}",
            "created_at": iso(i),
            "name": "RELATES_TO",
            "fact": sentence(rng),
            "episodes": [f"ep-{i}"],
            "valid_at": iso(i),
            "invalid_at": None,
            "expired_at": iso(i + 5) if i % 10 == 0 else None,
        }
        for i in range(n - half)
    ]
    return json.dumps({"episodes": episodes, "edges": edges}).encode()


FILES = {"automem": automem, "mem0": mem0, "zep": zep}


def one_round(source: str, raw: bytes, n: int, work: Path) -> dict[str, float]:
    """The foreign import and the native baseline, each into a new data directory."""
    started = time.perf_counter()
    conv = convert(source, raw)
    converted = time.perf_counter()
    stats = land(work / "foreign", "t", conv)
    done = time.perf_counter()
    assert stats.events == len(conv.records)
    native = io.BytesIO(b"".join(export_lines(conv, "t", DEFAULT_DIM)))
    t0 = time.perf_counter()
    import_tenant(work / "native", "t", native)
    native_s = time.perf_counter() - t0
    shutil.rmtree(work / "foreign")
    shutil.rmtree(work / "native")
    return {
        "memories_per_s": n / (done - started),
        "events": len(conv.records),
        "convert_s": converted - started,
        "land_s": done - converted,
        "native_events_per_s": len(conv.records) / native_s,
        "foreign_events_per_s": len(conv.records) / (done - started),
    }


def main() -> None:
    """Every source, each round, then the JSON."""
    args = parse_args(__doc__ or "")
    n = 2_000 if args.quick else 20_000
    rounds = 1 if args.quick else 3
    work = scratch_dir("import-foreign")
    out: dict[str, Any] = {"memories": n, "rounds": rounds, "seed": SEED, "sources": {}}
    try:
        for source, make in FILES.items():
            raw = make(n, random.Random(SEED))
            runs = [one_round(source, raw, n, work) for _ in range(rounds)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            out["sources"][source] = {"file_bytes": len(raw), "median": med, "runs": runs}
            print(
                f"{source}: {med['memories_per_s']:.0f} memories/s ({int(med['events'])} events; "
                f"convert {med['convert_s']:.2f} s, land {med['land_s']:.2f} s); native import "
                f"{med['native_events_per_s']:.0f} events/s, foreign {med['foreign_events_per_s']:.0f}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(write_json("import_foreign", out, args.out))


if __name__ == "__main__":
    main()

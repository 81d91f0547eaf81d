"""Erasure by subject against a single-event purge, paired in one tenant (issue 31).

- One tenant of 100,000 events (--quick: 10,000), built in process in batches of 1,000: 18
  words of text, a 32-float embedding, two filterable properties; ROUNDS subjects are each
  tagged on 1,000 of its events (--quick: 100), none shared.
- Each round, on the same tenant: a single untagged event is deleted and the tenant purged
  (the baseline), then one subject is erased the way POST .../erase does it (its events and
  their derived ones deleted in one write on the writer, `submit_delete_found`, then one
  purge). Reported: each one's seconds, the ratio per round and its median. Target: the
  subject's erasure within 1.5x the single purge.
- Then the dry run's identifier search over the whole tenant (storage/read/subjects.py's one
  pass over every record's text and properties), SEARCHES times: its p50, paired round by
  round with the pass it replaced (every record decoded whole less its embedding, then the
  same test): both must find the same ids. Target: 50 ms at 100,000 events.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import parse_args, percentile, scratch_dir, write_json

from storage.log.reader import LogReader
from storage.model import NewEvent
from storage.read import subjects
from storage.read.subjects import Reach, doomed, reach
from storage.tenants.tenant import Tenant

DIM = 32
BATCH = 1000
SEED = 20261207
ROUNDS = 3
SEARCHES = 5
WORDS = [f"w{i:04d}" for i in range(4000)] + ["order", "parcel", "carrier", "refund", "street"]


def build(t: Tenant, n: int, tagged: int) -> None:
    """Append n events; subject s-<r> is tagged on `tagged` of them for each round r."""
    rng, words = np.random.default_rng(SEED), random.Random(SEED)
    for lo in range(0, n, BATCH):
        size = min(BATCH, n - lo)
        vectors = rng.standard_normal((size, DIM), dtype=np.float32)
        batch = []
        for i, row in enumerate(vectors):
            k = lo + i
            subject = k // tagged if k < tagged * ROUNDS else None
            batch.append(
                NewEvent(
                    kind="turn",
                    ts=1_791_208_939_000_000 + k * 1000,
                    text=" ".join(words.choice(WORDS) for _ in range(18)),
                    embedding=row.tolist(),
                    properties_raw=msgspec.json.encode({"speaker": "agent", "n": k}),
                    subjects=(f"s-{subject}",) if subject is not None else (),
                )
            )
        t.submit_append(batch).result()


def previous_scan(rd: LogReader, identifiers: tuple[str, ...]) -> list[str]:
    """The pass the search replaced: each record decoded whole less its embedding."""
    wanted = [(i.casefold(), frozenset(subjects._WORD.findall(i.casefold()))) for i in identifiers]
    hits = [
        e
        for e in rd.live_light()
        if subjects._names(subjects._hay(e.text, e.properties_raw).casefold(), wanted)
    ]
    return [e.event_id for e in sorted(hits, key=lambda e: (e.ts, e.event_id))]


def main() -> None:
    """Build, run the rounds and the searches, write the JSON."""
    args = parse_args(__doc__ or "")
    n, tagged = (10_000, 100) if args.quick else (100_000, 1000)
    root = scratch_dir("subject-erase")
    t = Tenant.open("t", root / "t", embedding_dim=DIM)
    started = time.perf_counter()
    build(t, n, tagged)
    t.save_vectors()
    built = time.perf_counter() - started
    rounds = []
    for r in range(ROUNDS):
        victim = t.snapshot_read(
            lambda rd: next(rd.newest_first(None, None, None)).event_id
        )  # untagged
        t0 = time.perf_counter()
        t.submit_delete([victim]).result()
        t.purge()
        single = time.perf_counter() - t0
        q = Reach(subject=f"s-{r}")
        t0 = time.perf_counter()
        gone = t.submit_delete_found(lambda rd, q=q: doomed(rd, q)).result()  # type: ignore[misc]
        t.purge()
        subject = time.perf_counter() - t0
        assert len(gone) == tagged, len(gone)
        rounds.append({"single_s": single, "subject_s": subject, "ratio": subject / single})
        print(f"round {r}: single {single:.2f} s, subject ({tagged}) {subject:.2f} s", flush=True)
    searches, scans = [], []
    q = Reach(subject="nobody", identifiers=("Zelda Quarrington", "ORD-77123"))
    for _ in range(SEARCHES):
        t0 = time.perf_counter()
        found = t.snapshot_read(lambda rd: reach(rd, q))
        searches.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        before = t.snapshot_read(lambda rd: previous_scan(rd, q.identifiers))
        scans.append((time.perf_counter() - t0) * 1000)
        assert [f.event_id for f in found] == before, (len(found), len(before))
    t.close()
    out = {
        "events": n,
        "tagged_per_subject": tagged,
        "build_s": built,
        "rounds": rounds,
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
        "identifier_search_ms_p50": percentile(searches, 50),
        "identifier_search_ms": searches,
        "previous_scan_ms_p50": percentile(scans, 50),
        "previous_scan_ms": scans,
    }
    print(write_json("subject_erase", out, args.out))


if __name__ == "__main__":
    main()

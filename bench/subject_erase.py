"""Erasure by subject against a single-event purge, paired, through the server's engine
(issue 31), with another tenant's recall timed meanwhile.

- A template data directory, built once and kept under bench/out/tmp/: tenant `t`, 100,000
  events (--quick: 10,000) appended in batches of 1,000 (18 words of text, a 32-float embedding,
  two filterable properties); ROUNDS subjects each tagged on 1,000 of its events (--quick: 100);
  PLANTED events name "Zelda Quarrington" in their text and PLANTED others "ORD-77123" in a
  property. Tenant `v`, the neighbour: 10,000 such events, nothing tagged.
- One copy of the template per run. Each round, on tenant `t`, two sides, their order alternating
  with the round: (a) one untagged event deleted (`Engine.delete`) and the tenant purged
  (`Engine.purge`), timed whole; (b) subject s-<round> erased as POST .../erase does it
  (`memspine.subjects.erase`: the dry run, one delete, one purge, the scan, the signed receipt
  kept), timed whole. Beside each side a task on the same event loop recalls tenant `v` without
  pause (`Engine.recall`, text and vector): the p99 of its recalls in the 15 s before the side
  (quiet, after 5 s of recalls not counted) and during it.
- Then the dry run's identifier search (`memspine.subjects.dry_run` with the two identifiers:
  the keyword index's WORDS field, the candidates confirmed against their records) SEARCHES
  times, each paired with the pass over every record it replaced (`matching_by_pass`, same
  snapshot); both must find the same ids.

Targets: the subject's erasure within 1.5x the single purge (median of the rounds' ratios);
the neighbour's recall p99 during the erasure within 1.2x its quiet p99; the identifier search
p50 at most 50 ms at 100,000 events.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import OUT, parse_args, percentile, write_json

from memspine.config import load_settings
from memspine.engine import Engine
from memspine.subjects import Asker, dry_run, erase
from storage.model import NewEvent
from storage.read.recall import RecallQuery
from storage.read.subjects import Reach, matching_by_pass
from storage.tenants.tenant import Tenant

DIM = 32
BATCH = 1000
SEED = 20261207
ROUNDS = 3
SEARCHES = 7
PLANTED = 20
QUIET_S = 15.0  # a short window's p99 is its worst recall or two: it read above the long one's
# Recalls not counted before the quiet window: right after the other side's purge (its copy
# of the tenant through the page cache) the first recalls read above those during a side.
WARM_S = 5.0
NEIGHBOUR_EVENTS = 10_000
WORDS = [f"w{i:04d}" for i in range(4000)] + ["order", "parcel", "carrier", "refund", "street"]
IDENTIFIERS = ("Zelda Quarrington", "ORD-77123")
VERSION = 2  # of the template: a change of what build() makes, or of the keyword schema


def build(t: Tenant, n: int, tagged: int, subjects: int, seed: int) -> None:
    """Append n events; subject s-<r> is tagged on `tagged` of them for r < subjects, and the
    identifiers are planted in PLANTED events each (spread over the tenant)."""
    rng, words = np.random.default_rng(seed), random.Random(seed)
    planted = {n // 2 + 997 * i: i % 2 for i in range(2 * PLANTED)} if subjects else {}
    for lo in range(0, n, BATCH):
        size = min(BATCH, n - lo)
        vectors = rng.standard_normal((size, DIM), dtype=np.float32)
        batch = []
        for i, row in enumerate(vectors):
            k = lo + i
            subject = k // tagged if k < tagged * subjects else None
            text = " ".join(words.choice(WORDS) for _ in range(18))
            props: dict[str, Any] = {"speaker": "agent", "n": k}
            if planted.get(k) == 0:
                text += " Zelda Quarrington called"
            elif planted.get(k) == 1:
                props["order_no"] = "ORD-77123"
            batch.append(
                NewEvent(
                    kind="turn",
                    ts=1_791_208_939_000_000 + k * 1000,
                    text=text,
                    embedding=row.tolist(),
                    properties_raw=msgspec.json.encode(props),
                    subjects=(f"s-{subject}",) if subject is not None else (),
                )
            )
        t.submit_append(batch).result()


def template(n: int, tagged: int) -> tuple[Path, float | None]:
    """The data directory holding both tenants; seconds spent building it, or None."""
    root = OUT / "tmp" / f"subject-erase-v{VERSION}-{n}"
    if (root / "BUILT").exists():
        return root / "data", None
    shutil.rmtree(root, ignore_errors=True)
    started = time.perf_counter()
    for name, count, subjects in (("t", n, ROUNDS), ("v", NEIGHBOUR_EVENTS, 0)):
        t = Tenant.open(name, root / "data" / name, embedding_dim=DIM)
        build(t, count, tagged, subjects, SEED + len(name) + subjects)
        t.close()
    (root / "BUILT").write_text(str(n))
    return root / "data", time.perf_counter() - started


async def recalls(engine: Engine, stop: asyncio.Event, out: list[float]) -> None:
    """Recall the neighbour by text and vector until stopped; each recall's seconds."""
    words, rng = random.Random(1), np.random.default_rng(1)
    while not stop.is_set():
        query = RecallQuery(
            text=f"{words.choice(WORDS)} {words.choice(WORDS)}",
            embedding=rng.standard_normal(DIM).tolist(),
            k=10,
        )
        started = time.perf_counter()
        await engine.recall("v", query)
        out.append(time.perf_counter() - started)
        await asyncio.sleep(0)


async def beside_recalls(engine: Engine, work: Any) -> tuple[float, float, float]:
    """The neighbour's recall p99 (ms) alone for QUIET_S after WARM_S of recalls not counted,
    then during work; work's seconds."""
    warm: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(recalls(engine, stop, warm))
    await asyncio.sleep(WARM_S)
    stop.set()
    await task
    quiet: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(recalls(engine, stop, quiet))
    await asyncio.sleep(QUIET_S)
    stop.set()
    await task
    during: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(recalls(engine, stop, during))
    started = time.perf_counter()
    await work
    seconds = time.perf_counter() - started
    stop.set()
    await task
    return percentile(quiet, 99) * 1000, percentile(during, 99) * 1000, seconds


async def single(engine: Engine) -> int:
    """One untagged event deleted and the tenant purged."""
    victim = await engine.read(
        "t", lambda t: t.snapshot_read(lambda r: next(r.newest_first(None, None, None)).event_id)
    )
    await engine.delete("t", [victim])
    return (await engine.purge("t")).purged


async def subject(engine: Engine, r: int) -> int:
    """Subject s-<r> erased as the route does it."""
    erased = await erase(engine, "t", Reach(subject=f"s-{r}"), Asker(key_id="bench"))
    assert erased.receipt.receipt.clean, erased.receipt.receipt
    return len(erased.deleted_ids)


async def searches(engine: Engine) -> tuple[list[float], list[float], int]:
    """The dry run's identifier search and the pass it replaced, paired; ms each, and hits."""
    q = Reach(subject="nobody", identifiers=IDENTIFIERS)
    fast, slow, found = [], [], 0
    for _ in range(SEARCHES):
        started = time.perf_counter()
        got = await dry_run(engine, "t", q)
        fast.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        want = await engine.read(
            "t", lambda t: t.snapshot_read(lambda r: matching_by_pass(r, q.identifiers))
        )
        slow.append((time.perf_counter() - started) * 1000)
        assert sorted(e.event_id for e in got.events) == sorted(want), (got.count, len(want))
        found = got.count
    return fast, slow, found


async def run(data: Path, tagged: int) -> dict[str, Any]:
    """The rounds, then the searches."""
    engine = Engine(
        load_settings({"MEMSPINE_DATA_DIR": str(data), "MEMSPINE_EMBEDDING_DIM": str(DIM)})
    )
    try:
        await engine.read("t", lambda t: t.last_seq())  # both tenants open before the clock
        await engine.read("v", lambda t: t.last_seq())
        rounds = []
        for r in range(ROUNDS):
            sides: dict[str, Any] = {}
            for side in ("single", "subject") if r % 2 == 0 else ("subject", "single"):
                work = single(engine) if side == "single" else subject(engine, r)
                quiet, during, seconds = await beside_recalls(engine, work)
                sides[side] = {"s": seconds, "quiet_p99_ms": quiet, "during_p99_ms": during}
            one = {
                **sides,
                "ratio": sides["subject"]["s"] / sides["single"]["s"],
                "neighbour_p99_ratio": sides["subject"]["during_p99_ms"]
                / sides["subject"]["quiet_p99_ms"],
                "load": os.getloadavg()[0],
            }
            rounds.append(one)
            print(f"round {r}: {one}", flush=True)
        fast, slow, found = await searches(engine)
    finally:
        engine.close()
    return {
        "tagged_per_subject": tagged,
        "rounds": rounds,
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
        "median_neighbour_p99_ratio": statistics.median(r["neighbour_p99_ratio"] for r in rounds),
        "identifier_search_ms_p50": percentile(fast, 50),
        "identifier_search_ms": fast,
        "identifier_hits": found,
        "pass_ms_p50": percentile(slow, 50),
        "pass_ms": slow,
        "load_after": os.getloadavg(),
    }


def main() -> None:
    """Build or reuse the template, copy it, measure, write the JSON."""
    args = parse_args(__doc__ or "")
    n, tagged = (10_000, 100) if args.quick else (100_000, 1000)
    source, built = template(n, tagged)
    load_before = os.getloadavg()
    copy = OUT / "tmp" / "subject-erase-run"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(source, copy)
    try:
        out = asyncio.run(run(copy, tagged))
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    out = {"events": n, "build_s": built, "load_before": load_before, **out}
    print(write_json("subject_erase", out, args.out))


if __name__ == "__main__":
    main()

"""A retention run against one purge of the same tenant, and the tenant's recall meanwhile.

- A tenant of 100,000 events (18 words of text each, no vectors: the purge's share of a run is
  then at its smallest, so the run's own cost weighs most in the ratio), 10 % of them older
  than the window of their kind ("turn": 30 days), built once through `Tenant.submit_append` in
  batches of 1,000 and kept as a template under bench/out/tmp/.
- Each round, paired on copies of the same template: (a) a retention run through the server's
  engine (`memspine.retention.Retention.run`: the due events selected and deleted in batches of
  500, then the purge), timed whole, while a task on the same event loop recalls the tenant by
  text (`Engine.recall`) without pause and times each recall; (b) on the other copy, the same
  ids deleted in one job, then one `Tenant.purge()`, timed alone.
- Reported: medians over the rounds of the run's seconds, the purge's seconds and their ratio,
  and the p99 of the recalls that ran during the run beside the p99 of recalls with no run.

Targets (issue 33): the run's total time at most 1.5 times one purge of that tenant; the
tenant's own recall p99 during the run at most 50 ms.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import OUT, parse_args, percentile, write_json

from memspine.config import load_settings
from memspine.engine import Engine
from memspine.retention import Retention
from storage.model import NewEvent
from storage.read.recall import RecallQuery
from storage.read.retention import DAY_US, Policy
from storage.tenants.tenant import Tenant

TENANT = "bench-retention"
NOW = 1_791_208_939_000_000
BATCH = 1000
SEED = 20261207
WORDS = [f"w{i:04d}" for i in range(4000)] + ["order", "parcel", "carrier", "refund", "street"]
POLICY = Policy({"turn": 30})


def events(words: random.Random, lo: int, n: int, due_every: int) -> list[NewEvent]:
    """N events numbered from lo; one in `due_every` is 40 days old, the rest 1 day."""
    return [
        NewEvent(
            kind="turn",
            ts=NOW - (40 if (lo + i) % due_every == 0 else 1) * DAY_US + (lo + i),
            text=" ".join(words.choice(WORDS) for _ in range(18)),
        )
        for i in range(n)
    ]


def template(n: int) -> tuple[Path, float | None]:
    """The data directory holding the built tenant; seconds spent building it, or None."""
    root = OUT / "tmp" / f"retention-template-{n}"
    if (root / "BUILT").exists():
        return root / "data", None
    shutil.rmtree(root, ignore_errors=True)
    started = time.perf_counter()
    words = random.Random(SEED)
    tenant = Tenant.open(TENANT, root / "data" / TENANT, embedding_dim=4)
    for lo in range(0, n, BATCH):
        tenant.submit_append(events(words, lo, min(BATCH, n - lo), 10)).result()
    tenant.close()
    (root / "BUILT").write_text(str(n))
    return root / "data", time.perf_counter() - started


async def recalls(engine: Engine, stop: asyncio.Event, out: list[float]) -> None:
    """Recall the tenant by text until stopped; each recall's seconds."""
    words = random.Random(1)
    while not stop.is_set():
        query = RecallQuery(text=f"{words.choice(WORDS)} {words.choice(WORDS)}", k=10)
        started = time.perf_counter()
        await engine.recall(TENANT, query)
        out.append(time.perf_counter() - started)
        await asyncio.sleep(0)


async def run_under_recall(data_dir: Path) -> dict[str, Any]:
    """One retention run with recalls beside it, and recalls alone before it."""
    engine = Engine(
        load_settings({"MEMSPINE_DATA_DIR": str(data_dir), "MEMSPINE_EMBEDDING_DIM": "4"})
    )
    retention = Retention(engine, lambda: None, clock=lambda: NOW)
    try:
        quiet: list[float] = []
        stop = asyncio.Event()
        task = asyncio.create_task(recalls(engine, stop, quiet))
        await asyncio.sleep(3.0)
        stop.set()
        await task
        during: list[float] = []
        stop = asyncio.Event()
        task = asyncio.create_task(recalls(engine, stop, during))
        started = time.perf_counter()
        receipt = await retention.run(TENANT, POLICY)
        seconds = time.perf_counter() - started
        stop.set()
        await task
    finally:
        engine.close()
    assert receipt is not None
    return {
        "run_s": round(seconds, 3),
        "deleted": receipt.deleted,
        "purged": receipt.purged,
        "recall_p99_quiet_ms": round(percentile(quiet, 99) * 1000, 2),
        "recall_p99_during_ms": round(percentile(during, 99) * 1000, 2),
        "recalls_during": len(during),
    }


def one_purge(data_dir: Path) -> dict[str, Any]:
    """The same events deleted in one job, then one purge, timed alone."""
    tenant = Tenant.open(TENANT, data_dir / TENANT, embedding_dim=4)
    try:
        cutoff = POLICY.cutoff("turn", NOW)
        assert cutoff is not None
        with tenant.log.reader() as r:
            due = list(r.ids_by_kind("turn", None, cutoff))
        tenant.submit_delete(due).result()
        started = time.perf_counter()
        stats = tenant.purge()
        return {"purge_s": round(time.perf_counter() - started, 3), "purged": stats.purged}
    finally:
        tenant.close()


def one_round(source: Path, seed: int) -> dict[str, Any]:
    """Both sides on fresh copies; the order alternates with the round."""
    copies = [OUT / "tmp" / f"retention-run-{side}" for side in ("a", "b")]
    for copy in copies:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(source, copy)
    result: dict[str, Any] = {}
    sides = [
        lambda: result.update(asyncio.run(run_under_recall(copies[0]))),
        lambda: result.update(one_purge(copies[1])),
    ]
    for side in sides if seed % 2 == 0 else reversed(sides):
        side()
    for copy in copies:
        shutil.rmtree(copy, ignore_errors=True)
    result["ratio"] = round(result["run_s"] / result["purge_s"], 2)
    print(result, flush=True)
    return result


def main() -> None:
    """Measure, print and write the JSON."""
    args = parse_args(__doc__.splitlines()[0])
    n, rounds = (10_000, 1) if args.quick else (100_000, 5)
    source, built = template(n)
    results = [one_round(source, seed) for seed in range(rounds)]
    summary = {
        "events": n,
        "due": n // 10,
        "rounds": rounds,
        "build_s": None if built is None else round(built, 1),
        "run_s_median": statistics.median(r["run_s"] for r in results),
        "purge_s_median": statistics.median(r["purge_s"] for r in results),
        "ratio_median": statistics.median(r["ratio"] for r in results),
        "recall_p99_quiet_ms_median": statistics.median(r["recall_p99_quiet_ms"] for r in results),
        "recall_p99_during_ms_median": statistics.median(
            r["recall_p99_during_ms"] for r in results
        ),
        "each": results,
    }
    print({k: v for k, v in summary.items() if k != "each"}, flush=True)
    write_json("retention", summary, args.out)


if __name__ == "__main__":
    main()

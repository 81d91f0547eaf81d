"""A retention run against one purge of the same tenant, and the tenant's recall meanwhile.

- A tenant of 100,000 events (18 words of text each, no vectors: the purge's share of a run is
  then at its smallest, so the run's own cost weighs most in the ratio), 10 % of them older
  than the window of their kind ("turn": 30 days), built once through `Tenant.submit_append` in
  batches of 1,000 and kept as a template under bench/out/tmp/.
- Each round, paired on copies of the same template, each side through the server's engine
  while a task on the same event loop recalls the tenant by text (`Engine.recall`) without
  pause and times each recall: (a) a retention run (`memspine.retention.Retention.run`: the due
  events selected and deleted in batches of 500, then the purge), timed whole; (b) on the other
  copy, the same ids deleted in one job (`Engine.delete`), then one purge (`Engine.purge`), the
  purge timed. The order of the sides alternates with the round.
- Reported: medians over the rounds of the run's seconds, the purge's seconds and their ratio,
  and on each side the p99 of the recalls that ran during it beside the p99 with nothing else.

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


async def under_recall(data_dir: Path, side: str) -> dict[str, Any]:
    """Recalls alone for 3 s, then one side (the run, or the delete and the purge) with recalls
    beside it."""
    engine = Engine(
        load_settings({"MEMSPINE_DATA_DIR": str(data_dir), "MEMSPINE_EMBEDDING_DIM": "4"})
    )
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
        work = retention_run(engine) if side == "run" else delete_then_purge(engine)
        figures = await work
        stop.set()
        await task
    finally:
        engine.close()
    return figures | {
        f"recall_p99_quiet_ms_{side}": round(percentile(quiet, 99) * 1000, 2),
        f"recall_p99_during_ms_{side}": round(percentile(during, 99) * 1000, 2),
    }


async def retention_run(engine: Engine) -> dict[str, Any]:
    """One retention run, timed whole."""
    retention = Retention(engine, lambda: None, clock=lambda: NOW)
    started = time.perf_counter()
    receipt = await retention.run(TENANT, POLICY)
    seconds = time.perf_counter() - started
    assert receipt is not None
    return {"run_s": round(seconds, 3), "deleted": receipt.deleted, "purged": receipt.purged}


async def delete_then_purge(engine: Engine) -> dict[str, Any]:
    """The same events deleted in one job, then one purge, the purge timed."""
    cutoff = POLICY.cutoff("turn", NOW)
    assert cutoff is not None
    due = await engine.read(
        TENANT, lambda t: t.snapshot_read(lambda r: list(r.ids_by_kind("turn", None, cutoff)))
    )
    await engine.delete(TENANT, due)
    started = time.perf_counter()
    stats = await engine.purge(TENANT)
    return {"purge_s": round(time.perf_counter() - started, 3), "purge_purged": stats.purged}


def one_round(source: Path, seed: int) -> dict[str, Any]:
    """Both sides on fresh copies; the order alternates with the round."""
    copies = {side: OUT / "tmp" / f"retention-{side}" for side in ("run", "purge")}
    for copy in copies.values():
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(source, copy)
    result: dict[str, Any] = {}
    order = ["run", "purge"] if seed % 2 == 0 else ["purge", "run"]
    for side in order:
        result.update(asyncio.run(under_recall(copies[side], side)))
    for copy in copies.values():
        shutil.rmtree(copy, ignore_errors=True)
    result["ratio"] = round(result["run_s"] / result["purge_s"], 2)
    print(result, flush=True)
    return result


RECALLS = (
    "recall_p99_quiet_ms_run",
    "recall_p99_during_ms_run",
    "recall_p99_quiet_ms_purge",
    "recall_p99_during_ms_purge",
)


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
        **{f"{name}_median": statistics.median(r[name] for r in results) for name in RECALLS},
        "each": results,
    }
    print({k: v for k, v in summary.items() if k != "each"}, flush=True)
    write_json("retention", summary, args.out)


if __name__ == "__main__":
    main()

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
  (quiet, after 5 s of recalls not counted), in 15 s more with a lease on t held (quiet held:
  the recalls then take a read thread, as during the side, not the event loop's short path),
  and during it.
- Then the dry run's identifier search (`memspine.subjects.dry_run` with the two identifiers:
  the keyword index's WORDS field, the candidates confirmed against their records) SEARCHES
  times, each paired with the pass over every record it replaced (`matching_by_pass`, same
  snapshot); both must find the same ids.

- Each side also marks where the erasure is (its dry run, delete, each purge step, the scan, the
  signature: wrappers around what memspine.subjects.erase calls, and the purge's step hook),
  and the neighbour's recalls during it are counted by the step under way as each ended.
- `--base DIR [--new DIR]`: each round runs twice, once with DIR's memspine/ and storage/ (a
  `git archive` of main, say) and once with this checkout's (or --new's), alternating which
  goes first, each a process of its own on a fresh copy of the template: a pairing in one run.
  `--events N` sizes tenant t (N/100 tagged per subject), `--rounds R`.

Targets: the subject's erasure within 1.5x the single purge (median of the rounds' ratios);
the neighbour's recall p99 during the erasure within 1.2x its quiet p99; the identifier search
p50 at most 50 ms at 100,000 events.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The checkout whose memspine/ and storage/ run: --code DIR (a worker of --base), else this one.
sys.path.insert(
    0,
    sys.argv[sys.argv.index("--code") + 1]
    if "--code" in sys.argv
    else str(Path(__file__).resolve().parent.parent),
)
from common import OUT, percentile, write_json

import memspine.subjects as subjects_module
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


class Phases:
    """Where the erasure (or the single purge) is: its steps' start times, marked by wrappers
    around the functions memspine.subjects.erase calls and the purge's step hook."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, str]] = []

    def mark(self, name: str) -> None:
        """A step begins now."""
        self.marks.append((time.perf_counter(), name))

    def at(self, t: float) -> str:
        """The step under way at t."""
        name = "before"
        for when, step in self.marks:
            if when > t:
                break
            name = step
        return name

    def wrap(self, name: str, fn: Any) -> Any:
        """fn, marking `name` as it starts (sync or async)."""
        if asyncio.iscoroutinefunction(fn):

            async def marked_async(*a: Any, **k: Any) -> Any:
                self.mark(name)
                return await fn(*a, **k)

            return marked_async

        def marked(*a: Any, **k: Any) -> Any:
            self.mark(name)
            return fn(*a, **k)

        return marked

    def install(self) -> None:
        """Wrap the steps of an erasure where memspine.subjects looks them up."""
        m = subjects_module
        for attr, name in (
            ("dry_run", "dry_run"),
            ("check_room", "check_room"),
            ("files_holding", "scan:files"),
            ("log_holding", "scan:log"),
            ("tenant_holding", "scan"),
        ):
            if hasattr(m, attr):  # a checkout may name its steps otherwise
                setattr(m, attr, self.wrap(name, getattr(m, attr)))
        m.receipts.sign = self.wrap("sign", m.receipts.sign)  # type: ignore[method-assign]
        Tenant.submit_delete_found = self.wrap("delete", Tenant.submit_delete_found)  # type: ignore[method-assign]
        purge = Tenant.purge

        def purge_marked(t: Tenant, step: Any = None) -> Any:
            self.mark("purge:start")
            return purge(t, lambda stage: self.mark(f"purge:{stage}"))

        Tenant.purge = purge_marked  # type: ignore[method-assign]


PHASES = Phases()


def by_phase(during: list[tuple[float, float]], slow_ms: float) -> dict[str, dict[str, float]]:
    """The recalls during a side by the step under way as each ended: how many, their p99 and
    max (ms), and how many took over slow_ms."""
    groups: dict[str, list[float]] = {}
    for ended, seconds in during:
        groups.setdefault(PHASES.at(ended), []).append(seconds * 1000)
    return {
        name: {
            "n": len(ms),
            "p99_ms": percentile(ms, 99),
            "max_ms": max(ms),
            "slow": sum(m > slow_ms for m in ms),
            "ms_total": sum(ms),
        }
        for name, ms in groups.items()
    }


async def recalls(
    engine: Engine, stop: asyncio.Event, out: list[float], ends: list[tuple[float, float]]
) -> None:
    """Recall the neighbour by text and vector until stopped; each recall's seconds (and in
    ends, when each ended with its seconds)."""
    words, rng = random.Random(1), np.random.default_rng(1)
    while not stop.is_set():
        query = RecallQuery(
            text=f"{words.choice(WORDS)} {words.choice(WORDS)}",
            embedding=rng.standard_normal(DIM).tolist(),
            k=10,
        )
        started = time.perf_counter()
        await engine.recall("v", query)
        ended = time.perf_counter()
        out.append(ended - started)
        ends.append((ended, ended - started))
        await asyncio.sleep(0)


async def beside_recalls(
    engine: Engine, work: Any
) -> tuple[float, float, float, float, dict[str, dict[str, float]]]:
    """The neighbour's recall p99 (ms) alone for QUIET_S after WARM_S of recalls not counted,
    then alone with a lease on t held for QUIET_S, then during work; work's seconds; the
    recalls during it by the step under way."""
    warm: list[float] = []
    ends: list[tuple[float, float]] = []
    stop = asyncio.Event()
    task = asyncio.create_task(recalls(engine, stop, warm, []))
    await asyncio.sleep(WARM_S)
    stop.set()
    await task
    quiet: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(recalls(engine, stop, quiet, []))
    await asyncio.sleep(QUIET_S)
    stop.set()
    await task
    # Quiet again, with a request on tenant t under way (a lease held, as the erasure holds
    # one): the neighbour's recalls then take a read thread, as during the work, instead of
    # running on the event loop (Engine.read's short path, only when no other request holds a
    # tenant). This is the same path's quiet p99.
    held: list[float] = []
    async with engine.tenant("t", create=False):
        stop = asyncio.Event()
        task = asyncio.create_task(recalls(engine, stop, held, []))
        await asyncio.sleep(QUIET_S)
        stop.set()
        await task
    during: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(recalls(engine, stop, during, ends))
    PHASES.marks.clear()
    PHASES.mark("start")
    started = time.perf_counter()
    await work
    seconds = time.perf_counter() - started
    PHASES.mark("done")
    stop.set()
    await task
    quiet_p99 = percentile(quiet, 99) * 1000
    phases = by_phase(ends, 1.2 * quiet_p99)
    return quiet_p99, percentile(held, 99) * 1000, percentile(during, 99) * 1000, seconds, phases


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


async def one_round(engine: Engine, r: int) -> dict[str, Any]:
    """Both sides of round r, in the order the round says; subject s-<r mod ROUNDS>."""
    sides: dict[str, Any] = {}
    for side in ("single", "subject") if r % 2 == 0 else ("subject", "single"):
        work = single(engine) if side == "single" else subject(engine, r % ROUNDS)
        quiet, held, during, seconds, phases = await beside_recalls(engine, work)
        sides[side] = {
            "s": seconds,
            "quiet_p99_ms": quiet,
            "quiet_held_p99_ms": held,
            "during_p99_ms": during,
            "phases": phases,
            "steps": [(name, round(t - PHASES.marks[0][0], 3)) for t, name in PHASES.marks],
        }
    one = {
        **sides,
        "ratio": sides["subject"]["s"] / sides["single"]["s"],
        "neighbour_p99_ratio": sides["subject"]["during_p99_ms"] / sides["subject"]["quiet_p99_ms"],
        "neighbour_p99_ratio_held": sides["subject"]["during_p99_ms"]
        / sides["subject"]["quiet_held_p99_ms"],
        "load": os.getloadavg()[0],
    }
    print(f"round {r}: {summary(one)}", file=sys.stderr, flush=True)
    return one


def summary(one: dict[str, Any]) -> str:
    """A round in a few lines: the ratios, and the neighbour's recalls by step of the erasure."""
    lines = [
        f"ratio {one['ratio']:.2f} neighbour p99 {one['subject']['during_p99_ms']:.1f} / "
        f"{one['subject']['quiet_p99_ms']:.1f} ms = {one['neighbour_p99_ratio']:.2f} "
        f"(single: {one['single']['during_p99_ms']:.1f} / {one['single']['quiet_p99_ms']:.1f}) "
        f"quiet held {one['subject'].get('quiet_held_p99_ms', 0):.1f} ms "
        f"load {one['load']:.1f}"
    ]
    for side in ("subject", "single"):
        steps = dict(one[side]["steps"])
        for name, g in one[side]["phases"].items():
            lines.append(
                f"  {side:7} {name:22} at {steps.get(name, 0):7.2f} s  n {g['n']:5}  "
                f"p99 {g['p99_ms']:7.1f}  max {g['max_ms']:7.1f}  slow {g['slow']}"
            )
    return "\n".join(lines)


async def open_engine(data: Path) -> Engine:
    """An engine on data with both tenants open."""
    PHASES.install()
    engine = Engine(
        load_settings({"MEMSPINE_DATA_DIR": str(data), "MEMSPINE_EMBEDDING_DIM": str(DIM)})
    )
    await engine.read("t", lambda t: t.last_seq())  # both tenants open before the clock
    await engine.read("v", lambda t: t.last_seq())
    return engine


async def run(data: Path, tagged: int, rounds_wanted: int) -> dict[str, Any]:
    """The rounds, then the searches."""
    engine = await open_engine(data)
    try:
        rounds = [await one_round(engine, r) for r in range(rounds_wanted)]
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
    }


async def worker(data: Path, r: int) -> dict[str, Any]:
    """Round r alone on a fresh engine (a worker of --base)."""
    engine = await open_engine(data)
    try:
        return await one_round(engine, r)
    finally:
        engine.close()


def in_copy(source: Path, name: str, fn: Any) -> Any:
    """fn(a fresh copy of the template), the copy removed after."""
    copy = OUT / "tmp" / name
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(source, copy)
    try:
        return fn(copy)
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def paired(args: argparse.Namespace, n: int) -> dict[str, Any]:
    """Each round once with --base's code and once with this checkout's, alternating which goes
    first, each a worker process on its own copy of the template."""
    here = (args.new or Path(__file__).resolve().parent.parent).resolve()
    base = args.base.resolve()
    out: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
    for r in range(args.rounds):
        order = (("base", base), ("new", here)) if r % 2 == 0 else (("new", here), ("base", base))
        for label, code in order:
            argv = [sys.executable, __file__, "--code", str(code), "--round", str(r)]
            argv += ["--events", str(n)]
            done = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True)
            one = msgspec.json.decode(done.stdout.strip().splitlines()[-1])
            one["code"] = label
            out[label].append(one)
            print(f"round {r} {label}: {summary(one)}", flush=True)

    def med(label: str, key: str) -> float:
        return statistics.median(one[key] for one in out[label])

    return {
        "base_code": str(base),
        "new_code": str(here),
        **{
            f"{label}_median_{key}": med(label, key)
            for label in out
            for key in ("ratio", "neighbour_p99_ratio", "neighbour_p99_ratio_held")
        },
        **out,
    }


def main() -> None:
    """Build or reuse the template, copy it, measure, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="10,000 events, 100 per subject")
    parser.add_argument("--out", type=Path, default=None, help="JSON output")
    parser.add_argument("--events", type=int, default=None, help="events of tenant t")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument(
        "--base", type=Path, default=None, help="pair each round against this checkout (main)"
    )
    parser.add_argument(
        "--new", type=Path, default=None, help="with --base: the other checkout (default: this)"
    )
    parser.add_argument("--code", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = args.events or (10_000 if args.quick else 100_000)
    tagged = n // 100
    source, built = template(n, tagged)
    if args.round is not None:  # a worker: one round, its JSON on the last line of stdout
        one = in_copy(
            source, f"subject-erase-run-{os.getpid()}", lambda d: asyncio.run(worker(d, args.round))
        )
        sys.stdout.write(msgspec.json.encode(one).decode() + "\n")
        return
    load_before = os.getloadavg()
    if args.base is not None:
        out = paired(args, n)
    else:
        out = in_copy(
            source, "subject-erase-run", lambda d: asyncio.run(run(d, tagged, args.rounds))
        )
    out = {
        "events": n,
        "build_s": built,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        **out,
    }
    print(write_json("subject_erase", out, args.out))


if __name__ == "__main__":
    main()

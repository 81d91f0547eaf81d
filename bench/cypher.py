"""Benchmark: Cypher over 100,000 events of a purchasing agent's log, indexed against forced scans.

The tenant is built in process through `EventLog.append_batch` (Cypher reads only the log):
episodes of an instruction (a turn with actor, role and supplier), one to three lookups
(tool calls with effect `read`), usually a write (effect `write`, a change id, SOURCE_FROM its
instruction and lookups), sometimes a fact derived from the write, and the agent's reply;
suppliers drawn from a skewed (Zipf-like) distribution, so some are busy and most are quiet.

Queries, each run with fresh parameters every time:
- audit: the seed's "which actions on this supplier, on whose instruction", for the supplier of
  a randomly drawn write (so busy suppliers come up as often as an auditor would meet them);
- window: `n.ts >= $since AND n.ts < $until` over a two-hour window, counted by kind;
- kind_window: the tool calls in that window (`n.kind = $kind` and the range), which the planner
  serves from one walk of the (kind, ts, id) index;
- each of them forced to scan, by wrapping each property in an expression the planner cannot
  index (`a.supplier + ''`, `n.ts + 0`), to show what the index pays for. Both forms must give
  the same rows; the script checks it.

The headline bound (issue 5): p50 <= 5 ms for every indexed query; the script exits 1 past it.
Run: `.venv/bin/python bench/cypher.py [--quick] [--out FILE]`; writes bench/out/cypher.json.

`--base DIR` measures a second checkout (a directory holding storage/, e.g. `git archive main`)
in the same run, on the same log: each round runs in a fresh process per tree, the trees
alternating which goes first, so load from elsewhere falls on both alike; each query's CPU time
is reported beside its wall time. Each tree reads the same events from a log its own code
wrote (the two may differ in format). `--keep` reuses the logs a previous `--base` run built.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
# a round of --base runs in a process whose storage/ is the tree under test
sys.path.insert(
    0, os.environ.get("CYPHER_BENCH_TREE") or str(Path(__file__).resolve().parent.parent)
)
from common import OUT, machine, median, percentile, scratch_dir, write_json

from storage.cypher import plan, run
from storage.log.eventlog import EventLog
from storage.model import AppendResult, NewEvent

SEED = 20261006
EVENTS, QUICK_EVENTS = 100_000, 10_000
SUPPLIERS, QUICK_SUPPLIERS = 1_000, 100
RUNS, QUICK_RUNS = 300, 60  # indexed queries per round
SCAN_RUNS, QUICK_SCAN_RUNS = 7, 3  # forced scans per round (each reads every event)
ROUNDS = 3  # measurement rounds over one loaded tenant; headline figures are their medians
BATCH = 2_000
BOUND_MS = 5.0
T0 = 1_783_324_800_000_000  # 2026-07-06 00:00 UTC, in microseconds
DAY_US = 86_400 * 1_000_000
EVENTS_PER_DAY = 1_100  # 100,000 events cover about 90 days
WINDOW_US = 2 * 3_600 * 1_000_000

ROLES = ("ap_manager", "buyer", "quality", "controller")
LOOKUPS = ("get_supplier", "get_contract", "get_po", "get_inspection", "get_invoice")
WRITES = ("set_payment_terms", "release_po", "set_supplier_status", "approve_invoice")

AUDIT = (
    "MATCH (a:Event)-[:SOURCE_FROM]->(i:Event) "
    "WHERE a.supplier = $supplier AND a.effect = $effect AND i.kind = $kind "
    "RETURN a.change, a.tool, i.actor, i.role ORDER BY a.ts"
)
# every predicate wrapped, or the planner would start from i.kind or a.effect instead
AUDIT_SCAN = (
    AUDIT.replace("a.supplier =", "a.supplier + '' =")
    .replace("a.effect =", "a.effect + '' =")
    .replace("i.kind =", "i.kind + '' =")
)
WINDOW = "MATCH (n:Event) WHERE n.ts >= $since AND n.ts < $until RETURN n.kind, count(*)"
WINDOW_SCAN = WINDOW.replace("n.ts >=", "n.ts + 0 >=").replace("n.ts <", "n.ts + 0 <")
# the seed's listing (tool calls in a period) as Cypher: one walk of the (kind, ts, id) index
KIND_WINDOW = (
    "MATCH (n:Event) WHERE n.kind = $kind AND n.ts >= $since AND n.ts < $until "
    "RETURN n.effect, count(*)"
)
KIND_WINDOW_SCAN = (
    KIND_WINDOW.replace("n.kind =", "n.kind + '' =")
    .replace("n.ts >=", "n.ts + 0 >=")
    .replace("n.ts <", "n.ts + 0 <")
)


def _uuid(rng: np.random.Generator) -> str:
    """A version-4 UUID from the seeded generator, so ids (and plans' inputs) repeat run to run."""
    return str(uuid.UUID(bytes=rng.bytes(16), version=4))


class Corpus:
    """The events in append order, and what the queries draw their parameters from."""

    def __init__(self, n_events: int, n_suppliers: int) -> None:
        self.rng = np.random.default_rng(SEED)
        self.suppliers = [f"SUP-{2000 + i}" for i in range(n_suppliers)]
        weights = 1.0 / np.arange(1, n_suppliers + 1) ** 0.8
        self.weights = weights / weights.sum()
        self.actors = [(f"person.{i:02d}", ROLES[i % len(ROLES)]) for i in range(40)]
        self.events: list[NewEvent] = []
        self.write_suppliers: list[str] = []
        gap = DAY_US * 5 // EVENTS_PER_DAY  # about five events per episode
        ts = T0
        while len(self.events) < n_events:
            self.episode(ts)
            ts += int(self.rng.exponential(gap))
        del self.events[n_events:]

    def add(self, kind: str, ts: int, text: str, props: dict[str, Any], sources: list[str]) -> str:
        """Queue one event; its id."""
        event_id = _uuid(self.rng)
        if sources:
            props = {**props, "source_event_ids": sources}
        self.events.append(
            NewEvent(
                kind=kind,
                ts=ts,
                text=text,
                properties_raw=msgspec.json.encode(props),
                source_ids=tuple(sources),
                event_id=event_id,
            )
        )
        return event_id

    def episode(self, ts: int) -> None:
        """One instruction, its lookups, usually a write, sometimes a fact, and the reply."""
        rng = self.rng
        supplier = self.suppliers[int(rng.choice(len(self.suppliers), p=self.weights))]
        actor, role = self.actors[int(rng.integers(len(self.actors)))]
        conv = f"c-{len(self.events):07d}"
        asked = self.add(
            "turn", ts, f"{actor}: please look at {supplier} today",
            {"actor": actor, "role": role, "supplier": supplier, "conversation": conv}, [],
        )  # fmt: skip
        inputs = [asked]
        for k in range(int(rng.integers(1, 4))):
            tool = LOOKUPS[int(rng.integers(len(LOOKUPS)))]
            inputs.append(self.add(
                "tool_call", ts + (k + 1) * 7_000_000,
                f"{tool}({supplier}) -> ok, {int(rng.integers(10, 99))} lines",
                {"tool": tool, "supplier": supplier, "effect": "read",
                 "duration_ms": int(rng.integers(40, 600))}, [],
            ))  # fmt: skip
        last = inputs[-1]
        if rng.random() < 0.85:
            change = f"CHG-{100000 + len(self.write_suppliers)}"
            tool = WRITES[int(rng.integers(len(WRITES)))]
            write = self.add(
                "tool_call", ts + 40_000_000, f"{tool}({supplier}) -> ok, change {change}",
                {"tool": tool, "supplier": supplier, "effect": "write", "change": change}, inputs,
            )  # fmt: skip
            self.write_suppliers.append(supplier)
            if rng.random() < 0.4:
                self.add(
                    "fact", ts + 41_000_000, f"{supplier}: {tool} done as {change}",
                    {"topic": tool, "supplier": supplier}, [last, write],
                )  # fmt: skip
            last = write
        self.add(
            "turn", ts + 45_000_000, f"Agent: done for {supplier}",
            {"speaker": "agent", "conversation": conv}, [asked, last],
        )  # fmt: skip


def load(log: EventLog, corpus: Corpus) -> float:
    """Append the corpus in batches (one transaction each); seconds taken."""
    start = time.perf_counter()
    for i in range(0, len(corpus.events), BATCH):
        results = log.append_batch(corpus.events[i : i + BATCH])
        assert all(isinstance(r, AppendResult) for r in results), results[:1]
    return time.perf_counter() - start


Draw = Callable[[np.random.Generator], dict[str, Any]]
Matched = Callable[[list[list[Any]]], int]


class Query(NamedTuple):
    """An indexed query, the same forced to scan, how to draw parameters and count matches."""

    indexed: str
    scan: str
    draw: Draw
    matched: Matched


def queries(corpus: Corpus) -> dict[str, Query]:
    """The measured queries by name."""
    end = corpus.events[-1].ts

    def audit(rng: np.random.Generator) -> dict[str, Any]:
        supplier = corpus.write_suppliers[int(rng.integers(len(corpus.write_suppliers)))]
        return {"supplier": supplier, "effect": "write", "kind": "turn"}

    def window(rng: np.random.Generator) -> dict[str, Any]:
        since = int(rng.integers(T0, end - WINDOW_US))
        return {"since": since, "until": since + WINDOW_US, "kind": "tool_call"}

    def counted(rows: list[list[Any]]) -> int:
        return sum(row[-1] for row in rows)

    return {
        "audit": Query(AUDIT, AUDIT_SCAN, audit, len),
        "window": Query(WINDOW, WINDOW_SCAN, window, counted),
        "kind_window": Query(KIND_WINDOW, KIND_WINDOW_SCAN, window, counted),
    }


CPU: list[float] = []  # CPU ms of each timed() call, for the round's CPU figures


def timed(log: EventLog, query: str, params: dict[str, Any]) -> tuple[float, list[list[Any]]]:
    """One query in its own read transaction, as the route runs it: (ms, rows)."""
    start, cpu = time.perf_counter(), time.process_time()
    with log.reader() as reader:
        rows = run(reader, query, params, timeout_ms=600_000, max_rows=1_000_000).rows
    CPU.append((time.process_time() - cpu) * 1000)
    return (time.perf_counter() - start) * 1000, rows


def one_round(log: EventLog, qs: dict[str, Query], runs: int, scan_runs: int) -> dict[str, Any]:
    """Every query `runs` times (scans `scan_runs` times) with parameters from a fixed seed;
    indexed and scan forms get the same parameters and must give the same rows."""
    rng = np.random.default_rng(SEED + 1)
    out: dict[str, Any] = {}
    for name, q in qs.items():
        ms: list[float] = []
        cpu: list[float] = []
        scan_ms: list[float] = []
        matched: list[int] = []
        for i in range(runs):
            params = q.draw(rng)
            took, got = timed(log, q.indexed, params)
            ms.append(took)
            cpu.append(CPU[-1])
            matched.append(q.matched(got))
            if i < scan_runs:
                scan_took, scanned = timed(log, q.scan, params)
                assert scanned == got, f"{name}: the scan disagrees with the index"
                scan_ms.append(scan_took)
        out[name] = (
            _summary(ms)
            | {
                "cpu_p50_ms": round(percentile(cpu, 50), 3),
                "cpu_p99_ms": round(percentile(cpu, 99), 3),
            }
            | {"matched_median": median(matched), "matched_max": max(matched)}
            | _tail(ms, matched)
        )
        out[name + "_scan"] = _summary(scan_ms)
    return out


def _tail(ms: list[float], matched: list[int]) -> dict[str, float]:
    """What the slowest 1 % of runs have in common: the rows they matched, and the time per
    matched row there and in the rest (a tail of big answers costs what its rows cost)."""
    order = sorted(range(len(ms)), key=ms.__getitem__, reverse=True)
    slow = order[: max(1, len(ms) // 100)]
    rest = order[len(slow) :]

    def per_row(runs: list[int]) -> float:
        return sum(ms[i] for i in runs) * 1000 / max(1, sum(matched[i] for i in runs))

    return {
        "slowest_1pct_matched_median": median([matched[i] for i in slow]),
        "slowest_1pct_us_per_row": round(per_row(slow), 1),
        "rest_us_per_row": round(per_row(rest), 1) if rest else 0.0,
    }


def _summary(ms: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(ms, 50), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "runs": len(ms),
    }


def measure(log: EventLog, qs: dict[str, Query], runs: int, scan_runs: int) -> dict[str, Any]:
    """ROUNDS rounds; each figure is the median over the rounds."""
    for q in qs.values():  # plans cached, pages warm
        timed(log, q.indexed, q.draw(np.random.default_rng(0)))
    rounds = [one_round(log, qs, runs, scan_runs) for _ in range(ROUNDS)]
    return {
        name: {key: round(median([r[name][key] for r in rounds]), 3) for key in rounds[0][name]}
        for name in rounds[0]
    }


def parser_build_ms() -> float:
    """What the first query in a process would pay without warm(): lark building the parser."""
    from storage.cypher import parser

    parser._lark.cache_clear()
    plan.cache_clear()
    start = time.perf_counter()
    plan("RETURN 1")
    return round((time.perf_counter() - start) * 1000, 1)


class Drawn:
    """What queries() reads of a Corpus, saved beside a kept log so a round need not rebuild it."""

    def __init__(self, events_end: int, write_suppliers: list[str]) -> None:
        self.events = [NewEvent(kind="-", ts=events_end)]
        self.write_suppliers = write_suppliers


def build_log(log_dir: Path, quick: bool) -> None:
    """--build: the corpus's log in log_dir, written by this process's tree (each tree of a
    --base run reads a log in its own format: the format may differ between them)."""
    corpus = Corpus(*(QUICK_EVENTS, QUICK_SUPPLIERS) if quick else (EVENTS, SUPPLIERS))
    log = EventLog.open(log_dir, embedding_dim=4)
    try:
        load(log, corpus)
    finally:
        log.close()


def one_tree_round(log_dir: Path, tree: str) -> None:
    """--round: one round over a kept log, in this process's tree; the figures as JSON."""
    drawn = json.loads((log_dir / "drawn.json").read_text())
    qs = queries(Drawn(drawn["end"], drawn["write_suppliers"]))  # type: ignore[arg-type]
    log = EventLog.open(log_dir / tree / "log", embedding_dim=4)
    try:
        for q in qs.values():  # plans cached, pages warm
            timed(log, q.indexed, q.draw(np.random.default_rng(0)))
        print(json.dumps(one_round(log, qs, drawn["runs"], drawn["scan_runs"])))
    finally:
        log.close()


def paired(args: Any, base: Path) -> int:
    """Rounds of this tree and `base` alternating, each in its own process, on one kept log."""
    log_dir = OUT / "tmp" / ("cypher-keep-quick" if args.quick else "cypher-keep")
    runs, scan_runs = (QUICK_RUNS, QUICK_SCAN_RUNS) if args.quick else (RUNS, SCAN_RUNS)
    trees = {"base": base.resolve(), "new": Path(__file__).resolve().parent.parent}
    if not (args.keep and all((log_dir / name / "log").exists() for name in trees)):
        shutil.rmtree(log_dir, ignore_errors=True)
        log_dir.mkdir(parents=True)
        corpus = Corpus(*(QUICK_EVENTS, QUICK_SUPPLIERS) if args.quick else (EVENTS, SUPPLIERS))
        drawn = {"end": corpus.events[-1].ts, "write_suppliers": corpus.write_suppliers}
        drawn |= {"runs": runs, "scan_runs": scan_runs}
        (log_dir / "drawn.json").write_text(json.dumps(drawn))
        for name, tree in trees.items():  # the same events, each log in its tree's format
            build = [sys.executable, __file__, "--build", str(log_dir / name / "log")]
            env = {**os.environ, "CYPHER_BENCH_TREE": str(tree)}
            subprocess.run(build + (["--quick"] if args.quick else []), env=env, check=True)
    rounds: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
    for i in range(args.rounds):
        for name in list(trees) if i % 2 == 0 else list(reversed(trees)):
            env = {**os.environ, "CYPHER_BENCH_TREE": str(trees[name])}
            out = subprocess.run(
                [sys.executable, __file__, "--round", str(log_dir), name],
                env=env, check=True, capture_output=True, text=True,
            )  # fmt: skip
            rounds[name].append(json.loads(out.stdout))
            print(
                f"round {i + 1} {name}: audit p99 {rounds[name][-1]['audit']['p99_ms']} ms",
                file=sys.stderr,
            )
    result = {
        "machine": machine(),
        "trees": {k: str(v) for k, v in trees.items()},
        "rounds_measured": args.rounds,
        "runs_per_round": runs,
        "queries": {
            name: {
                q: {key: round(median([r[q][key] for r in rs]), 3) for key in rs[0][q]}
                for q in rs[0]
            }
            for name, rs in rounds.items()
        },
        "per_round": rounds,
    }
    path = write_json("cypher_paired", result, args.out)
    print(json.dumps(result["queries"], indent=2))
    print(f"written to {path}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Build the tenant, measure, print and write the JSON; exit 1 past the bound."""
    if argv is None and sys.argv[1:2] == ["--round"]:
        one_tree_round(Path(sys.argv[2]), sys.argv[3])
        return 0
    if argv is None and sys.argv[1:2] == ["--build"]:
        build_log(Path(sys.argv[2]), "--quick" in sys.argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (seconds, not minutes)")
    parser.add_argument("--out", type=Path, default=None, help="JSON output")
    parser.add_argument("--base", type=Path, default=None, help="a second tree, measured beside")
    parser.add_argument(
        "--keep", action="store_true", help="reuse the log of an earlier --base run"
    )
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds per tree (--base)")
    args = parser.parse_args(argv)
    if args.base is not None:
        return paired(args, args.base)
    n_events = QUICK_EVENTS if args.quick else EVENTS
    corpus = Corpus(n_events, QUICK_SUPPLIERS if args.quick else SUPPLIERS)
    work = scratch_dir("cypher")
    log = EventLog.open(work / "log", embedding_dim=4)
    try:
        load_s = load(log, corpus)
        qs = queries(corpus)
        figures = measure(
            log,
            qs,
            QUICK_RUNS if args.quick else RUNS,
            QUICK_SCAN_RUNS if args.quick else SCAN_RUNS,
        )
        plans = {name: plan(q.indexed).describe() for name, q in qs.items()}
        plans |= {f"{name}_scan": plan(q.scan).describe() for name, q in qs.items()}
    finally:
        log.close()
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "events": n_events,
        "suppliers": len(corpus.suppliers),
        "writes": len(corpus.write_suppliers),
        "load_seconds": round(load_s, 1),
        "rounds_measured": ROUNDS,
        "parser_build_ms": parser_build_ms(),
        "queries": figures,
        "scan_over_index_p50": {
            name: round(figures[name + "_scan"]["p50_ms"] / max(figures[name]["p50_ms"], 1e-9), 1)
            for name in qs
        },
        "bound_p50_ms": BOUND_MS,
        "plans": plans,
    }
    path = write_json("cypher", result, args.out)
    print(json.dumps(result, indent=2))
    print(f"written to {path}", file=sys.stderr)
    within = all(figures[name]["p50_ms"] <= BOUND_MS for name in qs)
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())

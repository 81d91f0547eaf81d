"""Batch append throughput: POST /v1/memory/events against the one-event route and a per-event
fsync loop, in the same run.

Every event is one of bench/append.py's bodies (200 characters of text and a 384-float
embedding, as a client with an embedding model sends them). In each run, on one server:

- one-event: POST /v1/memory/event from 32 closed-loop connections (its best case);
- batch: POST /v1/memory/events with BATCH events a request, from 1 and 4 connections;
- lmdb: one durable LMDB write transaction per event, in process (bench/append.py's loop).

Rates are events a second. The server runs with MEMSPINE_EMBEDDER=none (the events' vectors, if
any, are the client's). With --preload N (issue 19: N = 100000) the tenant already holds N
events (written in process before the server starts). With --text-only the events carry no
embedding (the route's own cost, without the vector graph's inserts behind it). Target
(issue 19): batches of 1,000 reach >= 20,000 events/s.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from append import (
    DIM,
    append_requests,
    bodies,
    graph_catch_up,
    lmdb_loop,
    preload_template,
    start_copy,
)
from common import (
    Process,
    http_request,
    load,
    median,
    parse_args,
    scratch_dir,
    start_memspine,
    write_json,
)

BATCH = 1000
BATCH_CLIENTS = (1, 4)
ONE_CLIENTS = 32
TARGET = 20_000


def batch_requests(payloads: list[bytes], size: int, token: str = "bench") -> list[bytes]:
    """The encoded HTTP requests that POST the bodies `size` at a time (at least two batches)."""
    events = [msgspec.json.decode(p) for p in payloads]
    while len(events) < 2 * size:
        events += events
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    out = []
    for first in range(0, len(events) - size + 1, size):
        body = msgspec.json.encode({"events": events[first : first + size]})
        out.append(http_request("POST", "/v1/memory/events", body, headers))
    return out


def without_embedding(payload: bytes) -> bytes:
    """An append body without its embedding."""
    event = msgspec.json.decode(payload)
    event.pop("embedding", None)
    return msgspec.json.encode(event)


def events_per_sec(result: dict[str, Any], size: int) -> dict[str, Any]:
    """A load's result in events: its rate times the events of each request."""
    return {**result, "events_per_sec": round(result["per_sec"] * size, 1)}


def one_run(
    singles: list[bytes],
    batches: list[bytes],
    payloads: list[bytes],
    template: Path | None,
    size: int,
    warmup: float,
    seconds: float,
) -> dict[str, Any]:
    """The one-event route, then batches, on one server; then the lmdb loop."""
    # No server embedder: a text-only tenant would become the server's to embed (every
    # preloaded event listed for the model, and appends held at its backlog), which is
    # bench/embed_server.py's measurement, not the route's.
    env = {"MEMSPINE_EMBEDDING_DIM": str(DIM), "MEMSPINE_EMBEDDER": "none"}
    server: Process
    if template is not None:
        server, data_dir = start_copy(template, env)
        load(server, singles[:1], 1, warmup=0.0, seconds=0.5)  # opens the preloaded tenant
    else:
        data_dir = scratch_dir("memspine") / "data"
        server = start_memspine(data_dir, env)
    run: dict[str, Any] = {}
    try:
        run["one_event"] = events_per_sec(
            load(server, singles, ONE_CLIENTS, warmup=warmup, seconds=seconds), 1
        )
        run["one_event"].update(graph_catch_up(server))
        for clients in BATCH_CLIENTS:
            result = load(server, batches, clients, warmup=warmup, seconds=seconds)
            run[f"batch_{clients}"] = events_per_sec(result, size)
            run[f"batch_{clients}"].update(graph_catch_up(server))
    finally:
        server.stop()
        shutil.rmtree(data_dir.parent, ignore_errors=True)
    run["lmdb"] = lmdb_loop(payloads, seconds)
    run["lmdb"]["events_per_sec"] = run["lmdb"]["per_sec"]
    return run


def summarize(runs: list[dict[str, Any]], size: int) -> dict[str, Any]:
    """Medians over runs, the ratios to the one-event route and the loop, and the target."""
    names = ["one_event", *(f"batch_{c}" for c in BATCH_CLIENTS), "lmdb"]
    keys = ("events_per_sec", "p50_ms", "p99_ms")
    summary: dict[str, Any] = {n: {k: median([r[n][k] for r in runs]) for k in keys} for n in names}
    for n in names[:-1]:
        summary[n]["graph_catch_up_s"] = median([r[n]["graph_catch_up_s"] for r in runs])
    best = max(summary[f"batch_{c}"]["events_per_sec"] for c in BATCH_CLIENTS)
    summary["ratios"] = {
        "batch_vs_one_event": round(best / summary["one_event"]["events_per_sec"], 2),
        "batch_vs_lmdb_loop": round(best / summary["lmdb"]["events_per_sec"], 2),
    }
    summary["target_met"] = {f">= {TARGET} events/s in batches of {size}": best >= TARGET}
    return summary


def report(summary: dict[str, Any], size: int) -> str:
    """The medians as a Markdown table, ready for RESULTS.md."""
    lines = [
        "| route | connections | events/s | p50 ms | p99 ms | graph catch-up s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    rows = [("one event a request", ONE_CLIENTS, "one_event")]
    rows += [(f"batches of {size}", c, f"batch_{c}") for c in BATCH_CLIENTS]
    for label, clients, name in rows:
        row = summary[name]
        lines.append(
            f"| {label} | {clients} | {row['events_per_sec']:.0f} | {row['p50_ms']:.2f} "
            f"| {row['p99_ms']:.2f} | {row['graph_catch_up_s']:.1f} |"
        )
    lm = summary["lmdb"]
    lines.append(
        f"| lmdb txn per event | 1 | {lm['events_per_sec']:.0f} | {lm['p50_ms']:.2f} "
        f"| {lm['p99_ms']:.2f} | |"
    )
    r = summary["ratios"]
    lines += [
        "",
        f"batches / one-event route: {r['batch_vs_one_event']:.1f}x; "
        f"batches / lmdb loop: {r['batch_vs_lmdb_loop']:.1f}x; "
        f"target {TARGET} events/s met: {next(iter(summary['target_met'].values()))}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark."""
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--runs", type=int, default=None)
    extra.add_argument("--seconds", type=float, default=None)
    extra.add_argument("--preload", type=int, default=0)
    extra.add_argument("--batch", type=int, default=BATCH)
    extra.add_argument("--text-only", action="store_true")
    known, rest = extra.parse_known_args(sys.argv[1:] if argv is None else argv)
    args = parse_args(__doc__.splitlines()[0], rest)
    runs = known.runs or (1 if args.quick else 3)
    seconds = known.seconds or (3.0 if args.quick else 8.0)
    warmup = 1.0 if args.quick else 2.0
    payloads = bodies()
    if known.text_only:
        payloads = [without_embedding(p) for p in payloads]
    singles = append_requests(payloads)
    batches = batch_requests(payloads, known.batch)
    template = preload_template(payloads, known.preload) if known.preload else None
    results = []
    try:
        for n in range(runs):
            print(f"run {n + 1}/{runs}", file=sys.stderr, flush=True)
            results.append(
                one_run(singles, batches, payloads, template, known.batch, warmup, seconds)
            )
    finally:
        if template is not None:
            shutil.rmtree(template.parent, ignore_errors=True)
    summary = summarize(results, known.batch)
    config = {
        "runs": runs,
        "seconds": seconds,
        "warmup": warmup,
        "dim": DIM,
        "batch": known.batch,
        "preload": known.preload,
        "batch_body_bytes": len(batches[0]),
        "text_only": known.text_only,
    }
    path = write_json("batch", {"config": config, "summary": summary, "runs": results}, args.out)
    print(report(summary, known.batch))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

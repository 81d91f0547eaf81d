"""Append throughput and latency over HTTP, against a bare Litestar handler and a per-event fsync loop.

Three measurements in one run, each with the same bodies (200 characters of text and a
384-float embedding, as a client with an embedding model sends them):

- memspine: POST /v1/memory/event from 1, 8 and 32 closed-loop loopback connections;
- bare: a Litestar app served the same way (uvicorn, uvloop, httptools) whose handler
  parses the same body with msgspec and answers; the ceiling of the HTTP stack itself;
- lmdb: one durable LMDB write transaction per event, in process; the ceiling of
  appending without group commit.

The load generator runs in this process, the servers in their own. Targets (issue 2):
with 32 clients memspine reaches >= 50 % of bare and >= 3x lmdb, with p99 < 50 ms.

With --preload N (issue 4: N = 100000), the tenant already holds N such events (written
in process through Tenant before the server starts, indexes saved) and only 32 clients
are measured, memspine and bare paired; the target is >= 2,000 events/s.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import msgspec
import uvicorn
from litestar import Litestar, Request, Response, get, post

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    SUPPORT_WORDS as WORDS,
)
from common import (
    Process,
    free_port,
    http_request,
    load,
    median,
    parse_args,
    scratch_dir,
    serve_memspine,
    start_memspine,
    write_json,
)

DIM = 384
TEXT_CHARS = 200
BODIES = 2000
CLIENTS = (1, 8, 32)
SEED = 20261005


def bodies(n: int = BODIES, seed: int = SEED) -> list[bytes]:
    """N append bodies with 200 characters of text and a 384-float embedding, reproducibly."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = ""
        while len(text) < TEXT_CHARS:
            text += rng.choice(WORDS) + " "
        event = {
            "kind": "turn",
            "ts": 1_791_208_939_000_000 + i,
            "text": text[:TEXT_CHARS],
            "embedding": [round(rng.gauss(0, 0.05), 8) for _ in range(DIM)],
            "properties": {"speaker": "customer", "conversation": f"c-{i % 50:04d}"},
        }
        out.append(msgspec.json.encode(event))
    return out


def append_requests(payloads: list[bytes], token: str = "bench") -> list[bytes]:
    """The encoded HTTP requests that POST each body."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return [http_request("POST", "/v1/memory/event", p, headers) for p in payloads]


def graph_catch_up(server: Process, limit: float = 300.0) -> dict[str, float]:
    """Vectors not yet in the HNSW graph when a load ends, and seconds until the graph holds all.

    Appends are acknowledged before their vectors enter the graph (they are searched exactly
    from a tail meanwhile); this is the insert work a load left behind, reported beside its rate.
    """
    started = time.perf_counter()
    pending = first = _pending(server.port)
    while pending and time.perf_counter() - started < limit:
        time.sleep(0.1)
        pending = _pending(server.port)
    return {"vectors_pending": first, "graph_catch_up_s": round(time.perf_counter() - started, 2)}


def _pending(port: int) -> float:
    """memspine_vectors_pending from the server's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("memspine_vectors_pending "):
                return float(line.split()[1])
    raise RuntimeError("memspine_vectors_pending missing from /metrics")


# -- the bare handler ----------------------------------------------------------------------------


class BareEvent(msgspec.Struct, forbid_unknown_fields=True):
    """The append body as memspine's EventIn declares it."""

    kind: str
    ts: int | None = None
    text: str | None = None
    embedding: list[float] | None = None
    properties: msgspec.Raw = msgspec.Raw()


def serve_bare(port: int) -> None:
    """A Litestar app whose append handler only parses the body; served like memspine-server."""

    @post("/v1/memory/event")
    async def append(request: Request[Any, Any, Any]) -> Response[bytes]:
        msgspec.json.decode(await request.body(), type=BareEvent)
        body = msgspec.json.encode({"event_id": str(uuid.uuid4())})
        return Response(body, status_code=201, media_type="application/json")

    @get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    app = Litestar(route_handlers=[append, health], debug=False)
    uvicorn.run(
        app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning"
    )


def start_bare() -> Process:
    """The bare app in its own process."""
    port = free_port()
    argv = [sys.executable, str(Path(__file__).resolve()), "--serve-bare", str(port)]
    return Process(argv, dict(os.environ), port, "/health")


# -- the per-event fsync loop -----------------------------------------------------------------


def lmdb_loop(payloads: list[bytes], seconds: float) -> dict[str, Any]:
    """One durable LMDB write transaction per event (the record msgpack-encoded, keyed by a UUID)."""
    import lmdb

    path = scratch_dir("lmdb-loop")
    env = lmdb.open(str(path), map_size=1 << 30, sync=True, metasync=True)
    encode = msgspec.msgpack.encode
    records = [encode(msgspec.json.decode(p)) for p in payloads]
    latencies: list[float] = []
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        with env.begin(write=True) as txn:
            txn.put(uuid.uuid4().bytes, records[i % len(records)])
        latencies.append(time.perf_counter() - t0)
        i += 1
    elapsed = time.perf_counter() - start
    env.close()
    shutil.rmtree(path, ignore_errors=True)
    ordered = sorted(latencies)
    return {
        "events": i,
        "per_sec": round(i / elapsed, 1),
        "p50_ms": round(ordered[len(ordered) // 2] * 1000, 3),
        "p99_ms": round(ordered[int(len(ordered) * 0.99)] * 1000, 3),
    }


# -- a tenant that already holds events (issue 4) ------------------------------------------------


def preload_template(payloads: list[bytes], count: int) -> Path:
    """A data directory whose tenant `bench` holds count events built from the bench bodies."""
    from memspine.schemas import EventIn, decode_body, to_new_event
    from storage.tenants.tenant import Tenant

    data_dir = scratch_dir("preload") / "data"
    tenant = Tenant.open("bench", data_dir / "bench", embedding_dim=DIM)
    started = time.perf_counter()
    try:
        chunk = 500
        for first in range(0, count, chunk):
            events = []
            for i in range(first, min(first + chunk, count)):
                body = decode_body(payloads[i % len(payloads)], EventIn)
                events.append(to_new_event(body, tenant_id="bench", idempotency_key=None))
            tenant.submit_append(events).result()
        tenant.vectors.flush()
    finally:
        tenant.close()
    print(f"preloaded {count} events in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return data_dir


def start_copy(template: Path, env: dict[str, str] | None = None) -> tuple[Process, Path]:
    """memspine-server in local mode on a copy of a preloaded data directory (and the copy),
    with env beside the dimension."""
    data_dir = scratch_dir("memspine") / "data"
    shutil.copytree(template, data_dir)
    return serve_memspine(data_dir, {"MEMSPINE_EMBEDDING_DIM": str(DIM), **(env or {})}), data_dir


def preloaded_run(
    requests: list[bytes], template: Path, warmup: float, seconds: float
) -> dict[str, Any]:
    """32 clients against the preloaded tenant, paired with bare."""
    bare = start_bare()
    server, data_dir = start_copy(template)
    try:
        # The first append opens the tenant (100,000 events: LMDB, Tantivy, HNSW load).
        load(server, requests[:1], 1, warmup=0.0, seconds=0.5)
        result = {
            "bare": load(bare, requests, 32, warmup=warmup, seconds=seconds),
            "memspine": load(server, requests, 32, warmup=warmup, seconds=seconds),
        }
        result["memspine"].update(graph_catch_up(server))
        return result
    finally:
        bare.stop()
        server.stop()
        shutil.rmtree(data_dir.parent, ignore_errors=True)


def preloaded_main(count: int, runs: int, warmup: float, seconds: float, out: Path | None) -> int:
    """Issue 4: 32 clients appending into a tenant that already holds count events."""
    payloads = bodies()
    requests = append_requests(payloads)
    template = preload_template(payloads, count)
    try:
        results = [preloaded_run(requests, template, warmup, seconds) for _ in range(runs)]
    finally:
        shutil.rmtree(template.parent, ignore_errors=True)
    keys = ("per_sec", "p50_ms", "p99_ms", "server_cpu_ms_per_req")
    summary = {
        t: {k: median([r[t][k] for r in results]) for k in keys} for t in ("memspine", "bare")
    }
    for key in ("vectors_pending", "graph_catch_up_s"):
        summary["memspine"][key] = median([r["memspine"][key] for r in results])
    summary["target_met"] = {">= 2000 events/s": summary["memspine"]["per_sec"] >= 2000}
    config = {"preload": count, "runs": runs, "seconds": seconds, "warmup": warmup, "dim": DIM}
    path = write_json(
        "append_preloaded", {"config": config, "summary": summary, "runs": results}, out
    )
    for t in ("memspine", "bare"):
        row = summary[t]
        print(
            f"| {t} | 32 | {row['per_sec']:.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} "
            f"| {row['server_cpu_ms_per_req']:.3f} |"
        )
    m = summary["memspine"]
    print(
        f"{m['vectors_pending']:.0f} vectors not yet in the graph at the end, "
        f"in it {m['graph_catch_up_s']:.1f} s later"
    )
    print(f"wrote {path}", file=sys.stderr)
    return 0


# -- one run ------------------------------------------------------------------------------------


def one_run(
    requests: list[bytes], payloads: list[bytes], warmup: float, seconds: float
) -> dict[str, Any]:
    """Both servers up side by side, measured in pairs per client count, then the lmdb loop.

    Pairing bare and memspine at each client count (and the loop right after) keeps the
    ratios honest on a machine whose background load drifts during a run.
    """
    run: dict[str, Any] = {"bare": {}, "memspine": {}}
    data_dir = scratch_dir("memspine") / "data"
    bare = start_bare()
    server = start_memspine(data_dir, {"MEMSPINE_EMBEDDING_DIM": str(DIM)})
    try:
        for clients in CLIENTS:
            for name, proc in (("bare", bare), ("memspine", server)):
                run[name][str(clients)] = load(
                    proc, requests, clients, warmup=warmup, seconds=seconds
                )
            # the next client count starts with every vector in the graph
            run["memspine"][str(clients)].update(graph_catch_up(server))
    finally:
        bare.stop()
        server.stop()
        shutil.rmtree(data_dir.parent, ignore_errors=True)
    run["lmdb"] = lmdb_loop(payloads, seconds)
    return run


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over runs, and the ratios the issue sets targets for."""
    summary: dict[str, Any] = {}
    for target in ("bare", "memspine"):
        summary[target] = {
            str(c): {
                key: median([r[target][str(c)][key] for r in runs])
                for key in ("per_sec", "p50_ms", "p99_ms", "server_cpu_ms_per_req")
            }
            for c in CLIENTS
        }
    for c in CLIENTS:
        for key in ("vectors_pending", "graph_catch_up_s"):
            summary["memspine"][str(c)][key] = median([r["memspine"][str(c)][key] for r in runs])
    summary["lmdb"] = {
        key: median([r["lmdb"][key] for r in runs]) for key in ("per_sec", "p50_ms", "p99_ms")
    }
    m32 = summary["memspine"]["32"]
    ratios = {
        "vs_bare_32": round(m32["per_sec"] / summary["bare"]["32"]["per_sec"], 3),
        "vs_lmdb_loop_32": round(m32["per_sec"] / summary["lmdb"]["per_sec"], 2),
        "p99_ms_32": m32["p99_ms"],
    }
    ratios["targets_met"] = {
        "vs_bare_32 >= 0.5": ratios["vs_bare_32"] >= 0.5,
        "vs_lmdb_loop_32 >= 3": ratios["vs_lmdb_loop_32"] >= 3,
        "p99_ms_32 < 50": ratios["p99_ms_32"] < 50,
    }
    summary["ratios"] = ratios
    return summary


def report(summary: dict[str, Any]) -> str:
    """The medians as a Markdown table, ready for RESULTS.md."""
    lines = [
        "| target | clients | events/s | p50 ms | p99 ms | server CPU ms/req |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for target in ("memspine", "bare"):
        for c in CLIENTS:
            row = summary[target][str(c)]
            lines.append(
                f"| {target} | {c} | {row['per_sec']:.0f} | {row['p50_ms']:.2f} "
                f"| {row['p99_ms']:.2f} | {row['server_cpu_ms_per_req']:.3f} |"
            )
    lm = summary["lmdb"]
    lines.append(
        f"| lmdb txn per event | 1 | {lm['per_sec']:.0f} | {lm['p50_ms']:.2f} | {lm['p99_ms']:.2f} | |"
    )
    lines.append("")
    for c in CLIENTS:
        row = summary["memspine"][str(c)]
        lines.append(
            f"{c} clients: {row['vectors_pending']:.0f} vectors not yet in the graph at the end, "
            f"in it {row['graph_catch_up_s']:.1f} s later"
        )
    r = summary["ratios"]
    lines.append("")
    lines.append(
        f"memspine/bare at 32 clients: {r['vs_bare_32']:.2f} (target >= 0.5); "
        f"memspine/lmdb loop: {r['vs_lmdb_loop_32']:.1f}x (target >= 3); "
        f"p99 at 32 clients: {r['p99_ms_32']:.1f} ms (target < 50)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with --serve-bare PORT, be the bare server)."""
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--serve-bare"]:
        serve_bare(int(argv[1]))
        return 0
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--runs", type=int, default=None)
    extra.add_argument("--seconds", type=float, default=None)
    extra.add_argument("--preload", type=int, default=0)
    known, rest = extra.parse_known_args(argv)
    args = parse_args(__doc__.splitlines()[0], rest)
    runs = known.runs or (1 if args.quick else 3)
    seconds = known.seconds or (2.0 if args.quick else 8.0)
    warmup = 0.5 if args.quick else 1.5
    if known.preload:
        return preloaded_main(known.preload, runs, warmup, seconds, args.out)
    payloads = bodies()
    requests = append_requests(payloads)
    results = []
    for n in range(runs):
        print(f"run {n + 1}/{runs}", file=sys.stderr, flush=True)
        results.append(one_run(requests, payloads, warmup, seconds))
    summary = summarize(results)
    config = {
        "runs": runs,
        "seconds": seconds,
        "warmup": warmup,
        "dim": DIM,
        "text_chars": TEXT_CHARS,
        "body_bytes": sum(map(len, payloads)) // len(payloads),
    }
    path = write_json("append", {"config": config, "summary": summary, "runs": results}, args.out)
    print(report(summary))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

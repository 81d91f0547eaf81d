"""Read audit's cost (issue 32): idle fused recall p50 with MEMSPINE_READ_AUDIT off, buffered and
durable, paired in one run; bytes per record of a 10-hit recall; verify over 1,000,000 records.

The tenant is bench/recall.py's corpus (LoCoMo turns with MiniLM vectors) at --size events (100,000
by default), built once and copied for each mode, so three servers serve the same data; a round
loads each in turn with one closed-loop client sending fused recalls (text and embedding, k 10),
and the medians of the rounds' p50s are compared to `off`'s. Bytes per record are read back from
the buffered server's read log, and recomputed with an issued key's 12-character id (local mode's
key id is "local"). Verify: 1,000,000 records of 10 ids written with the log's own appender, then
`storage.readlog.verify` timed against their head. Throughput: 100 tenants of 1,000 events
(one built, copied under 100 local-mode tokens), 32 closed-loop clients sending fused recalls
round robin across them, off and buffered alternating each round.

Targets: buffered p50 <= 1.05x off, durable p50 <= 1.5x off, <= 200 bytes per 10-hit record,
verify over 1,000,000 records <= 10 s, buffered throughput >= 0.9x off.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import OUT, http_request, load, median, serve_memspine, write_json
from recall import DIM, TENANT, build, load_corpus, make_events

from storage.readlog import Read, records, verify
from storage.readlog.format import encode_body, frame
from storage.readlog.logfile import Appender, reads_path

MODES = ("off", "buffered", "durable")
SEED = 20261207


def recall_requests(corpus: Any) -> list[bytes]:
    """Fused k=10 recalls, one per LoCoMo question, pre-encoded."""
    headers = {"Authorization": f"Bearer {TENANT}", "Content-Type": "application/json"}
    out = []
    for i, text in enumerate(corpus.q_texts):
        body = {
            "text": text,
            "embedding": [round(float(x), 6) for x in corpus.q_vectors[i]],
            "k": 10,
        }
        out.append(http_request("POST", "/v1/memory/recall", msgspec.json.encode(body), headers))
    return out


def latency(work: Path, size: int, rounds: int, seconds: float) -> dict[str, Any]:
    """Per mode: p50 of each round, their median, and the ratio to off's median."""
    corpus = load_corpus()
    built = work / f"built-{size}"
    if not (built / TENANT).is_dir():
        events, _ = make_events(corpus, size)
        print(f"building {size} events", file=sys.stderr)
        build(built / TENANT, events)
    servers = {}
    for mode in MODES:
        data = work / mode
        shutil.rmtree(data, ignore_errors=True)
        shutil.copytree(built, data)
        servers[mode] = serve_memspine(
            data, {"MEMSPINE_EMBEDDING_DIM": str(DIM), "MEMSPINE_READ_AUDIT": mode}
        )
    requests = recall_requests(corpus)
    p50s: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        for r in range(rounds):
            order = MODES if r % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                result = load(servers[mode], requests, 1, warmup=0.5, seconds=seconds)
                assert not result["errors"], result
                p50s[mode].append(result["p50_ms"])
                cpu[mode].append(result["server_cpu_ms_per_req"])
    finally:
        for s in servers.values():
            s.stop()
    base = median(p50s["off"])
    out: dict[str, Any] = {}
    for mode in MODES:
        out[mode] = {
            "p50_ms_rounds": p50s[mode],
            "p50_ms": median(p50s[mode]),
            "ratio_to_off": round(median(p50s[mode]) / base, 3),
            "server_cpu_ms_per_req": median(cpu[mode]),
        }
    out["bytes_per_record"] = record_bytes(work / "buffered" / TENANT)
    return out


def throughput(work: Path, seconds: float, rounds: int, base: Path | None = None) -> dict[str, Any]:
    """32 clients recalling across 100 tenants (1,000 events each, a tenant per local-mode
    token), per mode: requests/s of each round, their median, and the ratio to off's; the
    server's CPU per request (all threads), which other processes' load moves less; the load
    average beside each round. With `base` (another checkout), a third server runs buffered
    from that tree: the same load, rotated with the others in each round."""
    corpus = load_corpus()
    template = work / "tenant-1000"
    if not (template / TENANT).is_dir():
        events, _ = make_events(corpus, 1_000)
        build(template / TENANT, events)
    names = [f"t{i:03d}" for i in range(100)]
    base_requests = recall_requests(corpus)
    old = f"Bearer {TENANT}".encode()
    requests = [
        req.replace(old, f"Bearer {names[i % len(names)]}".encode())
        for i, req in enumerate(base_requests * 2)
    ]
    modes = ["off", "buffered"] + (["buffered-base"] if base is not None else [])
    servers = {}
    for mode in modes:
        data = work / f"many-{mode}"
        shutil.rmtree(data, ignore_errors=True)
        for name in names:
            shutil.copytree(template / TENANT, data / name)
        env = {"MEMSPINE_EMBEDDING_DIM": str(DIM), "MEMSPINE_READ_AUDIT": mode.split("-")[0]}
        servers[mode] = (
            serve_from(base, data, env) if mode == "buffered-base" else serve_memspine(data, env)
        )
    rates: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    loads: list[float] = []
    try:
        for r in range(rounds):
            order = modes[r % len(modes) :] + modes[: r % len(modes)]
            for mode in order if r % 2 == 0 else list(reversed(order)):
                result = load(servers[mode], requests, 32, warmup=1.0, seconds=seconds)
                assert not result["errors"], result
                rates[mode].append(result["per_sec"])
                cpu[mode].append(result["server_cpu_ms_per_req"])
                loads.append(round(os.getloadavg()[0], 1))
    finally:
        for s in servers.values():
            s.stop()
    top = median(rates["off"])
    out: dict[str, Any] = {
        mode: {
            "per_sec_rounds": rates[mode],
            "per_sec": median(rates[mode]),
            "ratio_to_off": round(median(rates[mode]) / top, 3),
            "server_cpu_ms_per_req_rounds": cpu[mode],
            "server_cpu_ms_per_req": median(cpu[mode]),
            "cpu_ratio_to_off": round(median(cpu[mode]) / median(cpu["off"]), 3),
        }
        for mode in modes
    }
    out["load_average_rounds"] = loads
    return out


def serve_from(tree: Path, data: Path, env: dict[str, str]) -> Any:
    """serve_memspine, the server's code from another checkout (run from its directory)."""
    import common

    here = common.REPO
    common.REPO = tree
    try:
        return serve_memspine(data, env)
    finally:
        common.REPO = here


def record_bytes(root: Path) -> dict[str, Any]:
    """The buffered server's records of 10 hits: bytes on disk per record, and as an issued
    key's id would make them."""
    found = [f.read for f in records(root) if len(f.read.event_ids) == 10]
    if not found:
        return {"records": 0}
    size = reads_path(root).stat().st_size
    all_records = sum(1 for _ in records(root))
    issued = []
    prev = found[0].ts
    for r in found:
        as_issued = msgspec.structs.replace(r, key_id="Ab3dE5gH9jK1")
        issued.append(len(frame(encode_body(as_issued, bytes(32), prev))))
        prev = r.ts
    return {
        "records": all_records,
        "file_bytes_per_record": round(size / all_records, 1),
        "issued_key_bytes_per_10_hit_record_median": median([float(n) for n in issued]),
        "issued_key_bytes_per_10_hit_record_max": max(issued),
    }


def cpu_cost(work: Path, n: int = 5000) -> dict[str, Any]:
    """CPU time (this thread's, which other processes' load moves little) of the read path's
    part, `ReadAudit.record` of a 10-hit recall in buffered mode, and of the writer's part per
    record (encoding, chain, write; its fdatasync is one per group commit)."""
    import asyncio

    from memspine.readaudit import ReadAudit, Reader

    root = work / "cpu"
    shutil.rmtree(root, ignore_errors=True)
    (root / "t").mkdir(parents=True)
    audit = ReadAudit("buffered", lambda t: root / t, max_pending_per_tenant=10 * n)
    ids = [str(uuid.uuid4()) for _ in range(10)]
    who = Reader("Ab3dE5gH9jK1", "http", "/v1/memory/recall", "0" * 32, None)

    async def reads() -> float:
        started = time.thread_time()
        for _ in range(n):
            await audit.record("t", who, ids)
        return time.thread_time() - started

    try:
        loop_s = asyncio.run(reads())
    finally:
        audit.close()
    batch = [r.read for r in records(root / "t")]
    (root / "w").mkdir()
    f = Appender(root / "w", batch[0].ts)
    started = time.thread_time()
    for lo in range(0, len(batch), 100):  # groups of 100, as a busy 100 ms would hold
        f.append(batch[lo : lo + 100])
    writer_s = time.thread_time() - started
    f.close()
    shutil.rmtree(root, ignore_errors=True)
    return {
        "reads": n,
        "record_call_us": round(loop_s / n * 1e6, 2),
        "writer_us_per_record": round(writer_s / len(batch) * 1e6, 2),
    }


def writer_cpu(
    work: Path, rate: int = 600, tenants: int = 100, seconds: float = 8.0, reps: int = 3
) -> dict[str, Any]:
    """The writer thread's CPU (its own /proc task: user and system, fdatasync included) per
    record when `rate` 10-hit records a second arrive across `tenants` tenants, as 32 clients
    recalling across 100 tenants make them, and the most records it held queued (in ms of
    arrivals: what a crash then loses); with its round journal (the server's) and without one
    (a fdatasync per tenant a round, as before the journal), alternating."""
    from storage.readlog import READS_JOURNAL, ReadLogWriter
    from storage.readlog.format import records_of

    ids = [str(uuid.uuid4()) for _ in range(10)]
    clock = os.sysconf("SC_CLK_TCK")
    out: dict[str, list[float]] = {"journal": [], "no_journal": []}
    late: dict[str, list[float]] = {"journal": [], "no_journal": []}
    for rep in range(reps):
        for kind in ("journal", "no_journal") if rep % 2 == 0 else ("no_journal", "journal"):
            root = work / "writer" / kind
            shutil.rmtree(root, ignore_errors=True)
            roots = [root / f"t{i:03d}" for i in range(tenants)]
            for r in roots:
                r.mkdir(parents=True)
            journal = root / READS_JOURNAL if kind == "journal" else None
            w = ReadLogWriter(durable=False, journal=journal, max_pending=10**6)
            w.start()
            for i in range(tenants):  # the logs made first (a new log's header is synced)
                read = records_of(0, "-", "http", "/v1/memory/recall", "-", None, ids)[0]
                w.submit(f"t{i:03d}", roots[i], read)
            w.flush().result(120)
            task = Path(f"/proc/self/task/{w.native_id}/stat")

            def cpu_s(task: Path = task) -> float:
                fields = task.read_text().rpartition(")")[2].split()
                return (int(fields[11]) + int(fields[12])) / clock

            before, started, n, worst = cpu_s(), time.monotonic(), 0, 0
            while (now := time.monotonic()) - started < seconds:
                due = int((now - started) * rate)
                while n < due:
                    i = n % tenants
                    read = records_of(time.time_ns() // 1000, "Ab3dE5gH9jK1", "http",
                                      "/v1/memory/recall", f"{n:032x}", None, ids)[0]  # fmt: skip
                    w.submit(f"t{i:03d}", roots[i], read)
                    n += 1
                worst = max(worst, w.pending())
                time.sleep(0.005)
            used = cpu_s() - before
            late[kind].append(round(worst / rate * 1000, 1))  # ms of records not yet synced
            w.stop()
            out[kind].append(round(used / n * 1e6, 1))
    return {
        "rate_per_sec": rate,
        "tenants": tenants,
        **{f"{k}_us_per_record_rounds": v for k, v in out.items()},
        **{f"{k}_us_per_record": median(v) for k, v in out.items()},
        **{f"{k}_most_queued_ms_rounds": v for k, v in late.items()},
    }


def verify_time(work: Path, n: int) -> dict[str, Any]:
    """Write n records of 10 ids (1 ms apart) and time a verify of them."""
    root = work / "verify"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    ids = [str(uuid.UUID(int=i + 1, version=4)) for i in range(10_000)]
    t0 = 1_800_000_000_000_000
    f = Appender(root, t0)
    started = time.perf_counter()
    batch = []
    for i in range(n):
        batch.append(
            Read(
                ts=t0 + i * 1000,
                key_id="Ab3dE5gH9jK1",
                door="http",
                route="/v1/memory/recall",
                request_id=f"{i:032x}",
                purpose=None,
                event_ids=ids[(i * 10) % 9990 : (i * 10) % 9990 + 10],
            )
        )
        if len(batch) == 10_000:
            f.append(batch)
            batch = []
    if batch:
        f.append(batch)
    written = time.perf_counter() - started
    head = f.mark()
    f.close()
    size = reads_path(root).stat().st_size
    started, cpu = time.perf_counter(), time.thread_time()
    verdict = verify(root, head, None)
    seconds, cpu = time.perf_counter() - started, time.thread_time() - cpu
    assert verdict.ok and verdict.checked == n, verdict
    shutil.rmtree(root, ignore_errors=True)
    return {
        "records": n,
        "file_bytes": size,
        "bytes_per_record": round(size / n, 1),
        "write_s": round(written, 2),
        "verify_s": round(seconds, 2),
        "verify_cpu_s": round(cpu, 2),  # what it takes with a core of its own
    }


def main(argv: list[str] | None = None) -> int:
    """Run both parts; write bench/out/readaudit.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 events, 100,000 records")
    parser.add_argument("--size", type=int, default=None, help="events (default 100000)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5; quick 1)")
    parser.add_argument("--records", type=int, default=None, help="records to verify (1000000)")
    parser.add_argument(
        "--only", choices=("latency", "throughput", "verify", "cpu", "writer"), default=None
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON (bench/out/readaudit.json)")
    parser.add_argument(
        "--base", type=Path, default=None, help="throughput: also buffered from this checkout"
    )
    args = parser.parse_args(argv)
    size = args.size or (2_000 if args.quick else 100_000)
    rounds = args.rounds or (1 if args.quick else 5)
    n = args.records or (100_000 if args.quick else 1_000_000)
    work = OUT / "tmp" / "readaudit"
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    if args.only in (None, "latency"):
        results["recall"] = latency(work, size, rounds, 2.0 if args.quick else 6.0)
    if args.only in (None, "throughput"):
        results["throughput"] = throughput(work, 2.0 if args.quick else 6.0, rounds, args.base)
    if args.only in (None, "cpu"):
        results["cpu"] = cpu_cost(work)
    if args.only in (None, "writer"):
        results["writer"] = writer_cpu(work)
    if args.only in (None, "verify"):
        results["verify"] = verify_time(work, n)
    config = {
        "size": size,
        "rounds": rounds,
        "records": n,
        "seed": SEED,
        "quick": args.quick,
        "base": str(args.base) if args.base else None,
    }
    out = write_json("readaudit", {"config": config, **results}, args.out)
    print(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

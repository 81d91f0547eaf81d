"""Server-side embedding end to end over HTTP, issue 18's targets (bench/embed.py: the embedder).

1. sustained text-only appends at RATE/s into a server-space tenant for SECONDS: append p50/p99
   and the vector lag (every event's vector written within how long of its append: the backlog
   `memspine_embeddings_pending` sampled every 0.2 s, and the time to drain it after the last
   append), against the same load with MEMSPINE_EMBEDDER=none in the same run (the baseline);
2. fused recall with a server-embedded query in a tenant of EVENTS text-only events (LoCoMo
   turns, repeated with a counter): p50 over HTTP with a new question each time (the model runs)
   and with one question repeated (its vector from the LRU);
3. the same recall in a server-space tenant of PRELOADED events (100,000): the space fixed by one
   text-only event the server embeds, then batches of turns that carry the model's own vectors
   (the reference all-MiniLM-L6-v2 vectors of the data file, each with a little fixed noise so no
   two are equal), as a client of the same model may send them (docs/embeddings.md). Embedding
   100,000 turns on the server would take most of an hour here; the recall measured is the same.

Fixed inputs: LoCoMo turns and questions in file order (bench/embed.py's DATA); paced, one
client, loopback.

    python bench/embed_server.py [--quick] [--preloaded N] [--only-recall]
        [--sustained-rounds N] [--modes none,client,openai,local]
        [--out bench/out/embed_server.json]

--sustained-rounds N runs part 1 alone, N rounds of every mode in turn, each on a new server:
the off baseline moves by up to x2 between identical runs on a shared machine, so each mode's
p99 is read against `none` of the same round (each round is in the JSON) and from the medians.
The modes: `none` (the embedder off, text only), `client` (the embedder off, each event with
the reference 384-d vector of its turn: the cost of having vectors at all), `openai` (server
vectors from bench/embed_stub.py, an endpoint in a process of its own that costs next to
nothing: the server's own share of server embedding) and `local` (the model in its child).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, parse_args, percentile, scratch_dir, start_memspine, write_json

DATA = Path("/work/shared/data/locomo10-minilm.npz")
for parent in Path(__file__).resolve().parents:
    if (parent / "shared" / "data" / "locomo10-minilm.npz").exists():
        DATA = parent / "shared" / "data" / "locomo10-minilm.npz"
        break
RATE = 200
SECONDS = 20
EVENTS = 10_000
PRELOADED = 100_000
MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # storage/embedders/local.py's MODEL_NAME
T0 = 1_800_000_000_000_000
AUTH = {"Authorization": "Bearer bench"}


def texts() -> tuple[list[str], list[str]]:
    """LoCoMo turns and questions of conversations 0-9, in file order."""
    z = np.load(DATA)
    turns = [str(t) for c in range(10) for t in z[f"turn_texts_{c}"]]
    questions = [str(q) for c in range(10) for q in z[f"q_texts_{c}"]]
    return turns, questions


def pending(c: httpx.Client) -> float:
    """memspine_embeddings_pending from /metrics."""
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("memspine_embeddings_pending "):
            return float(line.split()[1])
    return 0.0


def drained(c: httpx.Client) -> float:
    """Wait until no event of the tenant awaits its vector; the time then (perf_counter)."""
    while c.get("/v1/whoami").json()["vector_space"]["unembedded"]:
        time.sleep(0.05)
    return time.perf_counter()


class Stub:
    """bench/embed_stub.py in a process of its own, for the `openai` mode."""

    def __init__(self) -> None:
        stub = Path(__file__).resolve().parent / "embed_stub.py"
        self.proc = subprocess.Popen([sys.executable, str(stub)], stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def env(self) -> dict[str, str]:
        """What points a server's openai embedder at it."""
        return {
            "MEMSPINE_EMBEDDER": "openai",
            "MEMSPINE_EMBEDDER_URL": f"http://127.0.0.1:{self.port}/v1",
            "MEMSPINE_EMBEDDER_MODEL": "stub-384",
        }

    def stop(self) -> None:
        """End the endpoint."""
        self.proc.kill()
        self.proc.wait()


def mode_env(mode: str, stub: Stub | None) -> dict[str, str]:
    """The server's environment for one sustained mode."""
    if mode == "client":
        return {"MEMSPINE_EMBEDDER": "none", "MEMSPINE_EMBEDDING_DIM": "384"}
    if mode == "openai":
        assert stub is not None
        return stub.env()
    return {"MEMSPINE_EMBEDDER": mode}


def sustained(
    embedder: str,
    turns: list[str],
    seconds: int,
    *,
    env: dict[str, str] | None = None,
    vectors: list[list[float]] | None = None,
) -> dict[str, Any]:
    """Paced appends at RATE/s for `seconds` (each with the vector of its turn if `vectors`);
    latencies, and with an embedder the backlog."""
    scratch = scratch_dir(f"embed-server-{embedder}")
    server = start_memspine(scratch, env or {"MEMSPINE_EMBEDDER": embedder})
    base = f"http://127.0.0.1:{server.port}"
    try:
        with httpx.Client(base_url=base, headers=AUTH, timeout=60) as c:
            # The model loads and the space is fixed before the clock starts.
            c.post("/v1/memory/event", json={"kind": "turn", "ts": T0, "text": "warm up"})
            drained(c)
            samples: list[float] = []
            stop = threading.Event()

            def sample() -> None:
                with httpx.Client(base_url=base, timeout=10) as m:
                    while not stop.is_set():
                        samples.append(pending(m))
                        time.sleep(0.2)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            latencies: list[float] = []
            start = time.perf_counter()
            n = RATE * seconds
            for i in range(n):
                due = start + i / RATE
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                t = time.perf_counter()
                body = {
                    "kind": "turn",
                    "ts": T0 + (i + 1) * 1_000_000,
                    "text": turns[i % len(turns)],
                }
                if vectors is not None:
                    body["embedding"] = vectors[i % len(vectors)]
                r = c.post("/v1/memory/event", json=body)
                latencies.append(time.perf_counter() - t)
                assert r.status_code == 201, r.text
            elapsed = time.perf_counter() - start
            last = time.perf_counter()
            drain = 0.0
            if embedder not in ("none", "client"):
                drain = drained(c) - last
            stop.set()
            sampler.join()
            cpu = server.cpu_seconds()  # the server's threads, its model's child not counted
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)  # 25 MB a round otherwise
    return {
        "embedder": embedder,
        "appends": n,
        "achieved_per_sec": round(n / elapsed, 1),
        "p50_ms": round(percentile(latencies, 50) * 1000, 2),
        "p99_ms": round(percentile(latencies, 99) * 1000, 2),
        "max_pending": max(samples, default=0),
        "drain_after_last_s": round(drain, 3),
        "server_cpu_s": round(cpu, 2),
        # With at most max_pending waiting at RATE/s in, an event waits about that long.
        "vector_lag_bound_s": round(max(samples, default=0) / RATE + drain, 3),
    }


def timed_recalls(c: httpx.Client, questions: list[str]) -> dict[str, float]:
    """p50/p99 of 200 text-only recalls with new questions, and of one question 200 times."""
    uncached = []
    for q in questions[:200]:
        t = time.perf_counter()
        r = c.post("/v1/memory/recall", json={"text": q, "k": 10})
        uncached.append(time.perf_counter() - t)
        assert r.status_code == 200, r.text
    cached = []
    for _ in range(200):
        t = time.perf_counter()
        c.post("/v1/memory/recall", json={"text": questions[0], "k": 10})
        cached.append(time.perf_counter() - t)
    return {
        "uncached_p50_ms": round(median(uncached) * 1000, 2),
        "uncached_p99_ms": round(percentile(uncached, 99) * 1000, 2),
        "cached_p50_ms": round(median(cached) * 1000, 2),
        "cached_p99_ms": round(percentile(cached, 99) * 1000, 2),
    }


def model_vectors() -> np.ndarray:
    """The reference vectors of the turns of texts(), in the same order."""
    z = np.load(DATA)
    return np.concatenate([z[f"turn_emb_{c}"] for c in range(10)]).astype(np.float32)


def recall_preloaded(turns: list[str], questions: list[str], events: int) -> dict[str, Any]:
    """Fused recall with a server-embedded query in a server-space tenant of `events` turns."""
    vectors = model_vectors()
    rng = np.random.default_rng(18)
    scratch = scratch_dir("embed-server-preloaded")
    server = start_memspine(scratch, {"MEMSPINE_EMBEDDER": "local"})
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{server.port}", headers=AUTH, timeout=600
        ) as c:
            first = {"kind": "turn", "ts": T0, "text": turns[0]}
            assert c.post("/v1/memory/event", json=first).status_code == 201
            drained(c)  # the tenant's space is the server's now
            built = time.perf_counter()
            for start in range(1, events, 1000):
                rows = range(start, min(events, start + 1000))
                noisy = vectors[[i % len(vectors) for i in rows]]
                noisy = noisy + rng.normal(0, 0.01, noisy.shape).astype(np.float32)
                noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
                batch = [
                    {
                        "kind": "turn",
                        "ts": T0 + i * 1_000_000,
                        "text": f"{turns[i % len(turns)]} ({i})",
                        "embedding": v.tolist(),
                        "embedding_model": MODEL,
                    }
                    for i, v in zip(rows, noisy, strict=True)
                ]
                r = c.post("/v1/memory/events", json={"events": batch})
                assert r.status_code == 201, r.text
            space = c.get("/v1/whoami").json()["vector_space"]
            assert space["made_by"] == "server", space
            c.post("/v1/memory/recall", json={"text": "warm up", "k": 10, "wait_for_vectors": True})
            build_s = time.perf_counter() - built
            timed = timed_recalls(c, questions)
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)  # 25 MB a round otherwise
    return {"events": events, "build_s": round(build_s, 1), **timed}


def recall_at(turns: list[str], questions: list[str], events: int) -> dict[str, Any]:
    """Fused recall with a server-embedded query over HTTP, uncached and cached."""
    scratch = scratch_dir("embed-server-recall")
    server = start_memspine(scratch, {"MEMSPINE_EMBEDDER": "local"})
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{server.port}", headers=AUTH, timeout=600
        ) as c:
            built = time.perf_counter()
            for start in range(0, events, 1000):
                batch = [
                    {
                        "kind": "turn",
                        "ts": T0 + i * 1_000_000,
                        "text": f"{turns[i % len(turns)]} ({i})",
                    }
                    for i in range(start, min(events, start + 1000))
                ]
                r = c.post("/v1/memory/events", json={"events": batch})
                assert r.status_code == 201, r.text
            build_s = drained(c) - built
            timed = timed_recalls(c, questions)
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)  # 25 MB a round otherwise
    return {"events": events, "build_and_embed_s": round(build_s, 1), **timed}


def sustained_rounds(
    turns: list[str], seconds: int, rounds: int, modes: list[str]
) -> dict[str, Any]:
    """Part 1 alone, `rounds` times every mode in turn; every round, each mode's p99 over the
    round's `none`, and the medians."""
    modes = ["none", *[m for m in modes if m != "none"]]
    vectors = [[round(float(x), 6) for x in v] for v in model_vectors()[:2000]]
    stub = Stub() if "openai" in modes else None
    each: list[dict[str, Any]] = []
    try:
        for i in range(rounds):
            row: dict[str, Any] = {"round": i}
            for mode in modes:
                env = mode_env(mode, stub)
                row[mode] = sustained(
                    mode, turns, seconds, env=env, vectors=vectors if mode == "client" else None
                )
            row["loadavg"] = os.getloadavg()[0]
            off = row["none"]["p99_ms"]
            row["p99_ratio"] = {m: round(row[m]["p99_ms"] / off, 2) for m in modes[1:] if off}
            print(row, flush=True)
            each.append(row)
    finally:
        if stub is not None:
            stub.stop()

    def mid(mode: str, key: str) -> float:
        return round(median([float(r[mode][key]) for r in each]), 3)

    summary: dict[str, Any] = {}
    for mode in modes:
        summary[mode] = {k: mid(mode, k) for k in ("p50_ms", "p99_ms")}
        if mode not in ("none", "client"):
            for k in ("max_pending", "drain_after_last_s", "vector_lag_bound_s"):
                summary[mode][k] = mid(mode, k)
        if mode != "none":
            summary[mode]["p99_ratio_of_medians"] = round(
                summary[mode]["p99_ms"] / summary["none"]["p99_ms"], 2
            )
            summary[mode]["p99_ratio_median"] = round(
                median([float(r["p99_ratio"][mode]) for r in each]), 2
            )
    print(summary, flush=True)
    return {"modes": modes, "rounds": each, "medians": summary}


def main() -> None:
    """Measure, print and write the JSON."""
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--preloaded", type=int, default=None)
    extra.add_argument("--only-recall", action="store_true")
    extra.add_argument("--sustained-rounds", type=int, default=0)
    extra.add_argument("--modes", default="none,client,openai,local")
    known, rest = extra.parse_known_args()
    args = parse_args(__doc__ or "", rest)
    turns, questions = texts()
    seconds = 5 if args.quick else SECONDS
    if known.sustained_rounds:
        before = os.getloadavg()
        result: dict[str, Any] = {"rate": RATE, "seconds": seconds}
        modes = known.modes.split(",")
        result |= sustained_rounds(turns, seconds, known.sustained_rounds, modes)
        result |= {
            "loadavg_before": [round(x, 2) for x in before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        }
        write_json("embed_server", result, args.out)
        return
    events = 2_000 if args.quick else EVENTS
    preloaded = known.preloaded or (10_000 if args.quick else PRELOADED)
    before = os.getloadavg()
    result = {"rate": RATE, "seconds": seconds}
    if not known.only_recall:
        off = sustained("none", turns, seconds)
        print(off, flush=True)
        on = sustained("local", turns, seconds)
        print(on, flush=True)
        fused = recall_at(turns, questions, events)
        print(fused, flush=True)
        result |= {
            "appends_embedder_off": off,
            "appends_embedder_local": on,
            "p99_ratio": round(on["p99_ms"] / off["p99_ms"], 2) if off["p99_ms"] else None,
            "recall": fused,
        }
    large = recall_preloaded(turns, questions, preloaded)
    print(large, flush=True)
    result |= {
        "recall_preloaded": large,
        "loadavg_before": [round(x, 2) for x in before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    write_json("embed_server", result, args.out)


if __name__ == "__main__":
    main()

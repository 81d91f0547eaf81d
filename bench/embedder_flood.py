"""What an embedder flood costs another tenant: a victim's appends, GETs, recalls and vectors
while an attacker floods the server's embedder with text-only events.

One memspine-server in local mode with the local embedder (384 dimensions, server vectors)
serves a victim tenant and an attacker tenant, both text-only. The victim runs a closed loop
on one connection: append a text-only turn, GET it, recall by text (the query embedded in the
server). It runs alone first (the baseline of the same run), then while the attacker's 4
clients send batches of 100 text-only events back to back. Besides the loop's latencies, the
victim's vector lag: from an append until the server has made its vector (polled on
/v1/whoami), sampled between rounds of the loop.

Targets (issue 35): the victim's append, GET and recall p99 within 3x of its alone figure, its
vector lag not behind the attacker's backlog, and no 503 the victim's own use did not cause.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from common import (  # noqa: E402  (bench scripts run as plain files)
    median,
    parse_args,
    percentile,
    scratch_dir,
    serve_memspine,
    write_json,
)

VICTIM, ATTACKER = "victim-tenant", "attacker-tenant"  # local mode: the token is the tenant
WORDS = [
    "parcel",
    "carrier",
    "signed",
    "refund",
    "street",
    "number",
    "order",
    "courier",
    "box",
    "label",
    "door",
]
FLOOD_CLIENTS = 4
FLOOD_BATCH = 100
LAG_SAMPLES = 5


def call(port: int, method: str, path: str, body: Any, token: str) -> tuple[int, Any]:
    """One JSON request; (status, decoded answer) whatever the status."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None


def text(i: int) -> str:
    """A support turn of 14 words, different for each i."""
    return f"turn {i}: " + " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(14))


def victim_loop(port: int, seconds: float, start: int) -> dict[str, Any]:
    """Append, GET, recall in turn for `seconds`; p50/p99 of each, statuses not 2xx."""
    times: dict[str, list[float]] = {"append": [], "get": [], "recall": []}
    failures: dict[str, int] = {}
    stop = time.monotonic() + seconds
    i = start
    while time.monotonic() < stop:
        steps: list[tuple[str, str, str, Any]] = [
            ("append", "POST", "/v1/memory/event", {"kind": "turn", "text": text(i)})
        ]
        t0 = time.perf_counter()
        status, made = call(port, *steps[0][1:], VICTIM)
        times["append"].append((time.perf_counter() - t0) * 1000)
        if status != 201:
            failures[f"append {status}"] = failures.get(f"append {status}", 0) + 1
            continue
        for name, method, path, body in (
            ("get", "GET", f"/v1/memory/event/{made['event_id']}", None),
            ("recall", "POST", "/v1/memory/recall", {"text": "who signed for the parcel", "k": 5}),
        ):
            t0 = time.perf_counter()
            status, _ = call(port, method, path, body, VICTIM)
            times[name].append((time.perf_counter() - t0) * 1000)
            if status != 200:
                failures[f"{name} {status}"] = failures.get(f"{name} {status}", 0) + 1
        i += 1
    out: dict[str, Any] = {"rounds": i - start, "failures": failures}
    for name, ms in times.items():
        out[name] = {"p50_ms": round(percentile(ms, 50), 2), "p99_ms": round(percentile(ms, 99), 2)}
    return out


def vector_lag(port: int, start: int) -> list[float]:
    """Seconds from one victim append until no victim event waits for its vector, LAG_SAMPLES
    times."""
    lags = []
    for n in range(LAG_SAMPLES):
        call(port, "POST", "/v1/memory/event", {"kind": "turn", "text": text(start + n)}, VICTIM)
        t0 = time.monotonic()
        while True:
            _status, who = call(port, "GET", "/v1/whoami", None, VICTIM)
            if who and who["vector_space"]["unembedded"] == 0:
                break
            time.sleep(0.02)
        lags.append(time.monotonic() - t0)
    return lags


class Flood:
    """FLOOD_CLIENTS clients sending batches of text-only events to the attacker's tenant."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.statuses: dict[str, int] = {}
        self.events = 0
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self.client, args=(n,)) for n in range(FLOOD_CLIENTS)
        ]

    def client(self, n: int) -> None:
        """One client's loop of batches until stopped, counting statuses and events taken."""
        i = n * 10_000_000
        while not self.stop.is_set():
            batch = [{"kind": "turn", "text": text(i + j)} for j in range(FLOOD_BATCH)]
            status, _ = call(self.port, "POST", "/v1/memory/events", {"events": batch}, ATTACKER)
            with self.lock:
                self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1
                self.events += FLOOD_BATCH if status == 201 else 0
            i += FLOOD_BATCH

    def __enter__(self) -> Flood:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def main() -> None:
    """The victim alone, then under the flood; JSON out."""
    args = parse_args(__doc__.splitlines()[0])
    seconds = 8.0 if args.quick else 30.0
    data = scratch_dir("embedder-flood")
    proc = serve_memspine(data, {"MEMSPINE_EMBEDDER": "local", "MEMSPINE_EMBEDDING_DIM": "384"})
    port = proc.port
    try:
        for n in range(20):  # both tenants exist and the model is loaded before the clock
            call(port, "POST", "/v1/memory/event", {"kind": "turn", "text": text(n)}, VICTIM)
            call(port, "POST", "/v1/memory/event", {"kind": "turn", "text": text(n)}, ATTACKER)
        vector_lag(port, 100)
        call(port, "POST", "/v1/memory/recall", {"text": "warm the query model", "k": 1}, VICTIM)
        alone = victim_loop(port, seconds, 1_000)
        alone["vector_lag_s"] = vector_lag(port, 2_000)
        with Flood(port) as flood:
            time.sleep(2.0)  # a backlog builds first
            _s, who = call(port, "GET", "/v1/whoami", None, ATTACKER)
            backlog_at_start = who["vector_space"]["unembedded"] if who else None
            flooded = victim_loop(port, seconds, 3_000)
            flooded["vector_lag_s"] = vector_lag(port, 4_000)
            _s, who = call(port, "GET", "/v1/whoami", None, ATTACKER)
            backlog_at_end = who["vector_space"]["unembedded"] if who else None
    finally:
        proc.stop()
    ratios = {
        name: round(flooded[name]["p99_ms"] / max(alone[name]["p99_ms"], 0.001), 2)
        for name in ("append", "get", "recall")
    }
    result = {
        "seconds": seconds,
        "alone": alone,
        "flooded": flooded,
        "attacker": {
            "statuses": flood.statuses,
            "events_accepted": flood.events,
            "unembedded_at_start": backlog_at_start,
            "unembedded_at_end": backlog_at_end,
        },
        "p99_ratio": ratios,
        "vector_lag_median_s": {
            "alone": round(median(alone["vector_lag_s"]), 2),
            "flooded": round(median(flooded["vector_lag_s"]), 2),
        },
        "targets": {"p99_ratio_max": 3.0},
        "ok": all(r <= 3.0 for r in ratios.values()) and not flooded["failures"],
    }
    print(json.dumps({k: result[k] for k in ("p99_ratio", "vector_lag_median_s", "ok")}))
    print(write_json("embedder_flood", result, args.out))


if __name__ == "__main__":
    main()

"""What memspine.client costs its caller beside the plain httpx request it wraps.

One memspine-server in local mode. Appends and page reads are sent one at a time, alternately in
blocks by plain httpx (the same headers: an Idempotency-Key per append, so the server does the
same work) and by `memspine.client.Memspine` (key, Struct decoding, retry bookkeeping); each
block records wall time per request and the caller's CPU time (time.process_time). Medians of
the blocks, so the server's share and the machine's load are in both arms alike.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from common import median, parse_args, scratch_dir, start_memspine, write_json

from memspine.client import Memspine

TOKEN = "bench-client"


def block(run: Callable[[int], Any], n: int) -> tuple[float, float]:
    """(wall µs, caller CPU µs) per call over n calls."""
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        run(i)
    return ((time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6)


def main() -> None:
    """Run both arms against one server and write bench/out/client.json."""
    args = parse_args(__doc__ or "")
    blocks, per_block = (6, 100) if args.quick else (20, 250)
    server = start_memspine(scratch_dir("client") / "data", {"MEMSPINE_EMBEDDER": "none"})
    url = f"http://127.0.0.1:{server.port}"
    try:
        raw = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"})
        client = Memspine(url, TOKEN)
        body = {"kind": "turn", "text": "customer asks where parcel PX-55790112 went", "ts": 0}

        def raw_append(i: int) -> Any:
            sent = {**body, "ts": 1_791_208_939_000_000 + i}
            r = raw.post(
                "/v1/memory/event", json=sent, headers={"Idempotency-Key": str(uuid.uuid4())}
            )
            return r.json()["event_id"]

        def client_append(i: int) -> Any:
            return client.append("turn", body["text"], ts=1_791_208_939_000_000 + i).event_id

        def raw_page(_: int) -> Any:
            return raw.get("/v1/memory/events", params={"limit": 100}).json()["events"]

        def client_page(_: int) -> Any:
            return client.list_events(limit=100).events

        arms = {
            "append": (raw_append, client_append),
            "list_100": (raw_page, client_page),
        }
        results: dict[str, Any] = {}
        for name, (plain, wrapped) in arms.items():
            seen: dict[str, list[tuple[float, float]]] = {"httpx": [], "client": []}
            plain(0), wrapped(0)  # connections open, first tenant open
            for _ in range(blocks):
                seen["httpx"].append(block(plain, per_block))
                seen["client"].append(block(wrapped, per_block))
            results[name] = {
                arm: {
                    "wall_us": round(median([w for w, _ in values]), 1),
                    "caller_cpu_us": round(median([c for _, c in values]), 1),
                }
                for arm, values in seen.items()
            }
        raw.close()
        client.close()
    finally:
        server.stop()
    out = write_json(
        "client", {"blocks": blocks, "per_block": per_block, "results": results}, args.out
    )
    for name, arms_out in results.items():
        print(name, arms_out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

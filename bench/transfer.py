"""Export, import, backup and restore of a tenant of 100,000 events, and what they cost writers.

- The tenant: bench/purge.py's template (384-float embeddings, 18 words of text, two properties),
  built once through `Tenant.submit_append` and reused; a copy is the data directory here.
- Speeds, each the median of the runs, events per second:
  - **read** (baseline, same run): every live record read back from one LMDB snapshot, in op
    order, as an export reads them (the floor under any export);
  - **export**: `memspine-admin export`'s path (storage/transfer/export.py from another
    process's view of the log) into a file;
  - **append** (baseline, same run): 20,000 of the same events through `Tenant.submit_append`
    in batches of 500, graph inserts included (what the import path writes through);
  - **import**: that file into a new data directory (storage/transfer/landing.py), closed, so
    the keyword index is committed and the graph complete and saved;
  - **backup** and **restore** of the whole data directory (storage/transfer/backup.py).
- The writers' stall: memspine-server serves the data directory while one client appends
  (one event at a time, 384-float embedding) for 3 s, then during each of: a backup, a CLI
  export (both from this process), a `GET /v1/memory/export` (spooled in the server); the
  appends' p50, p99 and longest, before and during each.

Target (issue 19): no write stall longer than 50 ms during a backup.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import parse_args, percentile, scratch_dir, serve_memspine, write_json
from purge import DIM, SEED, events, template

from storage.tenants.tenant import Tenant
from storage.transfer.backup import backup, restore
from storage.transfer.export import dir_export, log_snapshot
from storage.transfer.landing import import_tenant

APPEND_BASELINE = 20_000
APPEND_BATCH = 500


def timed(fn: Callable[[], Any]) -> float:
    """Seconds fn takes."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def read_all(root: Path) -> int:
    """Every live record, in op order, from one snapshot (what an export reads)."""
    n = 0
    with log_snapshot(root) as r:
        for _seq, op, event_id in r.ops_after(0):
            if op == b"A" and r.get(event_id) is not None:
                n += 1
    return n


def export_file(root: Path, out: Path) -> int:
    """The tenant at root exported to out, as memspine-admin export does; its size."""
    with dir_export(root, "t") as lines, open(out, "wb") as fh:
        for line in lines:
            fh.write(line)
    return out.stat().st_size


def append_baseline(work: Path) -> float:
    """Seconds to append APPEND_BASELINE events through the writer, graph complete on close."""
    import random

    import numpy as np

    shutil.rmtree(work, ignore_errors=True)
    rng, words = np.random.default_rng(SEED + 1), random.Random(SEED + 1)
    batches = [
        events(rng, words, lo, APPEND_BATCH) for lo in range(0, APPEND_BASELINE, APPEND_BATCH)
    ]
    started = time.perf_counter()
    tenant = Tenant.open("b", work, embedding_dim=DIM)
    for batch in batches:
        tenant.submit_append(batch).result()
    tenant.close()
    return time.perf_counter() - started


def speeds(data: Path, work: Path, n: int, runs: int) -> dict[str, Any]:
    """The median seconds of each operation over runs, as events/s."""
    seconds: dict[str, list[float]] = {
        k: [] for k in ("read", "export", "append", "import", "backup", "restore")
    }
    size = 0
    out = work / "t.ndjson"
    for run in range(runs):
        seconds["read"].append(timed(lambda: read_all(data / "t")))
        seconds["export"].append(timed(lambda: export_file(data / "t", out)))
        size = out.stat().st_size
        seconds["append"].append(append_baseline(work / "append"))
        shutil.rmtree(work / "imported", ignore_errors=True)
        with open(out, "rb") as fh:
            seconds["import"].append(timed(lambda: import_tenant(work / "imported", "t", fh)))
        shutil.rmtree(work / "bk", ignore_errors=True)
        seconds["backup"].append(timed(lambda: backup(data, work / "bk")))
        shutil.rmtree(work / "restored", ignore_errors=True)
        seconds["restore"].append(
            timed(lambda: restore(work / "bk", work / "restored", default_dim=DIM))
        )
        print(f"run {run + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in seconds.items()))
    result: dict[str, Any] = {"export_bytes": size, "runs": runs, "events": n}
    for k, v in seconds.items():
        count = APPEND_BASELINE if k == "append" else n
        result[k] = {
            "seconds": round(statistics.median(v), 2),
            "events_per_s": round(count / statistics.median(v)),
            "all_seconds": [round(s, 2) for s in v],
        }
    return result


class Appender(threading.Thread):
    """One client appending one event at a time; (start, seconds) of each."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/v1/memory/event"
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        """Append until told to stop."""
        import http.client

        import numpy as np

        conn = http.client.HTTPConnection(self.url.split("/")[2])
        vector = np.random.default_rng(3).standard_normal(DIM).tolist()
        headers = {"Authorization": "Bearer t", "Content-Type": "application/json"}
        i = 0
        while not self.stop.is_set():
            body = json.dumps(
                {
                    "kind": "turn",
                    "ts": 1_791_208_939_000_000 + i,
                    "text": f"during {i}",
                    "embedding": vector,
                }
            )
            started = time.perf_counter()
            conn.request("POST", "/v1/memory/event", body, headers)
            r = conn.getresponse()
            r.read()
            assert r.status == 201, r.status
            self.samples.append((started, time.perf_counter() - started))
            i += 1
        conn.close()


def summary(samples: list[tuple[float, float]], lo: float, hi: float) -> dict[str, Any]:
    """Appends that overlapped [lo, hi]: their p50, p99 and longest (ms)."""
    during = [d for s, d in samples if s < hi and s + d > lo]
    return {
        "appends": len(during),
        "p50_ms": round(percentile(during, 50) * 1000, 2),
        "p99_ms": round(percentile(during, 99) * 1000, 2),
        "max_ms": round(max(during, default=0.0) * 1000, 1),
        "seconds": round(hi - lo, 2),
    }


def stalls(data: Path, work: Path) -> dict[str, Any]:
    """Append latencies while nothing else runs, then during a backup, a CLI export and an HTTP
    export, with memspine-server serving data."""
    server = serve_memspine(data, {"MEMSPINE_EMBEDDING_DIM": str(DIM)})
    out: dict[str, Any] = {}
    try:
        writer = Appender(server.port)
        writer.start()
        time.sleep(1.0)  # the tenant opened, the graph loaded
        lo = time.perf_counter()
        time.sleep(3.0)
        out["alone"] = summary(writer.samples, lo, time.perf_counter())

        def http_export() -> None:
            req = urllib.request.Request(
                f"http://127.0.0.1:{server.port}/v1/memory/export",
                headers={"Authorization": "Bearer t"},
            )
            with urllib.request.urlopen(req, timeout=600) as r:
                while r.read(1 << 20):
                    pass

        shutil.rmtree(work / "bk-hot", ignore_errors=True)
        jobs: list[tuple[str, Callable[[], Any]]] = [
            ("backup", lambda: backup(data, work / "bk-hot")),
            ("cli_export", lambda: export_file(data / "t", work / "hot.ndjson")),
            ("http_export", http_export),
        ]
        for name, job in jobs:
            lo = time.perf_counter()
            job()
            out[name] = summary(writer.samples, lo, time.perf_counter())
            time.sleep(1.0)
        writer.stop.set()
        writer.join()
    finally:
        server.stop()
    return out


def main() -> None:
    """Run, print and write bench/out/transfer.json."""
    args = parse_args(__doc__ or "")
    n = 5_000 if args.quick else 100_000
    runs = 1 if args.quick else 3
    source, built = template(n)
    work = scratch_dir("transfer")
    try:
        data = work / "data"
        shutil.copytree(source, data / "t")
        result: dict[str, Any] = {"template_built_s": built}
        result["speeds"] = speeds(data, work, n, runs)
        result["stalls"] = stalls(data, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    path = write_json("transfer", result, args.out)
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

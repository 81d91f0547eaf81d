"""Bytes on disk per event with a 384-dimension vector (issue 34: at most 2.5 KB).

A tenant of N events (384 random float32 values each, 18 words of text, a kind and a ts, the
shape of bench/tenants.py's events) is built in process through `Tenant.submit_append` in
batches of 1,000 and closed; then every file under its directory is counted: the whole tenant,
the log alone (data.mdb), the keyword index and the vector files, and the LMDB page counts of
the log's "events" database (leaf and overflow pages). Also the CPU of a record's codec (encode,
decode whole and light, and rendering an embedding for a client), in microseconds.

With --baseline DIR the same build runs a second time with the code of DIR (a checkout of
another commit, e.g. `git archive main | tar -x -C DIR`), in a child process whose import path
starts there, so both formats are measured in one run on the same machine; then that tenant is
opened and closed once by this checkout's code (`migrated`: a log of an older format rewritten
on open, storage/log/migrations.py). Each build runs 3 times (1 with --quick; fixed seed: the
same events each time) and the medians are reported.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SUPPORT_WORDS, parse_args, scratch_dir, write_json

DIM = 384
SEED = 20261207
REPO = Path(__file__).resolve().parent.parent


def build(root: Path, n: int) -> dict[str, Any]:
    """Build and close a tenant of n events at root, as bench/tenants.py builds its tenants
    (n = 0: open and close the tenant that is there); its sizes (run in the child)."""
    # The code measured is the first on the path (the child's cwd); bench/tenants.py puts this
    # checkout ahead of it, so the package is imported first (its modules then come from it).
    import importlib

    importlib.import_module("storage")
    from tenants import build as build_tenant

    seconds, _ids = build_tenant(root.parent, root.name, n)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    measured = {**sizes(root), "seconds": seconds, "peak_rss_bytes": peak}
    if n > 0:
        measured["open_ms"] = open_ms(root)
    return measured


def open_ms(root: Path, times: int = 15) -> float:
    """Milliseconds to open and close the (closed, unchanged) tenant at root, median of
    `times` (its vector index read from its file, or from the log where it keeps none)."""
    import time

    from storage.tenants.tenant import Tenant

    took = []
    for _ in range(times):
        started = time.perf_counter()
        Tenant.open(root.name, root, embedding_dim=DIM).close()
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took)


def sizes(root: Path) -> dict[str, Any]:
    """Every file's size under a closed tenant's directory, the log's page counts, a record."""
    import lmdb

    files = {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}
    log = next(p for p in root.rglob("data.mdb"))
    env = lmdb.open(str(log.parent), readonly=True, max_dbs=32, lock=False)
    with env.begin() as txn:
        names = [bytes(k) for k in txn.cursor().iternext(values=False)]
        # version 7 keeps records in "records" (by seq), older versions in "events" (by id)
        db = env.open_db(b"records" if b"records" in names else b"events", txn=txn, create=False)
        stat = txn.stat(db)
        record = len(next(iter(txn.cursor(db=db).iternext(False))))
        pages = {
            name.decode(): sum(
                v
                for k, v in txn.stat(env.open_db(name, txn=txn, create=False)).items()
                if k.endswith("_pages")
            )
            for name in names
        }
        pages["free"] = (env.info()["last_pgno"] + 1) - sum(pages.values()) - 2  # 2 meta pages
    env.close()
    return {"files": files, "events_db": stat, "a_record_bytes": record, "db_pages": pages}


def summary(measured: dict[str, Any], n: int) -> dict[str, Any]:
    """Bytes per event: the whole tenant, the log, the keyword and vector files."""
    files: dict[str, int] = measured["files"]

    def part(*words: str) -> int:
        return sum(v for k, v in files.items() if any(w in k for w in words))

    whole = sum(files.values())
    log = part("data.mdb")
    keyword = sum(v for k, v in files.items() if k.split("/")[0].startswith("keyword"))
    return {
        "tenant_bytes_per_event": round(whole / n),
        "log_bytes_per_event": round(log / n),
        "keyword_bytes_per_event": round(keyword / n),
        "other_bytes_per_event": round((whole - log - keyword) / n),
        "overflow_pages": measured["events_db"]["overflow_pages"],
        "leaf_pages": measured["events_db"]["leaf_pages"],
        "a_record_bytes": measured["a_record_bytes"],
        "db_pages": measured.get("db_pages", {}),
        # the build, or the open and close (with a migration, for `migrated`), and the child's
        # peak RSS
        "seconds": round(measured.get("seconds", 0.0), 3),
        "peak_rss_mb": round(measured.get("peak_rss_bytes", 0) / 1e6),
        # the open and close of the tenant built (unchanged), median of 15
        "open_ms": round(measured.get("open_ms", 0.0), 2),
    }


def codec() -> dict[str, float]:
    """Microseconds (median of 7 rounds of 2,000 calls) to encode a record of 384 floats, to
    decode it whole and without its embedding, and to render its embedding for a client (run
    in the child; the render only where the code has one, storage/floats.py)."""
    import timeit

    import numpy as np

    from storage.log import layout
    from storage.model import StoredEvent

    vector = np.random.default_rng(SEED).standard_normal(DIM).astype(np.float32).tolist()
    words = random.Random(SEED)
    ev = StoredEvent(
        event_id="6f1c2a55-0d53-4c2e-9a3e-3a0b7d9e2f10",
        seq=7,
        kind="turn",
        ts=1_791_208_939_000_000,
        text=" ".join(words.choice(SUPPORT_WORDS) for _ in range(18)),
        embedding=vector,
    )
    raw = layout.encode_event(ev)
    calls: dict[str, Any] = {
        "encode": lambda: layout.encode_event(ev),
        "decode": lambda: layout.decode_event(raw),
        "decode_light": lambda: layout.decode_light(raw),
    }
    render = getattr(ev, "embedding_out", None)
    if render is not None:
        calls["render"] = render
    return {
        f"{name}_us": round(
            statistics.median(timeit.repeat(fn, number=2000, repeat=7)) / 2000 * 1e6, 2
        )
        for name, fn in calls.items()
    }


def child(code: Path, tenant: Path, n: int) -> dict[str, Any]:
    """build(tenant, n) run by the code at `code`, in a process of its own (n = -1: codec())."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(tenant), str(n)],
        env={**os.environ, "PYTHONPATH": str(code)},
        cwd=code,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.splitlines()[-1])  # type: ignore[no-any-return]


def measure(codes: dict[str, Path], n: int, runs: int) -> dict[str, Any]:
    """Median sizes of `runs` builds of n events by each code; with a baseline, its tenant
    opened once more by this checkout's code (`migrated`)."""
    results: dict[str, list[dict[str, Any]]] = {}
    for _ in range(runs):
        for name, code in codes.items():
            root = scratch_dir("disk")
            try:
                results.setdefault(name, []).append(summary(child(code, root / "t", n), n))
                if name == "baseline":
                    migrated = summary(child(REPO, root / "t", 0), n)
                    results.setdefault("migrated", []).append(migrated)
            finally:
                shutil.rmtree(root, ignore_errors=True)
    return {
        name: {
            "median": {
                k: statistics.median(r[k] for r in rs) if not isinstance(v, dict) else v
                for k, v in rs[0].items()  # the pages of each database: the first run's
            },
            "runs": rs,
        }
        for name, rs in results.items()
    }


def main(argv: list[str] | None = None) -> int:
    """Measure, print and write the JSON."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        sys.path.insert(0, os.getcwd())  # the code measured, ahead of this checkout
        n = int(argv[2])
        print(json.dumps(codec() if n < 0 else build(Path(argv[1]), n)))
        return 0
    baseline = None
    if "--baseline" in argv:
        i = argv.index("--baseline")
        baseline = Path(argv[i + 1]).resolve()
        argv = argv[:i] + argv[i + 2 :]
    args = parse_args(__doc__ or "", argv)
    counts = [200, 2_000] if args.quick else [200, 2_000, 20_000]
    runs = 1 if args.quick else 3
    data: dict[str, Any] = {"dim": DIM, "runs": runs, "sizes": {}}
    codes = {"new": REPO} if baseline is None else {"new": REPO, "baseline": baseline}
    timings: dict[str, list[dict[str, float]]] = {}
    for _ in range(runs):  # alternated, so both see the same moments of a shared machine
        for name, code in codes.items():
            timings.setdefault(name, []).append(child(code, Path("-"), -1))
    data["codec"] = {
        name: {k: statistics.median(t[k] for t in ts) for k in ts[0]}
        for name, ts in timings.items()
    }
    print("codec", data["codec"], flush=True)
    for n in counts:
        entry = measure(codes, n, runs)
        data["sizes"][str(n)] = entry
        print(n, {k: v["median"] for k, v in entry.items()}, flush=True)
    print(write_json("disk", data, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The shared writer pool (issue 34) against a thread per tenant, in process, in one run.

Each configuration runs in a child process of its own, from its own tree (PYTHONPATH): the
baseline is a copy of the code before the pool (`git archive <base> | tar -x -C DIR`, passed as
--base DIR), the others this tree with MEMSPINE_WRITER_THREADS' pool at given sizes. The
configurations alternate, run after run, so the machine's load falls on all alike. Phases, on
the repository's filesystem (fsync included), through TenantManager as the server uses it:

- one tenant, 32 threads appending one event a call (30 words, a 384-float vector) for SECS:
  events/s (the figure of bench/append.py's 32 clients, without HTTP);
- 32 tenants, one such thread each, for SECS: events/s, and the process's native threads;
- ingest: 4 threads appending atomic batches of 100 events into one tenant: events/s;
- threads: the process's native threads with 1 and with 200 open written tenants (one event
  each, no text: no Tantivy writer, the threads that stay per tenant counted apart).

Medians over --runs runs; JSON to bench/out/writerpool.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, scratch_dir, write_json

DIM = 384
SECS = float(os.environ.get("WRITERPOOL_SECS", "5"))
CLIENTS = 32
INGEST_THREADS, INGEST_BATCHES, BATCH = 4, 60, 100
OPEN_TENANTS = 200
HERE = Path(__file__).resolve().parents[1]


def native_threads() -> int:
    """This process's threads, as the kernel counts them."""
    return len(os.listdir("/proc/self/task"))


def manager(root: Path, pool: int | None, max_open: int = 1000) -> Any:
    """A TenantManager on root, with a writer pool of `pool` threads where the tree has one."""
    from storage.tenants.manager import TenantManager

    extra = {} if pool is None else {"writer_threads": pool}
    return TenantManager(root, embedding_dim=DIM, max_open=max_open, **extra)


def closed_loops(m: Any, tenants: list[str], events: list[Any]) -> tuple[float, int]:
    """CLIENTS threads appending one event a call for SECS, thread i into tenants[i % len]:
    events/s and the native threads at the end."""
    it, lock, count = iter(events), threading.Lock(), [0]
    stop = 0.0  # set once the tenants are open

    def loop(tenant: str) -> None:
        n = 0
        with m.use(tenant) as t:
            while time.monotonic() < stop:
                with lock:
                    event = next(it)
                t.submit_append([event]).result()
                n += 1
        with lock:
            count[0] += n

    for tenant in tenants:  # opened before the clock starts
        with m.use(tenant):
            pass
    threads = [
        threading.Thread(target=loop, args=(tenants[i % len(tenants)],)) for i in range(CLIENTS)
    ]
    started = time.monotonic()
    stop = started + SECS
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    rate = count[0] / (time.monotonic() - started)
    return rate, native_threads()


def ingest(m: Any, events: list[Any]) -> float:
    """INGEST_THREADS threads appending atomic batches of BATCH events into one tenant."""
    batches = [events[i * BATCH : (i + 1) * BATCH] for i in range(INGEST_BATCHES)]
    it, lock = iter(batches), threading.Lock()

    def loop() -> None:
        with m.use("ingest") as t:
            while True:
                with lock:
                    batch = next(it, None)
                if batch is None:
                    return
                t.submit_append(batch, atomic=True).result()

    with m.use("ingest"):
        pass
    threads = [threading.Thread(target=loop) for _ in range(INGEST_THREADS)]
    started = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return INGEST_BATCHES * BATCH / (time.monotonic() - started)


def open_threads(root: Path, pool: int | None) -> tuple[int, int]:
    """Native threads with 1, then OPEN_TENANTS, open tenants written once each."""
    from storage.model import NewEvent

    m = manager(root, pool)
    counts = []
    try:
        for first, n in ((0, 1), (1, OPEN_TENANTS - 1)):
            for i in range(first, first + n):
                with m.use(f"open{i}") as t:
                    t.submit_append([NewEvent(kind="k", ts=1, embedding=[1.0] * DIM)]).result()
            counts.append(native_threads())
    finally:
        m.close_all()
    return counts[0], counts[1]


def child(pool: int | None, only_many: bool) -> dict[str, Any]:
    """One configuration's phases (or only the 32 tenants'), in this process."""
    from writepath import corpus  # 30 words and a 384-float vector an event, seeded

    import storage

    events = corpus(20_000 if only_many else 40_000)
    result: dict[str, Any] = {"tree": str(Path(storage.__file__).resolve().parents[1])}
    root = scratch_dir("writerpool")
    try:
        m = manager(root / "a", pool)
        try:
            if not only_many:
                one, _ = closed_loops(m, ["one"], events[20_000:])
                result["one_tenant_32_clients_events_per_sec"] = round(one)
            many, threads = closed_loops(m, [f"c{i}" for i in range(CLIENTS)], events[:20_000])
            result["32_tenants_32_clients_events_per_sec"] = round(many)
            result["32_tenants_native_threads"] = threads
            if not only_many:
                result["ingest_events_per_sec"] = round(ingest(m, events[: INGEST_BATCHES * BATCH]))
        finally:
            m.close_all()
        if not only_many:
            with_one, with_many = open_threads(root / "b", pool)
            result["native_threads_1_open"] = with_one
            result[f"native_threads_{OPEN_TENANTS}_open"] = with_many
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return result


def run_child(tree: Path, pool: int | None, only_many: bool) -> dict[str, Any]:
    """Run one configuration in a child process from `tree`."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    argv = [sys.executable, __file__, "--child"] + ([] if pool is None else ["--pool", str(pool)])
    argv += ["--only-many"] if only_many else []
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True, cwd=tree)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(result["tree"]) == tree.resolve(), (result["tree"], tree)
    return result


def main() -> int:
    """Alternate the configurations --runs times; medians to bench/out/writerpool.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="a copy of the tree before the pool")
    parser.add_argument(
        "--pools", default="default,8", help="pool sizes to measure in this tree (default: its own)"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one short run (a smoke check)")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--pool", type=int, default=None)
    parser.add_argument("--only-many", action="store_true", help="only the 32 tenants' phase")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.pool, args.only_many)))
        return 0
    if args.quick:
        os.environ["WRITERPOOL_SECS"], args.runs, args.pools = "1", 1, "default"
    configs: list[tuple[str, Path, int | None]] = []
    if args.base is not None:
        configs.append(("thread per tenant (base)", args.base, None))
    for n in args.pools.split(","):
        configs.append((f"pool of {n} (this tree)", HERE, None if n == "default" else int(n)))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in configs}
    for r in range(args.runs):
        for name, tree, pool in configs:
            result = run_child(tree, pool, args.only_many)
            print(r, name, result, flush=True)
            runs[name].append(result)
    medians = {
        name: {key: median([float(x[key]) for x in results]) for key in results[0] if key != "tree"}
        for name, results in runs.items()
    }
    print(json.dumps(medians, indent=2))
    write_json("writerpool", {"medians": medians, "runs": runs}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

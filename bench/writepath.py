"""The write path's own cost, in process: what a tenant's writer spends per event.

A tenant on /dev/shm (no disk in the figure) at 384 dimensions, each event 30 words of text
and a client vector: 2,000 one-event appends one after the other (process CPU per event, the
writer's and the index threads' included), 40 atomic batches of 100 events (process CPU per
event), then 32 threads appending one event a call for 3 s (events/s, and the mean group a
commit took). Run it from two trees alternately (PYTHONPATH=<tree>) to compare them: issue 30's
before/after in bench/RESULTS.md.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import parse_args, write_json

from storage.model import NewEvent
from storage.tenants.tenant import Tenant

DIM = 384
SEED = 20261207
SERIAL = 2000
BATCHES, BATCH = 40, 100
THREADS, THREAD_SECS = 32, 3.0


def corpus(n: int) -> list[NewEvent]:
    """The first n events of the corpus: text and a client vector, the same in every run."""
    rng = random.Random(SEED)
    words = [f"w{i}" for i in range(2000)]
    return [
        NewEvent(
            kind="note",
            ts=1_800_000_000_000_000 + i,
            text=" ".join(rng.choices(words, k=30)),
            embedding=[rng.random() for _ in range(DIM)],
            embedding_model="bench",
        )
        for i in range(n)
    ]


def threaded(t: Tenant, events: list[NewEvent]) -> tuple[float, float]:
    """THREADS closed loops of one-event appends for THREAD_SECS: events/s, mean group."""
    sizes: list[int] = []
    t.on_batch = sizes.append  # a measurement hook, set for this phase only
    it, lock, count = iter(events), threading.Lock(), [0]
    stop = time.monotonic() + THREAD_SECS

    def loop() -> None:
        n = 0
        while time.monotonic() < stop:
            with lock:
                event = next(it)
            t.submit_append([event]).result()
            n += 1
        with lock:
            count[0] += n

    started = time.monotonic()
    threads = [threading.Thread(target=loop) for _ in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return count[0] / (time.monotonic() - started), sum(sizes) / max(1, len(sizes))


def run() -> dict[str, Any]:
    """One run of the three phases."""
    events = corpus(SERIAL + BATCHES * BATCH + 20_000)
    root = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="writepath-"))
    t = Tenant.open("t", root / "t", embedding_dim=DIM)
    try:
        t.submit_append([events[0]]).result()
        started = time.process_time()
        for event in events[1:SERIAL]:
            t.submit_append([event]).result()
        one = (time.process_time() - started) / (SERIAL - 1) * 1e6
        started = time.process_time()
        for b in range(BATCHES):
            lo = SERIAL + b * BATCH
            t.submit_append(events[lo : lo + BATCH], atomic=True).result()
        atomic = (time.process_time() - started) / (BATCHES * BATCH) * 1e6
        rate, group = threaded(t, events[SERIAL + BATCHES * BATCH :])
    finally:
        t.close()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "one_event_cpu_us": round(one, 1),
        "atomic_100_cpu_us_per_event": round(atomic, 1),
        "threads_32_events_per_sec": round(rate),
        "threads_32_mean_group": round(group, 1),
    }


def main() -> int:
    """Run once and write bench/out/writepath.json (or --out)."""
    args = parse_args(__doc__.splitlines()[0])
    result = run()
    print(result)
    write_json("writepath", {"result": result}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

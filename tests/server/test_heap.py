"""The heap trimmer (memspine.heap): memory a burst of large buffers freed goes back to the OS."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from storage.heap import available

pytestmark = pytest.mark.skipif(not available(), reason="not glibc: nothing to trim")

REPO = Path(__file__).resolve().parents[2]

# In a process of its own: another test's thread (a tenant's, an embedder's) that allocates
# between two checks would make the second one trim, as it should.
PROBE = """
import json, threading
from memspine import heap
from storage.heap import free_bytes

def resident_anon():
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024

kept = []

def work():
    made = [bytearray(b"x" * (20_000 + i % 5_000)) for i in range(2000)]
    kept.extend(made[::10])  # the rest is freed on return, scattered between the kept ones

workers = [threading.Thread(target=work) for _ in range(8)]  # several threads: several arenas
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
trimmer = heap.HeapTrimmer()
enough = free_bytes() >= heap.TRIM_ABOVE_BYTES
before = resident_anon()
first = trimmer.check()
# At once: reading /proc between the two (an 8 KB buffer from malloc) could move the free figure.
second = trimmer.check()
freed = before - resident_anon()
print(json.dumps({"enough": enough, "first": first, "freed": freed, "second": second,
                  "kept": len(kept), "trims": trimmer.trims}))
"""


def test_a_trim_returns_a_bursts_freed_memory_and_an_idle_heap_is_left_alone() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["enough"] and out["first"]
    assert out["freed"] >= 100 << 20  # ~300 MB freed, scattered between kept ones
    assert not out["second"]  # nothing allocated or freed since: no walk over the arenas
    assert out["kept"] == 8 * 200 and out["trims"] == 1

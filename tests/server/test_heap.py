"""The heap trimmer (memspine.heap): memory a burst of large buffers freed goes back to the OS."""

from __future__ import annotations

import threading

import pytest

from memspine import heap
from storage.heap import available, free_bytes

pytestmark = pytest.mark.skipif(not available(), reason="not glibc: nothing to trim")


def resident_anon() -> int:
    """This process's RssAnon in bytes."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024


def burst(threads: int = 8, buffers: int = 2000) -> list[bytearray]:
    """Large buffers allocated from several threads (several arenas); one in ten is kept."""
    kept: list[bytearray] = []

    def work() -> None:
        made = [bytearray(b"x" * (20_000 + i % 5_000)) for i in range(buffers)]
        kept.extend(made[::10])  # the rest is freed on return, scattered between the kept ones

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return kept


def test_a_trim_returns_a_bursts_freed_memory_and_an_idle_heap_is_left_alone() -> None:
    trimmer = heap.HeapTrimmer()
    kept = burst()
    assert free_bytes() >= heap.TRIM_ABOVE_BYTES
    before = resident_anon()
    assert trimmer.check()
    assert before - resident_anon() >= 100 << 20  # ~300 MB freed, scattered between kept ones
    assert not trimmer.check()  # nothing allocated or freed since: no walk over the arenas
    assert len(kept) == 8 * 200 and trimmer.trims == 1

"""The engine's read threads: values and errors come back, at most `limit` reads run at once, a
cancelled caller waits for its read to end, and close() stops the threads."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from memspine.engine import ReadThreads


def read_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "read"]


def test_a_read_returns_its_value_or_raises_its_error() -> None:
    pool = ReadThreads()

    def boom(_arg: object) -> None:
        raise KeyError("gone")

    async def main() -> None:
        assert await pool.run(lambda x: (x, threading.current_thread().name), 7) == (7, "read")
        with pytest.raises(KeyError, match="gone"):
            await pool.run(boom, None)

    try:
        asyncio.run(main())
    finally:
        pool.close()


def test_reads_one_after_another_reuse_one_thread() -> None:
    pool = ReadThreads()
    seen: set[int] = set()

    async def main() -> None:
        for i in range(50):
            assert await pool.run(lambda x: seen.add(threading.get_ident()) or x, i) == i

    try:
        asyncio.run(main())
        assert len(seen) == 1
    finally:
        pool.close()


def test_at_most_limit_reads_run_at_once_and_the_rest_wait_their_turn() -> None:
    pool = ReadThreads(limit=2)
    lock = threading.Lock()
    running = peak = 0

    def slow(i: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.02)
        with lock:
            running -= 1
        return i

    async def main() -> list[int]:
        return list(await asyncio.gather(*(pool.run(slow, i) for i in range(7))))

    try:
        assert asyncio.run(main()) == list(range(7))
        assert peak == 2
        assert len(read_threads()) >= 2
    finally:
        pool.close()


def test_a_cancelled_caller_waits_for_its_read_to_end() -> None:
    pool = ReadThreads()
    release = threading.Event()
    ended: list[float] = []

    def blocked(_arg: object) -> str:
        release.wait(10)
        ended.append(time.monotonic())
        return "done"

    async def main() -> float:
        task = asyncio.create_task(pool.run(blocked, None))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.sleep(0.05)
        task.cancel()  # a second cancel does not cut the wait short either
        await asyncio.sleep(0.05)
        assert not task.done()  # still waiting: the read holds whatever the caller leased
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic()

    try:
        finished = asyncio.run(main())
        assert ended and ended[0] <= finished
    finally:
        release.set()
        pool.close()


def test_close_stops_the_threads() -> None:
    pool = ReadThreads(limit=3)
    gate = threading.Barrier(3)  # three reads at once: three threads

    def read(_arg: object) -> threading.Thread:
        gate.wait(10)
        return threading.current_thread()

    async def main() -> set[threading.Thread]:
        return set(await asyncio.gather(*(pool.run(read, None) for _ in range(3))))

    threads = asyncio.run(main())
    assert len(threads) == 3 and all(t.name == "read" and t.is_alive() for t in threads)
    pool.close()
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive()

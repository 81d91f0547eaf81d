"""Purges take turns across tenants (memspine/purging.py): one at a time, on a thread below the
server's priority, and a tenant whose purges queue up does not keep another's behind them all.
Counted: how many of the busy tenant's purges ended before the other's did."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import anyio

from memspine.config import Settings
from memspine.engine import Engine
from storage.model import NewEvent

TS = 1_790_000_000_000_000


def test_purges_take_turns_one_at_a_time_on_a_niced_thread(tmp_path: Path) -> None:
    engine = Engine(Settings(data_dir=tmp_path / "data", embedding_dim=4))
    line = engine.purges
    seen: list[tuple[str, int, int]] = []  # (tenant, purges running at once, the thread's nice)
    running = 0
    lock = threading.Lock()

    async def deleted(tenant_id: str) -> None:
        """An event appended and deleted: the tenant has something to purge."""
        ev = NewEvent(kind="note", ts=TS, text=f"{tenant_id} note")
        result = await engine.append(tenant_id, ev)
        await engine.delete(tenant_id, [result.event_id])

    async def purge(tenant_id: str) -> str:
        """A purge whose body notes what ran beside it."""
        async with engine.tenant(tenant_id) as t:

            def body() -> object:
                nonlocal running
                with lock:
                    running += 1
                    me = threading.get_native_id()
                    seen.append((tenant_id, running, os.getpriority(os.PRIO_PROCESS, me)))
                try:
                    return t.purge()
                finally:
                    with lock:
                        running -= 1

            await line.run(tenant_id, body)
        return tenant_id

    async def main() -> None:
        for tenant_id in ("busy", "other"):
            await deleted(tenant_id)
        assert line.shares.try_acquire("holder")  # a purge of a third tenant is under way
        busy = [asyncio.create_task(purge("busy")) for _ in range(4)]
        await asyncio.sleep(0)
        other = asyncio.create_task(purge("other"))
        while line.shares.waiting() < 5:
            await asyncio.sleep(0.01)
        line.shares.release("holder")
        await other
        ahead = sum(task.done() for task in busy)
        await asyncio.gather(*busy)
        # The other tenant came after four of the busy one's, and was served after one.
        assert ahead <= 1, ahead
        assert [s[1] for s in seen] == [1] * 5  # never two at once
        process = os.getpriority(os.PRIO_PROCESS, 0)
        assert {s[2] for s in seen} == {min(19, process + 10)}

    try:
        anyio.run(main)
    finally:
        engine.close()

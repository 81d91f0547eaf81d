"""Purges run one at a time across tenants, on one thread below the server's priority: a large
tenant's purges (CPU to rebuild its indexes, disk to rewrite its log) take turns with other
tenants' (round robin, memspine/shares.py) and leave the cores to the requests first."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from memspine.shares import FairShares

T = TypeVar("T")
NICENESS = 10  # added to the process's own, as the embedder's and the vector inserter's


def _lower_priority() -> None:
    """The purge thread's nice value, raised once for its whole life."""
    with contextlib.suppress(OSError, AttributeError):
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, os.getpriority(os.PRIO_PROCESS, me) + NICENESS)


class PurgeLine:
    """One purge at a time, tenants waiting take turns; each on the niced purge thread."""

    def __init__(self) -> None:
        self.shares = FairShares(1, per_owner=1)
        self._thread = ThreadPoolExecutor(
            1, thread_name_prefix="purge", initializer=_lower_priority
        )

    async def run(self, tenant_id: str, purge: Callable[[], T]) -> T:
        """Run `purge` of tenant_id in its turn; its result."""
        async with self.shares.slot(tenant_id):
            return await asyncio.wrap_future(self._thread.submit(purge))

    def close(self) -> None:
        """Let a purge under way finish, then end the thread."""
        self._thread.shutdown(wait=True, cancel_futures=True)

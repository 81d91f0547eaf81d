"""The threads an open tenant runs of its own, counted (the figure memspine/config.py's default
cap and docs/operations.md rely on; its writes go through the shared writer pool): opening
tenants adds at most THREADS_PER_TENANT native threads each once they are idle (their Tantivy
indexes let go, storage/index/held.py), and closing them takes any threads away again."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from memspine.config import MAX_TENANT_THREADS, THREADS_PER_TENANT, default_max_open_tenants
from storage.index.held import held
from storage.model import NewEvent
from storage.tenants.manager import TenantManager
from tests.support.wait import wait_until

TENANTS = 12


def native_threads() -> int:
    """This process's threads, as the kernel counts them."""
    return len(os.listdir("/proc/self/task"))


def settled_threads(still: float = 1.0, bound: float = 30.0) -> int:
    """The thread count once it has held still for `still` seconds: threads of earlier tests in
    this process (a let-go Tantivy index's watcher ends at its next poll) go meanwhile, and a
    count taken while they go would make the counts after it look like fewer threads."""
    deadline = time.monotonic() + bound
    count, since = native_threads(), time.monotonic()
    while time.monotonic() - since < still and time.monotonic() < deadline:
        time.sleep(0.05)
        now = native_threads()
        if now != count:
            count, since = now, time.monotonic()
    return count


def test_an_open_tenant_runs_at_most_the_documented_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(held(), "linger", 0.3)  # idle sooner than LINGER_SECS
    manager = TenantManager(tmp_path, embedding_dim=4, max_open=100)
    try:
        with manager.use("warm") as t:  # the process's shared pools start with a first tenant
            t.submit_append(
                [NewEvent(kind="note", ts=1, text="warm", embedding=[1, 0, 0, 0])]
            ).result()
        before = settled_threads()
        peak = before
        for i in range(TENANTS):
            with manager.use(f"t{i}") as t:
                events = [NewEvent(kind="note", ts=2, text=f"note {i}", embedding=[0, 1, 0, 0])]
                t.submit_append(events).result()
            peak = max(peak, native_threads())
        assert peak > before  # the tenants did start threads (their indexes' watchers, folds)
        # A Tantivy writer's threads live while its fold has work, its watcher while its index
        # is held: once the folds are done and the indexes idle, no tenant keeps one.
        wait_until(
            lambda: native_threads() - before <= THREADS_PER_TENANT * (TENANTS + 1),
            "the open tenants' threads to settle at their documented count",
        )
    finally:
        manager.close_all()
    deadline = time.monotonic() + 30
    while native_threads() > before:  # every tenant's threads gone, "warm"'s too
        assert time.monotonic() < deadline, "closed tenants left threads behind"
        time.sleep(0.05)
    assert default_max_open_tenants() * THREADS_PER_TENANT <= MAX_TENANT_THREADS

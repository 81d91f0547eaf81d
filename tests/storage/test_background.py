"""The shared background pool (storage/index/background.py): a bounded set of niced workers that
runs every task in turn, so one index's backlog never starves another's, and a cancelled task is
never run again."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from storage.index.background import Pool
from tests.support.wait import wait_until


def test_a_task_that_always_wants_more_does_not_starve_another() -> None:
    pool = Pool(workers=1)
    hog_steps: list[int] = []
    other_steps: list[int] = []

    def hog_step() -> float:
        hog_steps.append(1)
        return 0.0  # never done

    def other_step() -> float | None:
        other_steps.append(1)
        return 0.0 if len(other_steps) < 5 else None

    hog = pool.task(hog_step, "hog")
    other = pool.task(other_step, "other")
    hog.wake()
    wait_until(lambda: len(hog_steps) > 10, "the hog ran")
    other.wake()
    wait_until(lambda: len(other_steps) == 5, "the other task ran all its steps")
    # Round-robin: while the other had steps left, the hog ran about once between two of them.
    assert len(hog_steps) > 10
    hog.cancel()
    after = len(hog_steps)
    wait_until(lambda: len(other_steps) == 5, "settled")
    assert len(hog_steps) == after  # a cancelled task never runs again


def test_a_timer_runs_a_task_again_and_a_wake_cuts_it_short() -> None:
    pool = Pool(workers=2)
    steps: list[int] = []

    def step() -> float:
        steps.append(1)
        return 3600.0  # back in an hour

    task = pool.task(step, "slow")
    task.wake()
    wait_until(lambda: len(steps) == 1, "first step")
    task.wake()  # the hour is cut short
    wait_until(lambda: len(steps) == 2, "woken before its timer")
    task.cancel()


def test_cancel_waits_for_a_running_step() -> None:
    pool = Pool(workers=2)
    started, go, finished = threading.Event(), threading.Event(), threading.Event()

    def step() -> None:
        started.set()
        assert go.wait(30)
        finished.set()

    task = pool.task(step, "held")
    task.wake()
    assert started.wait(30)
    canceller = threading.Thread(target=task.cancel)
    canceller.start()
    canceller.join(timeout=0.2)
    assert canceller.is_alive(), "cancel returned while the step still ran"
    go.set()
    canceller.join(timeout=30)
    assert not canceller.is_alive() and finished.is_set()


def test_workers_are_bounded_and_a_failing_step_keeps_its_worker() -> None:
    pool = Pool(workers=2)
    ran: list[str] = []

    def bad() -> None:
        raise RuntimeError("a bug in one task")

    tasks = [pool.task(bad, "bad")] + [
        pool.task(lambda i=i: ran.append(f"t{i}"), f"t{i}")  # type: ignore[misc]
        for i in range(20)
    ]
    for task in tasks:
        task.wake()
    wait_until(lambda: len(ran) == 20, "every task ran")
    assert pool.threads() == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_the_workers_run_niced() -> None:
    pool = Pool(workers=1, niceness=5)
    seen: list[int] = []
    task = pool.task(
        lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())), "n"
    )
    task.wake()
    wait_until(lambda: seen, "the step ran")
    ours = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert seen == [min(19, ours + 5)]  # 19 is the lowest priority there is

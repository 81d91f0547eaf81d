"""Short reads (a recall, one event) run on the event loop when nothing else is under way, and on
a read thread otherwise; the answers are the same either way."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from memspine.config import Settings
from memspine.engine import Engine
from storage.model import NewEvent
from storage.read.recall import RecallQuery
from storage.tenants.tenant import Tenant

TENANT = "acme"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = Engine(Settings(data_dir=tmp_path, embedding_dim=4))
    yield eng
    eng.close()


def _where(t: Tenant) -> str:
    """Which thread ran the read."""
    return threading.current_thread().name


async def _append(engine: Engine, text: str) -> str:
    event = NewEvent(kind="turn", ts=1, text=text, embedding=[1.0, 0.0, 0.0, 0.0])
    result = await engine.append(TENANT, event)
    return result.event_id


async def _settle(engine: Engine) -> None:
    """Wait until the keyword index has committed everything published."""
    async with engine.tenant(TENANT) as t:
        await asyncio.to_thread(t.keyword.flush)


def test_a_short_read_alone_runs_on_the_loop(engine: Engine) -> None:
    async def main() -> tuple[str, str]:
        await _append(engine, "parcel signed for")
        await _settle(engine)
        loop_thread = threading.current_thread().name
        return loop_thread, await engine.read(TENANT, _where, short=True)

    loop_thread, ran_on = asyncio.run(main())
    assert ran_on == loop_thread


def test_other_reads_always_take_a_thread(engine: Engine) -> None:
    async def main() -> str:
        await _append(engine, "parcel signed for")
        await _settle(engine)
        return await engine.read(TENANT, _where)

    assert asyncio.run(main()) == "read"


def test_a_short_read_beside_another_request_takes_a_thread(engine: Engine) -> None:
    release = threading.Event()

    def slow(t: Tenant) -> str:
        release.wait(10)
        return _where(t)

    async def main() -> tuple[str, str]:
        await _append(engine, "parcel signed for")
        await _settle(engine)
        busy = asyncio.ensure_future(engine.read(TENANT, slow))
        await asyncio.sleep(0.05)  # the slow read holds its tenant lease now
        short = await engine.read(TENANT, _where, short=True)
        release.set()
        return short, await busy

    short, slow_ran_on = asyncio.run(main())
    assert short == "read" and slow_ran_on == "read"


def test_a_short_read_does_not_wait_for_the_keyword_fold(engine: Engine) -> None:
    """A recall searches what the fold has not committed beside the index: no wait, so no thread."""

    async def main() -> tuple[bool, str]:
        await _append(engine, "parcel signed for")
        await _settle(engine)
        await _append(engine, "refund issued")  # the fold gathers for a while before committing
        async with engine.tenant(TENANT) as t:
            settled = t.keyword.settled()
        return settled, await engine.read(TENANT, _where, short=True)

    settled, ran_on = asyncio.run(main())
    assert not settled
    assert ran_on == "MainThread"


def test_recall_answers_alike_on_the_loop_and_on_a_thread(engine: Engine) -> None:
    """The same recall, once alone (on the loop) and once beside a busy request (on a thread)."""
    release = threading.Event()
    query = RecallQuery(text="parcel signed", embedding=[1.0, 0.0, 0.0, 0.0], k=5)

    async def main() -> tuple[list[str], list[str]]:
        for text in ("parcel signed for at number 16", "refund issued", "parcel lost"):
            await _append(engine, text)
        await _settle(engine)
        alone = await engine.recall(TENANT, query)
        busy = asyncio.ensure_future(engine.read(TENANT, lambda t: release.wait(10)))
        await asyncio.sleep(0.05)
        beside = await engine.recall(TENANT, query)
        release.set()
        await busy
        return [h.event.event_id for h in alone.hits], [h.event.event_id for h in beside.hits]

    alone, beside = asyncio.run(main())
    assert len(alone) == 3
    assert alone == beside


@pytest.mark.parametrize("held", ["log", "vectors"])
def test_a_short_read_beside_an_exclusive_hold_takes_a_thread(engine: Engine, held: str) -> None:
    """A purge's swap holds the log lock exclusive, a graph resize or save the vector index's:
    a read waits for them on a thread, not on the loop."""
    holding, release = threading.Event(), threading.Event()

    def read(t: Tenant) -> str:
        if held == "log":
            with t.log.reader():
                pass
        else:
            t.vectors.search([1.0, 0.0, 0.0, 0.0], 1)
        return _where(t)

    async def main() -> tuple[bool, str]:
        await _append(engine, "parcel signed for")
        await _settle(engine)
        async with engine.tenant(TENANT) as t:
            lock = t.log.lock if held == "log" else t.vectors.lock

        def hold() -> None:
            with lock.exclusive():
                holding.set()
                release.wait(10)

        threading.Thread(target=hold).start()
        holding.wait(5)
        task = asyncio.ensure_future(engine.read(TENANT, read, short=True))
        await asyncio.sleep(0.05)  # returns: the loop is free while the read waits
        waiting = not task.done()
        release.set()
        return waiting, await task

    waiting, ran_on = asyncio.run(main())
    assert waiting
    assert ran_on == "read"

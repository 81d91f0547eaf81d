"""An open tenant's log lets its LMDB environment go once unused, and opens it again at its next
use (storage/log/held.py): an idle open tenant holds no file descriptor."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from storage.log import held as held_module
from storage.log.held import HeldLogs
from storage.model import NewEvent
from storage.tenants.tenant import Tenant
from tests.support.wait import wait_until

DIM = 4


def fds_under(root: Path) -> int:
    """This process's descriptors open on files under root."""
    inside = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        inside += target.startswith(str(root))
    return inside


def event(text: str) -> NewEvent:
    return NewEvent(kind="turn", ts=1_000_000, text=text, embedding=[1.0, 0.0, 0.5, 0.25])


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> HeldLogs:
    """A registry of this test's own, with a short linger and a limit of two."""
    fresh = HeldLogs(limit=2, linger=0.2)  # past it, down to 1 (nine tenths, rounded down)
    monkeypatch.setattr(held_module, "_held", fresh)
    return fresh


def test_an_idle_log_holds_no_descriptor_and_its_next_read_opens_it(
    tmp_path: Path, registry: HeldLogs
) -> None:
    tenant = Tenant.open("t", tmp_path / "t", embedding_dim=DIM)
    try:
        [result] = tenant.submit_append([event("the first fact")]).result(timeout=30)
        assert fds_under(tmp_path / "t" / "events") == 3  # data file twice, lock file
        # Let go after the linger (the keyword index's Tantivy index goes on its own clock).
        wait_until(lambda: not tenant.log.is_held(), "the log let go", 30)
        assert fds_under(tmp_path / "t" / "events") == 0
        got = tenant.get(result.event_id)
        assert got is not None and got.event.text == "the first fact"
        assert tenant.log.is_held()
        assert fds_under(tmp_path / "t" / "events") == 3
        # A write to a log let go opens it again too, and loses nothing.
        wait_until(lambda: not tenant.log.is_held(), "the log let go again", 30)
        [second] = tenant.submit_append([event("the second fact")]).result(timeout=30)
        assert tenant.get(second.event_id) is not None
    finally:
        tenant.close()
    assert fds_under(tmp_path / "t" / "events") == 0
    assert len(registry) == 0
    again = Tenant.open("t", tmp_path / "t", embedding_dim=DIM)
    try:
        assert again.get(result.event_id) is not None
        assert again.get(second.event_id) is not None
    finally:
        again.close()


def test_past_the_limit_the_least_recently_used_logs_let_go(
    tmp_path: Path, registry: HeldLogs
) -> None:
    registry.linger = 3600.0  # only the limit lets go here
    tenants = [Tenant.open(f"t{i}", tmp_path / f"t{i}", embedding_dim=DIM) for i in range(5)]
    try:
        for t in tenants:
            with t.log.reader() as r:
                assert r.last_seq() == 0
        wait_until(lambda: len(registry) <= 2, f"two held (now {len(registry)})", 30)
        held = [t.log.is_held() for t in tenants]
        # The last sweep kept the one used last; one used after it may be held beside it.
        assert held[:3] == [False, False, False] and held[4], held
        assert fds_under(tmp_path) == 3 * sum(held)
    finally:
        for t in tenants:
            t.close()
    assert fds_under(tmp_path) == 0


def test_a_log_in_use_is_not_let_go(tmp_path: Path, registry: HeldLogs) -> None:
    tenant = Tenant.open("t", tmp_path / "t", embedding_dim=DIM)
    try:
        with tenant.log.reader() as r:
            assert not tenant.log.let_go()  # a read transaction holds it
            assert r.last_seq() == 0
        assert tenant.log.let_go()
        assert not tenant.log.is_held()
    finally:
        tenant.close()


def test_reads_and_writes_racing_let_goes_lose_nothing(tmp_path: Path, registry: HeldLogs) -> None:
    """Let go as often as it can be while two threads write and read: every write is there,
    every read answers, and the environment is opened again as often as it is needed."""
    tenant = Tenant.open("t", tmp_path / "t", embedding_dim=DIM)
    ids: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def write() -> None:
        try:
            for i in range(40):
                [done] = tenant.submit_append([event(f"fact {i}")]).result(timeout=30)
                ids.append(done.event_id)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            stop.set()

    def read() -> None:
        try:
            while not stop.is_set():
                with tenant.log.reader() as r:
                    assert r.last_seq() >= 0
        except BaseException as exc:
            errors.append(exc)

    let_goes = 0
    workers = [threading.Thread(target=write), threading.Thread(target=read)]
    try:
        for w in workers:
            w.start()
        while not stop.is_set():
            let_goes += tenant.log.let_go() and not tenant.log.is_held()
        for w in workers:
            w.join(timeout=60)
        assert errors == []
        assert let_goes > 0
        assert all(tenant.get(i) is not None for i in ids) and len(ids) == 40
    finally:
        tenant.close()
    again = Tenant.open("t", tmp_path / "t", embedding_dim=DIM)
    try:
        assert all(again.get(i) is not None for i in ids)
    finally:
        again.close()

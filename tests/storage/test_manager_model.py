"""TenantManager against a plain model, as a hypothesis state machine on real stores: tenants
opened, held, released, closed when idle, evicted by a cap of two, written to, deleted from,
purged and the whole manager restarted on the same directory. After every step no acknowledged
event is lost, no deleted one is readable or found by its word, no more tenants are open than the
cap, and a tenant with a request in flight is open."""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from storage.errors import Unavailable
from storage.model import NewEvent
from storage.tenants.manager import Lease, TenantManager
from storage.tenants.tenant import Tenant

CAP = 2
DIM = 4
TENANTS = st.sampled_from(["ada", "bob", "cy", "dee"])
FOREVER = 10**9  # seconds: close_idle(now=+FOREVER) closes every idle tenant


class ManagerModel(RuleBasedStateMachine):
    """The model: each tenant's acknowledged live events (id -> its one word) and deleted ids."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.live: dict[str, dict[str, str]] = {}
        self.deleted: dict[str, set[str]] = {}
        self.held: list[tuple[str, Lease]] = []
        self.words = itertools.count()
        self.manager = self._manager()

    def _manager(self) -> TenantManager:
        return TenantManager(self.root, embedding_dim=DIM, max_open=CAP)

    def _open_ids(self) -> set[str]:
        return {t.tenant_id for t in self.manager.open_tenants()}

    def _held_ids(self) -> set[str]:
        return {name for name, _lease in self.held}

    def _room_is_held(self, name: str) -> bool:
        """Whether opening `name` must be refused: not open, and every slot held by a request."""
        return name not in self._open_ids() and len(self._held_ids()) >= CAP

    def _refused(self, name: str) -> None:
        """A request for `name` is answered 503 at once (and, if it is not, gives its lease back)."""
        try:
            lease = self.manager.lease(name)
        except Unavailable:
            return
        lease.release()
        raise AssertionError(f"{name} was let in while every slot was held")

    @initialize()
    def start(self) -> None:
        assert self.manager.open_count() == 0

    # -- requests ---------------------------------------------------------------------------

    @rule(name=TENANTS, n=st.integers(1, 3))
    def append(self, name: str, n: int) -> None:
        words = [f"w{next(self.words)}x" for _ in range(n)]
        events = [NewEvent(kind="turn", ts=1_000_000 + i, text=w) for i, w in enumerate(words)]
        if self._room_is_held(name):
            self._refused(name)
            return
        with self.manager.use(name) as tenant:
            results = tenant.submit_append(events).result(timeout=60)
        for result, word in zip(results, words, strict=True):
            self.live.setdefault(name, {})[result.event_id] = word

    @precondition(lambda self: any(self.live.values()))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(n for n, ev in self.live.items() if ev)))
        if self._room_is_held(name):
            return
        event_id = data.draw(st.sampled_from(sorted(self.live[name])))
        with self.manager.use(name) as tenant:
            assert tenant.submit_delete([event_id]).result(timeout=60) == [event_id]
        del self.live[name][event_id]
        self.deleted.setdefault(name, set()).add(event_id)

    @precondition(lambda self: any(self.deleted.values()))
    @rule(data=st.data())
    def purge(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(n for n, ids in self.deleted.items() if ids)))
        if self._room_is_held(name):
            return
        with self.manager.use(name) as tenant:
            tenant.purge()

    @rule(name=TENANTS)
    def read(self, name: str) -> None:
        if self._room_is_held(name) and (self.root / name).exists():
            return
        with self.manager.use(name, create=False) as tenant:
            self._check(name, tenant)

    @rule(name=TENANTS)
    def hold(self, name: str) -> None:
        """A request that stays in flight until `release`."""
        if self._room_is_held(name):
            self._refused(name)
            return
        lease = self.manager.lease(name)
        lease.wait()
        self.held.append((name, lease))

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        _name, lease = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        lease.release()

    # -- closing ----------------------------------------------------------------------------

    @rule()
    def close_idle(self) -> None:
        before = self._open_ids()
        closed = self.manager.close_idle(now=time.monotonic() + FOREVER)
        assert self._open_ids() == before & self._held_ids()
        assert closed == len(before - self._held_ids())

    @rule()
    def restart(self) -> None:
        """Every request done, the manager shut down and a new one opened on the same directory."""
        self._release_all()
        self.manager.close_all()
        self.manager = self._manager()

    def _release_all(self) -> None:
        while self.held:
            self.held.pop()[1].release()

    # -- what holds after every step ----------------------------------------------------------

    @invariant()
    def within_the_cap(self) -> None:
        assert self.manager.open_count() <= CAP
        assert self.manager.stats().open <= CAP

    @invariant()
    def a_held_tenant_is_open(self) -> None:
        assert self._held_ids() <= self._open_ids()

    def _check(self, name: str, tenant: Tenant) -> None:
        """Every acknowledged live event readable and found by its word; no deleted one."""
        live, deleted = self.live.get(name, {}), self.deleted.get(name, set())
        with tenant.log.reader() as r:
            assert r.count() == len(live)
        for event_id, word in live.items():
            state = tenant.get(event_id)
            assert state is not None and state.event.text == word, (name, event_id)
            assert [e for e, _score in tenant.keyword.search(word, limit=5)] == [event_id]
        for event_id in deleted:
            assert tenant.get(event_id) is None, (name, event_id)

    def teardown(self) -> None:
        self._release_all()
        self.manager.close_all()
        for name in sorted(set(self.live) | set(self.deleted)):  # each opened straight from disk
            tenant = Tenant.open(name, self.root / name, embedding_dim=DIM)
            try:
                self._check(name, tenant)
            finally:
                tenant.close()


def test_the_manager_keeps_what_it_acknowledged_within_its_cap(tmp_path: Path) -> None:
    examples = itertools.count()

    def machine() -> ManagerModel:
        root = Path(tempfile.mkdtemp(prefix=f"ex{next(examples)}-", dir=tmp_path))
        return ManagerModel(root / "data")

    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=12,
            stateful_step_count=20,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    shutil.rmtree(tmp_path, ignore_errors=True)

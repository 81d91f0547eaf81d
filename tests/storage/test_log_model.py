"""A hypothesis state machine: the event log against a plain in-memory model, across reopens."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import uuid
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage.errors import IdempotencyMismatch
from storage.log import layout as enc
from storage.log.eventlog import EventLog
from storage.model import SOURCE_FROM, AppendResult, NewEvent
from storage.read.listing import ListQuery, list_events
from tests.support.budget import size

KINDS = st.sampled_from(["turn", "fact", "tool_call"])
TIMES = st.integers(0, 20)  # a narrow range, so equal times (ties broken by id) are common
KEYS = st.sampled_from([None, None, "CHG-1", "CHG-2", "CHG-3"])
NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "memspine:model")


class Model:
    """What the log should hold: live events, their links, idempotency records."""

    def __init__(self) -> None:
        self.events: dict[str, tuple[str, int, str]] = {}  # id -> (kind, ts, text)
        self.links: dict[str, list[str]] = {}  # id -> live sources, in link order
        self.deleted: set[str] = set()
        self.idem: dict[str, tuple[bytes, str, list[str]]] = {}  # key -> (hash, id, unlinked)

    def newest_first(self, kind: str | None, since: int | None, until: int | None) -> list[str]:
        """Ids the listing should give, newest first, ties broken by id bytes."""
        picked = [
            (ts, enc.id_bytes(i), i)
            for i, (k, ts, _text) in self.events.items()
            if (kind is None or k == kind)
            and (since is None or ts >= since)
            and (until is None or ts < until)
        ]
        return [i for _ts, _raw, i in sorted(picked, reverse=True)]


class LogMachine(RuleBasedStateMachine):
    """Appends, deletes, reads, listings and reopens, each checked against the model."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="memspine-model-"))
        self.log = EventLog.open(self.dir / "events", embedding_dim=4)
        self.model = Model()
        self.counter = 0

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _pick(self, index: int, *, live_only: bool = False) -> str:
        """An id chosen by index among live, deleted and never-seen ids."""
        pool = (
            sorted(self.model.events)
            if live_only
            else sorted(self.model.events) + sorted(self.model.deleted)
        )
        if not pool or index >= len(pool):
            return str(uuid.UUID(int=index + 1))  # never appended
        return pool[index]

    @rule(
        kind=KINDS,
        ts=TIMES,
        key=KEYS,
        variant=st.integers(0, 1),
        picks=st.lists(st.integers(0, 12), max_size=4),
    )
    def append(self, kind: str, ts: int, key: str | None, variant: int, picks: list[int]) -> None:
        sources = tuple(self._pick(p) for p in picks)
        self.counter += 1
        text = f"event {self.counter}" if key is None else f"{key} variant {variant}"
        body_hash = (
            hashlib.sha256(f"{kind}|{ts}|{text}|{sources}".encode()).digest() if key else None
        )
        ev = NewEvent(
            kind=kind,
            ts=ts,
            text=text,
            source_ids=sources,
            event_id=str(uuid.uuid5(NAMESPACE, key)) if key else None,
            body_hash=body_hash,
        )
        [result] = self.log.append_batch([ev])
        if key is not None and key in self.model.idem:
            first_hash, first_id, first_unlinked = self.model.idem[key]
            if first_hash != body_hash:
                assert isinstance(result, IdempotencyMismatch)
                return
            assert isinstance(result, AppendResult) and result.replayed
            assert (result.event_id, result.unlinked) == (first_id, first_unlinked)
            return
        assert isinstance(result, AppendResult) and not result.replayed
        live = list(dict.fromkeys(s for s in sources if s in self.model.events))
        unlinked = [s for s in dict.fromkeys(sources) if s not in live]
        assert result.unlinked == unlinked
        self.model.events[result.event_id] = (kind, ts, text)
        self.model.links[result.event_id] = live
        if key is not None:
            assert body_hash is not None
            self.model.idem[key] = (body_hash, result.event_id, unlinked)

    @rule(index=st.integers(0, 15))
    def delete(self, index: int) -> None:
        target = self._pick(index)
        expected = [target] if target in self.model.events else []
        with self.log.reader() as r:
            last = r.last_seq()
        assert self.log.delete([target]) == expected
        with self.log.reader() as r:
            # A delete is a new operation past every earlier one, or projections would skip it.
            assert r.last_seq() == (last + 1 if expected else last)
        if expected:
            del self.model.events[target]
            del self.model.links[target]
            self.model.deleted.add(target)
            for sources in self.model.links.values():
                if target in sources:
                    sources.remove(target)

    @rule(index=st.integers(0, 15))
    def get(self, index: int) -> None:
        target = self._pick(index)
        with self.log.reader() as r:
            ev = r.get(target)
        if target in self.model.events:
            assert ev is not None
            assert (ev.kind, ev.ts, ev.text) == self.model.events[target]
        else:
            assert ev is None

    @rule(
        kind=st.none() | KINDS,
        since=st.none() | TIMES,
        until=st.none() | TIMES,
        limit=st.integers(1, 7),
    )
    def list_pages(
        self, kind: str | None, since: int | None, until: int | None, limit: int
    ) -> None:
        if since is not None and until is not None and since > until:
            since, until = until, since
        seen: list[str] = []
        cursor = None
        while True:
            with self.log.reader() as r:
                page, cursor = list_events(
                    r, ListQuery(kind=kind, since=since, until=until, limit=limit, cursor=cursor)
                )
            assert len(page) <= limit
            seen += [e.event_id for e in page]
            if cursor is None:
                break
        assert seen == self.model.newest_first(kind, since, until)

    @precondition(lambda self: self.counter > 0)
    @rule()
    def reopen(self) -> None:
        self.log.close()
        self.log = EventLog.open(self.dir / "events", embedding_dim=4)

    @invariant()
    def links_match(self) -> None:
        with self.log.reader() as r:
            assert r.count() == len(self.model.events)
            for event_id, sources in self.model.links.items():
                assert r.links_out(event_id, SOURCE_FROM) == sources
            for target in self.model.events:
                linking = {e for e, s in self.model.links.items() if target in s}
                assert set(r.links_in(target, SOURCE_FROM)) == linking
            for gone in self.model.deleted:
                assert r.tombstone(gone) is not None


LogMachine.TestCase.settings = settings(
    max_examples=size(100, 30),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLogAgainstModel = pytest.mark.long(LogMachine.TestCase)

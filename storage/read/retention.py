"""Retention over one snapshot: which events are past their kind's window, what legal holds keep,
and what a tenant's retention looks like (docs/erasure.md, "Retention and legal holds").

An event is due when its `ts` is older than its kind's window: the days given for its kind, else
those given for "*", else it is kept. Each event goes by its own kind and `ts` (a superseding
event extends no window, a derived one keeps its own). Nothing here writes: the server deletes
what `due` selects through the tenant's ordinary delete.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Protocol, TypeVar

import msgspec

from storage import failpoints, files
from storage.errors import LegalHold
from storage.log import layout
from storage.log.eventlog import read_only
from storage.log.reader import LogReader
from storage.read.cascade import derived_closure

DAY_US = 86_400 * 1_000_000
ANY_KIND = "*"  # the window of every kind not named
HORIZON_DAYS = 7  # what `outlook` counts as coming due soon


class Hold(Protocol):
    """A legal hold as retention needs it: tenant-wide (subject None) or on one data subject."""

    @property
    def hold_id(self) -> str:
        """The hold's id (its refusals name it)."""
        ...

    @property
    def subject(self) -> str | None:
        """The data subject it keeps, None for the whole tenant."""
        ...


H = TypeVar("H", bound=Hold)


def holds_blocking(holds: Iterable[H], event: object) -> H | None:
    """The first hold that keeps this event: a tenant-wide one, or one on a subject the event is
    about (its `subjects`); None if no hold keeps it."""
    subjects = getattr(event, "subjects", None) or ()
    for hold in holds:
        if hold.subject is None or hold.subject in subjects:
            return hold
    return None


class Policy(msgspec.Struct, frozen=True):
    """The windows in force for one tenant, in days: kind -> days, ANY_KIND for the rest (the
    tenant's own, else the server's MEMSPINE_RETENTION_DAYS); no entry for a kind: kept."""

    windows: dict[str, int]

    @classmethod
    def of(cls, own: Mapping[str, int] | None, default_days: int | None) -> Policy:
        """The tenant's own windows, with the server's default for the rest unless it set "*"."""
        windows = dict(own or {})
        if default_days is not None:
            windows.setdefault(ANY_KIND, default_days)
        return cls(windows)

    def cutoff(self, kind: str, now: int) -> int | None:
        """The ts below which an event of this kind is due at `now` (µs); None: kept."""
        days = self.windows.get(kind, self.windows.get(ANY_KIND))
        return None if days is None else now - days * DAY_US

    def is_due(self, kind: str, ts: int, now: int) -> bool:
        """Whether an event of this kind and ts is past its window at `now`."""
        cutoff = self.cutoff(kind, now)
        return cutoff is not None and ts < cutoff


class Due(msgspec.Struct, frozen=True):
    """One batch of due events: the ids to delete, how many due ones holds kept (and their
    ids), and where each kind's scan resumes (its next batch starts at that ts, inclusive: an
    event held there, as others of the same ts, is read again, so a run counts held ids once)."""

    event_ids: list[str]
    held: int
    resume: dict[str, int]
    held_ids: list[str] = []


class Outlook(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's retention at a glance: its oldest event's ts, how many events are due now and
    within HORIZON_DAYS (held ones included), and the kinds it holds."""

    oldest_event: int | None
    due_now: int
    due_next_7_days: int
    kinds: list[str]


def kinds(r: LogReader) -> list[str]:
    """The kinds of the tenant's live events, in key order, one seek per kind."""
    found: list[str] = []
    cur = r.txn.cursor(db=r.dbs["by_kind"])
    ok = cur.set_range(b"")
    while ok:
        key = bytes(cur.key())
        size = int.from_bytes(key[:2], "big")
        prefix = key[: 2 + size]
        found.append(prefix[2:].decode())
        # Past every key of this kind: its time keys are TIME_KEY_BYTES long.
        ok = cur.set_range(prefix + b"\xff" * (layout.TIME_KEY_BYTES + 1))
    return found


def due(
    r: LogReader,
    policy: Policy,
    now: int,
    limit: int,
    holds: Iterable[Hold] = (),
    resume: Mapping[str, int] | None = None,
) -> Due:
    """Up to `limit` due events no hold keeps, oldest first within each kind; a tenant-wide hold
    keeps them all (nothing is examined)."""
    holds = list(holds)
    if any(h.subject is None for h in holds):
        return Due([], 0, dict(resume or {}))
    chosen: list[str] = []
    held: list[str] = []
    after = dict(resume or {})
    for kind in kinds(r):
        cutoff = policy.cutoff(kind, now)
        if cutoff is None:
            continue
        for event_id, ts in _below(r, kind, after.get(kind), cutoff):
            after[kind] = ts
            if holds and holds_blocking(holds, r.get_light(event_id)) is not None:
                held.append(event_id)
                continue
            chosen.append(event_id)
            if len(chosen) >= limit:
                return Due(chosen, len(held), after, held)
    return Due(chosen, len(held), after, held)


def _below(r: LogReader, kind: str, lo: int | None, hi: int) -> Iterator[tuple[str, int]]:
    """(id, ts) of a kind's events with lo <= ts < hi, oldest first."""
    for raw_id, ts in r.times_by_kind(kind, lo, hi):
        yield layout.id_str(raw_id), ts


def first_held(r: LogReader, holds: Iterable[H], event_ids: Iterable[str]) -> tuple[H, str] | None:
    """The first of these live events a hold keeps, with the hold; None if none is kept."""
    holds = list(holds)
    if not holds:
        return None
    for event_id in event_ids:
        event = r.get_light(event_id)
        if event is None:
            continue
        hold = holds_blocking(holds, event)
        if hold is not None:
            return hold, event_id
    return None


def refuse_held(
    r: LogReader, holds: Iterable[Hold], event_ids: Iterable[str], *, cascade: bool = False
) -> None:
    """LegalHold naming the hold if one keeps any live event a delete of these ids would remove
    (with cascade, what derives from them too)."""
    ids: Iterable[str] = event_ids
    if cascade:
        ids = [d for event_id in event_ids for d in derived_closure(r, event_id)]
    found = first_held(r, holds, ids)
    if found is not None:
        hold, event_id = found
        whose = "the tenant" if hold.subject is None else "a data subject of the event"
        raise LegalHold(
            f"event {event_id} is under legal hold {hold.hold_id} (on {whose}); nothing was "
            "deleted: lift the hold to delete it",
            hold_id=hold.hold_id,
        )


def unheld(
    holds: Callable[[], Iterable[Hold]], event_ids: list[str], *, cascade: bool = False
) -> Callable[[LogReader], list[str]]:
    """What a delete of these ids removes (with cascade, what derives from them too), as the
    `find` of Tenant.submit_delete_found: it runs on the tenant's writer and reads the holds
    then, so a hold placed while the delete waited in the queue stops it (LegalHold, nothing
    deleted), not only one standing when it was asked."""

    def find(r: LogReader) -> list[str]:
        failpoints.hit("delete.held")
        ids = event_ids
        if cascade:
            ids = list(dict.fromkeys(d for e in event_ids for d in derived_closure(r, e)))
        refuse_held(r, holds(), ids)
        return ids

    return find


def outlook(r: LogReader, policy: Policy, now: int) -> Outlook:
    """The tenant's oldest event and its counts of due events, now and within HORIZON_DAYS."""
    oldest = next(r.ids_by_ts(None, None), None)
    oldest_ts = None if oldest is None else _ts_of(r, oldest)
    soon = now + HORIZON_DAYS * DAY_US
    due_now = due_soon = 0
    held_kinds = kinds(r)
    for kind in held_kinds:
        cutoff_now, cutoff_soon = policy.cutoff(kind, now), policy.cutoff(kind, soon)
        if cutoff_now is None or cutoff_soon is None:
            continue
        for _event_id, ts in _below(r, kind, None, cutoff_soon):
            due_soon += 1
            due_now += ts < cutoff_now
    return Outlook(
        oldest_event=oldest_ts, due_now=due_now, due_next_7_days=due_soon, kinds=held_kinds
    )


def _ts_of(r: LogReader, event_id: str) -> int | None:
    event = r.get_light(event_id)
    return None if event is None else event.ts


def outlook_of_files(root: Path, policy: Policy, now: int) -> Outlook | None:
    """As outlook, from a tenant's files in one read-only snapshot (another process may have it
    open); None when it has no log."""
    try:
        with read_only(root / files.LOG) as r:
            return outlook(r, policy, now)
    except FileNotFoundError:
        return None

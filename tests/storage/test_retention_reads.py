"""storage/read/retention.py over a real tenant: the kinds a tenant holds, which events are due
by kind and window, what holds keep, the outlook, and each event going by its own kind and ts."""

from __future__ import annotations

import msgspec
import pytest

from storage.errors import LegalHold
from storage.model import NewEvent
from storage.read.retention import (
    DAY_US,
    Policy,
    due,
    holds_blocking,
    kinds,
    outlook,
    refuse_held,
)
from storage.tenants.tenant import Tenant

NOW = 1_790_000_000_000_000


class Hold(msgspec.Struct, frozen=True):
    hold_id: str
    subject: str | None = None


class About(msgspec.Struct, frozen=True):
    """An event with subjects (the field the data-subject work adds to events)."""

    subjects: list[str]


def add(t: Tenant, kind: str, days_ago: float, **more: object) -> str:
    event = NewEvent(kind=kind, ts=NOW - int(days_ago * DAY_US), text=kind, **more)  # type: ignore[arg-type]
    (result,) = t.submit_append([event]).result()
    return str(result.event_id)


def test_kinds_are_found_one_seek_each_even_when_one_prefixes_another(tenant: Tenant) -> None:
    for kind in ("turn", "turns", "tür", "turn", "a", "turns"):
        add(tenant, kind, 1)
    assert sorted(tenant.snapshot_read(kinds)) == ["a", "turn", "turns", "tür"]


def test_due_goes_by_each_events_own_kind_and_window(tenant: Tenant) -> None:
    old_turn = add(tenant, "turn", 40)
    add(tenant, "turn", 20)
    source = add(tenant, "turn", 10)
    # A fact derived from a young turn, and a turn superseding nothing: each by its own window.
    old_fact = add(tenant, "fact", 400, source_ids=(source,))
    add(tenant, "fact", 100)
    old_note = add(tenant, "note", 1000)
    policy = Policy({"turn": 30, "fact": 365})
    found = tenant.snapshot_read(lambda r: due(r, policy, NOW, 100))
    assert sorted(found.event_ids) == sorted([old_turn, old_fact]) and found.held == 0
    with_rest = Policy.of({"turn": 30, "fact": 365}, 500)  # the server's default for the rest
    assert with_rest.windows == {"turn": 30, "fact": 365, "*": 500}
    found = tenant.snapshot_read(lambda r: due(r, with_rest, NOW, 100))
    assert sorted(found.event_ids) == sorted([old_turn, old_fact, old_note])
    assert Policy.of({"*": 10}, 500).windows == {"*": 10}  # its own "*" wins


def test_a_batch_is_bounded_and_resumes_where_it_stopped(tenant: Tenant) -> None:
    ids = [add(tenant, "turn", 50 - i) for i in range(5)]
    policy = Policy({"*": 30})
    first = tenant.snapshot_read(lambda r: due(r, policy, NOW, 2))
    assert first.event_ids == ids[:2]  # oldest first
    tenant.submit_delete(first.event_ids).result()
    second = tenant.snapshot_read(lambda r: due(r, policy, NOW, 2, (), first.resume))
    assert second.event_ids == ids[2:4]


def test_holds_keep_what_they_name(tenant: Tenant) -> None:
    old = add(tenant, "turn", 40)
    policy = Policy({"turn": 30})
    tenant_wide, subject = Hold("hold_a"), Hold("hold_b", "person-1")
    assert tenant.snapshot_read(lambda r: due(r, policy, NOW, 10, [tenant_wide])).event_ids == []
    # Events that name no subject are not kept by a subject's hold.
    assert tenant.snapshot_read(lambda r: due(r, policy, NOW, 10, [subject])).event_ids == [old]
    assert holds_blocking([subject], About(["person-1", "p2"])) is subject
    assert holds_blocking([subject], About(["p2"])) is None
    assert holds_blocking([subject, tenant_wide], About([])) is tenant_wide
    assert holds_blocking([], About(["person-1"])) is None
    with pytest.raises(LegalHold, match="hold_a") as refused:
        tenant.snapshot_read(lambda r: refuse_held(r, [tenant_wide], [old]))
    assert refused.value.hold_id == "hold_a" and refused.value.status == 409
    tenant.snapshot_read(lambda r: refuse_held(r, [subject], [old]))  # not kept: no error


def test_a_cascade_is_refused_when_a_hold_keeps_what_it_reaches(tenant: Tenant) -> None:
    source = add(tenant, "turn", 1)
    add(tenant, "fact", 1, source_ids=(source,))
    hold = Hold("hold_c")
    with pytest.raises(LegalHold):
        tenant.snapshot_read(lambda r: refuse_held(r, [hold], [source], cascade=True))


def test_the_outlook_counts_due_now_and_within_seven_days(tenant: Tenant) -> None:
    add(tenant, "turn", 40)
    add(tenant, "turn", 27)
    add(tenant, "turn", 10)
    add(tenant, "note", 900)
    seen = tenant.snapshot_read(lambda r: outlook(r, Policy({"turn": 30}), NOW))
    assert (seen.due_now, seen.due_next_7_days) == (1, 2)
    assert seen.oldest_event == NOW - 900 * DAY_US and sorted(seen.kinds) == ["note", "turn"]
    assert tenant.snapshot_read(lambda r: outlook(r, Policy({}), NOW)).due_next_7_days == 0


def test_held_events_of_one_ts_are_named_so_a_run_counts_each_once(tenant: Tenant) -> None:
    """A batch resumes at its last ts, inclusive (others of that ts may be unread): a held
    event there is seen again by the next batch, and a run counts held ids, not sightings."""
    ts = NOW - 40 * DAY_US
    kept = [
        str(r.event_id)
        for r in tenant.submit_append(
            [NewEvent(kind="turn", ts=ts, text=f"k{i}", subjects=("p-1",)) for i in range(3)]
        ).result()
    ]
    gone = [
        str(r.event_id)
        for r in tenant.submit_append(
            [NewEvent(kind="turn", ts=ts, text=f"g{i}") for i in range(2)]
        ).result()
    ]
    policy, hold = Policy({"turn": 30}), [Hold("hold_c", "p-1")]
    first = tenant.snapshot_read(lambda r: due(r, policy, NOW, 10, hold))
    assert sorted(first.event_ids) == sorted(gone)
    assert sorted(first.held_ids) == sorted(kept) and first.held == 3
    tenant.submit_delete(first.event_ids).result()
    second = tenant.snapshot_read(lambda r: due(r, policy, NOW, 10, hold, first.resume))
    assert second.event_ids == [] and sorted(second.held_ids) == sorted(kept)
    assert len({*first.held_ids, *second.held_ids}) == 3

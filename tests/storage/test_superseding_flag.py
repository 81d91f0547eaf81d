"""The log's `superseding` flag: 0 until an event supersedes another, when reads skip the
supersession probe; set with the first SUPERSEDES link, never cleared; a log without it is read
as one that may supersede (every hit probed), never as one that does not."""

from __future__ import annotations

from pathlib import Path

from storage.log.layout import SUPERSEDING, meta_key
from storage.model import AppendResult, NewEvent
from storage.read.current import Moment
from storage.read.recall import RecallQuery, recall
from storage.tenants.tenant import Tenant

DIM = 4


def add(t: Tenant, *events: NewEvent) -> list[str]:
    results = t.submit_append(list(events)).result()
    assert all(isinstance(r, AppendResult) for r in results)
    return [r.event_id for r in results if isinstance(r, AppendResult)]


def event(text: str, i: int, supersedes: tuple[str, ...] = ()) -> NewEvent:
    return NewEvent(
        kind="fact",
        ts=1_000 + i,
        text=text,
        embedding=[1.0, float(i), 0.0, 0.0],
        supersedes=supersedes,
    )


def flag(t: Tenant) -> int | None:
    return t.log.meta_int(SUPERSEDING)


def recalled(t: Tenant, text: str) -> list[str]:
    with t.log.reader() as r:
        hits = recall(r, t.keyword, t.vectors, RecallQuery(text=text)).hits
    return [h.event.event_id for h in hits]


def forget_flag(root: Path) -> None:
    """Remove the flag from the tenant's log (as a log lost it, or one never had it)."""
    t = Tenant.open("t", root, embedding_dim=DIM)
    t.log.write(lambda txn: txn.delete(meta_key(SUPERSEDING), db=t.log.dbs["meta"]))
    t.close()


def test_the_flag_is_set_by_the_first_supersession_and_stays(tmp_path: Path) -> None:
    t = Tenant.open("t", tmp_path / "t", embedding_dim=DIM)
    (old,) = add(t, event("address is 12 high street", 1))
    assert flag(t) == 0
    add(t, event("address note", 2, supersedes=("00000000-0000-4000-8000-000000000000",)))
    assert flag(t) == 0  # naming no event links nothing
    (new,) = add(t, event("address is 16 high street", 3, supersedes=(old,)))
    assert flag(t) == 1
    assert recalled(t, "address high street")[0] == new
    assert old not in recalled(t, "address high street")
    t.submit_delete([new]).result()
    assert flag(t) == 1  # never cleared: a probe answers from here on
    assert old in recalled(t, "address high street")
    t.close()


def test_without_the_flag_every_event_is_probed_and_none_is_superseded(tmp_path: Path) -> None:
    t = Tenant.open("t", tmp_path / "t", embedding_dim=DIM)
    ids = add(t, *(event(f"parcel number {i}", i) for i in range(5)))
    with t.log.reader() as r:
        moment = Moment(r)
        assert not any(moment.is_superseded(ev) for ev in map(r.get, ids) if ev is not None)
    t.close()


def test_a_log_without_the_flag_probes_every_hit(tmp_path: Path) -> None:
    plain, linked = tmp_path / "plain", tmp_path / "linked"
    t = Tenant.open("t", plain, embedding_dim=DIM)
    add(t, event("parcel signed", 1), event("parcel lost", 2))
    t.close()
    t = Tenant.open("t", linked, embedding_dim=DIM)
    (old,) = add(t, event("address is 12 high street", 1))
    (new,) = add(t, event("address is 16 high street", 2, supersedes=(old,)))
    t.close()
    for root in (plain, linked):
        forget_flag(root)

    t = Tenant.open("t", plain, embedding_dim=DIM)
    assert flag(t) is None  # opening writes nothing to a log that has its schema
    with t.log.reader() as r:
        assert r.may_supersede()
    assert len(recalled(t, "parcel")) == 2
    t.close()
    t = Tenant.open("t", linked, embedding_dim=DIM)
    assert flag(t) is None
    assert recalled(t, "address high street") == [new]  # the probe still finds the link
    t.close()

"""Current state: supersession chains, validity windows and as_of, on a real tenant (tests/server/
test_current_http.py: through the API).

The rules (docs/current-state.md): with `current` (the default) an event superseded by a live event
that exists at the moment, or outside its validity window, is not returned; recall puts the current
heads of its chain in its place, once, marked `replaces`; `as_of` decides what exists.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from storage.log import layout as enc
from storage.log.reader import LogReader
from storage.model import SOURCE_FROM, SUPERSEDES, NewEvent
from storage.read.current import Moment
from storage.read.listing import ListQuery, list_events
from storage.read.recall import Hit, RecallQuery, recall
from storage.tenants.tenant import Tenant
from tests.support.times import HOUR, NOW, T0

Q = [1.0, 0.0, 0.0, 0.0]  # the query vector of the arm tests


# -- helpers on a real tenant ----------------------------------------------------------------


def add(
    t: Tenant,
    text: str | None = None,
    emb: list[float] | None = None,
    *,
    ts: int = T0,
    kind: str = "fact",
    supersedes: tuple[str, ...] = (),
    valid_from: int | None = None,
    valid_until: int | None = None,
    sources: tuple[str, ...] = (),
    props: dict[str, Any] | None = None,
) -> str:
    """Append one event through the tenant's writer and return its id."""
    properties = dict(props or {})
    if sources:
        properties["source_event_ids"] = list(sources)
    ev = NewEvent(
        kind=kind,
        ts=ts,
        text=text,
        embedding=emb,
        properties_raw=msgspec.json.encode(properties) if properties else None,
        source_ids=sources,
        supersedes=supersedes,
        valid_from=valid_from,
        valid_until=valid_until,
    )
    result = t.submit_append([ev]).result(timeout=30)[0]
    return str(result.event_id)


def ask(t: Tenant, **query: Any) -> list[Hit]:
    """One recall against the tenant (the engine's call, minus the thread)."""
    with t.log.reader() as r:
        return recall(r, t.keyword, t.vectors, RecallQuery(**query)).hits


def ids(hits: list[Hit]) -> list[str]:
    return [h.event.event_id for h in hits]


def listed(t: Tenant, **query: Any) -> list[str]:
    """Every listed id, newest first, under the same Moment the engine builds."""
    q = ListQuery(limit=1000, **query)
    with t.log.reader() as r:
        page, _cursor = list_events(r, q, keep=Moment(r, current=q.current, as_of=q.as_of).visible)
    return [e.event_id for e in page]


@contextmanager
def moment(t: Tenant, **kw: Any) -> Iterator[tuple[LogReader, Moment]]:
    """A reader and a Moment over it."""
    with t.log.reader() as r:
        yield r, Moment(r, **kw)


def is_current(t: Tenant, event_id: str, **kw: Any) -> bool:
    with moment(t, **kw) as (r, m):
        ev = r.get(event_id)
        assert ev is not None
        return m.is_current(ev)


def heads(t: Tenant, event_id: str) -> list[str]:
    with moment(t) as (r, m):
        ev = r.get(event_id)
        assert ev is not None
        return [h.event_id for h in m.heads(ev)]


def force_supersedes(t: Tenant, newer: str, older: str) -> None:
    """Write a SUPERSEDES link straight into the log. The API cannot make a cycle (a supersedes
    id must name an event that already exists), but the reads must survive one all the same."""

    def put(txn: Any) -> None:
        r = LogReader(txn, t.log.dbs)
        ev = r.get(newer)
        assert ev is not None
        n = len(r.links_out(newer, SUPERSEDES))
        raw_new, raw_old = enc.id_bytes(newer), enc.id_bytes(older)
        out_key = enc.link_out_key(raw_new, SUPERSEDES, n)
        txn.put(out_key, raw_old, db=t.log.dbs["links_out"])
        in_key = enc.link_in_key(raw_old, SUPERSEDES, ev.seq, raw_new)
        txn.put(in_key, b"", db=t.log.dbs["links_in"])

    t.log.write(put)


# -- chains, forks, cycles ---------------------------------------------------------------------


def test_chain_of_three_recalls_the_head_once_replacing_both_older_versions(tenant: Tenant) -> None:
    a = add(tenant, "cutover date is Saturday the tenth, cutover cutover")
    b = add(tenant, "cutover date moved to the seventeenth, cutover", supersedes=(a,))
    c = add(tenant, "cutover date finally the twenty-fourth", supersedes=(b,))
    hits = ask(tenant, text="cutover date")
    assert ids(hits) == [c]
    assert hits[0].replaces == [a, b]  # in rank order: a ranks best, then b
    assert heads(tenant, a) == heads(tenant, b) == [c]
    assert [is_current(tenant, e) for e in (a, b, c)] == [False, False, True]
    everything = ask(tenant, text="cutover date", current=False)
    assert ids(everything) == [a, b, c] and all(h.replaces == [] for h in everything)


def test_the_head_takes_the_rank_and_score_of_the_best_version_it_replaces(tenant: Tenant) -> None:
    old = add(tenant, "ledger ledger ledger cutover")
    other = add(tenant, "ledger ledger cutover notes")
    new = add(tenant, "the cutover date changed", supersedes=(old,))
    plain = ask(tenant, text="ledger cutover", current=False)
    assert ids(plain) == [old, other, new]
    hits = ask(tenant, text="ledger cutover")
    assert ids(hits) == [new, other]
    assert hits[0].score == pytest.approx(plain[0].score) and hits[0].replaces == [old]
    assert hits[1].score == pytest.approx(plain[1].score) and hits[1].replaces == []


def test_chains_are_followed_five_hops_and_no_further(tenant: Tenant) -> None:
    chain = [add(tenant, "version zero of the rule")]
    for i in range(1, 7):  # the contract's bound is five hops: seven versions go one past it
        chain.append(add(tenant, f"version {i} of the rule", supersedes=(chain[-1],)))
    head = chain[-1]
    assert heads(tenant, chain[1]) == [head]  # five hops away
    assert heads(tenant, chain[0]) == []  # six hops away: the bound stops the walk
    assert ids(ask(tenant, text="rule", k=10)) == [head]


def test_a_fork_substitutes_every_current_head_at_the_rank_of_the_forked_fact(
    tenant: Tenant,
) -> None:
    old = add(tenant, "supplier terms net 30, supplier terms")
    b = add(tenant, "payment net 45 for Northfield", supersedes=(old,))
    c = add(tenant, "payment net 60 for Calder", supersedes=(old,))
    plain = ask(tenant, text="supplier terms", current=False)
    assert ids(plain) == [old]  # neither head matches the words: they come back through old
    hits = ask(tenant, text="supplier terms")
    assert ids(hits) == [b, c]
    assert [h.replaces for h in hits] == [[old], [old]]
    assert [h.score for h in hits] == pytest.approx([plain[0].score] * 2)
    assert ids(ask(tenant, text="supplier terms", k=1)) == [b]  # k still bounds the hits
    # A head that is itself out of its window does not stand in.
    d = add(tenant, "payment net 90", supersedes=(old,), valid_until=NOW - HOUR)
    assert heads(tenant, old) == [b, c]
    assert d not in ids(ask(tenant, text="supplier terms"))


def test_a_head_already_ranked_is_marked_even_when_k_is_filled_by_another_head(
    tenant: Tenant,
) -> None:
    old = add(tenant, "freight rate is 4 EUR per pallet")
    b1 = add(tenant, "tariff one for the north", supersedes=(old,))
    b2 = add(tenant, "tariff two for the south", supersedes=(old,))
    c = add(tenant, "freight rate freight rate is now 5 EUR", supersedes=(old,))
    assert ids(ask(tenant, text="freight rate", current=False)) == [c, old]
    assert heads(tenant, old) == [b1, b2, c]
    hits = ask(tenant, text="freight rate", k=2)
    assert ids(hits) == [c, b1]  # b2 does not fit in k, but c still stood in for old
    assert [h.replaces for h in hits] == [[old], [old]]


def test_a_cycle_is_read_without_looping_and_without_a_current_version(tenant: Tenant) -> None:
    a = add(tenant, "loop fact alpha")
    b = add(tenant, "loop fact beta", supersedes=(a,))
    force_supersedes(tenant, a, b)  # a <-> b
    assert heads(tenant, a) == [] and heads(tenant, b) == []
    assert ask(tenant, text="loop fact") == []
    assert listed(tenant) == []
    assert len(ask(tenant, text="loop fact", current=False)) == 2
    # A way out of the cycle becomes the head of both.
    c = add(tenant, "loop fact gamma, settled", supersedes=(b,))
    assert heads(tenant, a) == [c] and heads(tenant, b) == [c]
    hits = ask(tenant, text="loop fact")
    assert ids(hits) == [c] and sorted(hits[0].replaces) == sorted([a, b])


def test_deleting_the_superseding_event_makes_the_old_one_current_again(tenant: Tenant) -> None:
    a = add(tenant, "the cutover is on the tenth")
    b = add(tenant, "the cutover is on the seventeenth", supersedes=(a,))
    c = add(tenant, "the cutover is on the twenty-fourth", supersedes=(b,))
    assert ids(ask(tenant, text="cutover")) == [c]
    assert tenant.submit_delete([c]).result(timeout=30) == [c]
    hits = ask(tenant, text="cutover")
    assert ids(hits) == [b] and hits[0].replaces == [a]
    assert tenant.submit_delete([b]).result(timeout=30) == [b]
    assert ids(ask(tenant, text="cutover")) == [a] and is_current(tenant, a)
    assert listed(tenant) == [a]


# -- validity windows and as_of ---------------------------------------------------------------


def test_windows_expired_and_not_yet_open_are_not_current(tenant: Tenant) -> None:
    expired = add(tenant, "promo code SPRING is valid", valid_until=NOW - HOUR)
    future = add(tenant, "promo code AUTUMN is valid", valid_from=NOW + HOUR)
    live = add(tenant, "promo code SUMMER is valid", valid_from=NOW - HOUR, valid_until=NOW + HOUR)
    assert ids(ask(tenant, text="promo code")) == [live]
    assert listed(tenant) == [live]
    assert set(ids(ask(tenant, text="promo code", current=False))) == {expired, future, live}
    assert set(listed(tenant, current=False)) == {expired, future, live}
    # The window is tested at as_of: from inclusive, until exclusive.
    assert is_current(tenant, expired, as_of=NOW - HOUR - 1)
    assert not is_current(tenant, expired, as_of=NOW - HOUR)
    assert not is_current(tenant, future, as_of=NOW + HOUR - 1)
    assert is_current(tenant, future, as_of=NOW + HOUR)
    assert ids(ask(tenant, text="promo code", as_of=NOW + 2 * HOUR)) == [future]


def test_as_of_before_and_after_a_correction(tenant: Tenant) -> None:
    old = add(tenant, "invoice run is on the first", ts=T0)
    fix = add(tenant, "invoice run moved to the third", ts=T0 + HOUR, supersedes=(old,))
    before = ask(tenant, text="invoice run", as_of=T0 + HOUR - 1)
    assert ids(before) == [old] and before[0].replaces == []  # the correction does not exist yet
    assert listed(tenant, as_of=T0 + HOUR - 1) == [old]
    after = ask(tenant, text="invoice run", as_of=T0 + HOUR)
    assert ids(after) == [fix] and after[0].replaces == [old]
    assert listed(tenant, as_of=T0 + HOUR) == [fix]
    assert listed(tenant, as_of=T0 + HOUR, current=False) == [fix, old]
    assert ask(tenant, text="invoice run", as_of=T0 - 1) == []  # nothing existed yet
    assert ids(ask(tenant, text="invoice run", as_of=T0 + HOUR - 1, current=False)) == [old]


# -- both arms and the walk behind the one chokepoint ------------------------------------------

ARMS = {
    "text": {"text": "ledger cutover"},
    "embedding": {"embedding": Q},
    "fused": {"text": "ledger cutover", "embedding": Q},
}


@pytest.mark.parametrize("arm", list(ARMS))
def test_each_arm_obeys_supersession_windows_and_as_of(tenant: Tenant, arm: str) -> None:
    q = ARMS[arm]
    old = add(tenant, "ledger cutover on the tenth", [1.0, 0.0, 0.0, 0.0])
    new = add(tenant, "ledger cutover on the seventeenth", [0.5, 0.5, 0.5, 0.0], supersedes=(old,))
    expired = add(
        tenant, "ledger cutover was rehearsed", [1.0, 0.05, 0.0, 0.0], valid_until=NOW - HOUR
    )
    later = add(tenant, "ledger cutover checklist", [0.9, 0.1, 0.0, 0.0], ts=NOW + HOUR)
    hits = {h.event.event_id: h for h in ask(tenant, **q)}
    assert set(hits) == {new, later} and hits[new].replaces == [old]
    assert ids(ask(tenant, **q, as_of=NOW)) == [new]  # `later` does not exist yet
    assert set(ids(ask(tenant, **q, current=False))) == {old, new, expired, later}
    # Ten days ago the rehearsal note was still inside its window; the correction already existed.
    assert set(ids(ask(tenant, **q, as_of=T0))) == {new, expired}


def test_the_vector_arm_obeys_the_rules_inside_the_graph_search(tenant: Tenant) -> None:
    # Past 2,048 vectors the arm runs hnswlib's filtered graph search instead of an exact scan.
    decoys = [
        NewEvent(kind="fact", ts=T0, embedding=[1.0, 0.001 * i, 0.0, 0.0], valid_until=NOW - HOUR)
        for i in range(2500)
    ]
    tenant.submit_append(decoys).result(timeout=60)
    old = add(tenant, None, [1.0, 0.0, 0.0, 0.0])
    new = add(tenant, None, [0.0, 0.0, 1.0, 0.0], supersedes=(old,))
    # Enough admitted neighbours that the filtered graph search, not its exact fallback, answers.
    near = [add(tenant, None, [0.8, 0.2 + 0.01 * i, 0.0, 0.0]) for i in range(60)]
    tenant.vectors.flush()
    assert len(tenant.vectors.live) > 2048
    hits = ask(tenant, embedding=Q, k=4)
    assert ids(hits) == [new, *near[:3]] and hits[0].replaces == [old]


def test_kind_and_filter_apply_to_the_substituted_heads(tenant: Tenant) -> None:
    old = add(tenant, "warehouse address is Dock 4", props={"site": "north"})
    note = add(
        tenant, "warehouse moved to Dock 9", kind="note", supersedes=(old,), props={"site": "north"}
    )
    south = add(tenant, "warehouse moved to Dock 7", supersedes=(old,), props={"site": "south"})
    assert ids(ask(tenant, text="warehouse Dock", kind="fact", filters={"site": "north"})) == []
    assert ids(ask(tenant, text="warehouse Dock", kind="fact")) == [south]
    assert ids(ask(tenant, text="warehouse Dock", filters={"site": "north"})) == [note]


def test_the_walk_treats_events_that_are_not_current_as_absent(tenant: Tenant) -> None:
    source = add(tenant, "raw meter reading 118", kind="tool_call")
    old = add(tenant, "meter reading is 118", sources=(source,))
    new = add(tenant, "meter reading corrected to 181", supersedes=(old,))
    reply = add(tenant, "Agent: the reading is 118", kind="turn", sources=(old,))
    hits = ask(tenant, text="Agent reading", kind="turn", hops=2)
    assert ids(hits) == [
        reply
    ]  # old is not current: the walk neither returns it nor passes through
    hits = ask(tenant, text="Agent reading", kind="turn", hops=2, current=False)
    assert ids(hits) == [reply, old, source]
    assert new not in ids(hits)  # supersession is not a SOURCE_FROM link


def test_events_without_the_fields_behave_as_in_the_seed(tenant: Tenant) -> None:
    old = add(tenant, "cutover planned for the tenth")
    new = add(tenant, "cutover moved to the seventeenth", ts=T0 + 1, props={"supersedes": old})
    assert set(ids(ask(tenant, text="cutover"))) == {old, new}
    assert listed(tenant) == [new, old]
    assert is_current(tenant, old) and heads(tenant, old) == []
    with moment(tenant) as (r, _m):
        assert r.links_out(new, SUPERSEDES) == [] and r.links_out(new, SOURCE_FROM) == []


def test_the_docs_page_names_every_field() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "current-state.md").read_text()
    for term in ("supersedes", "valid_from", "valid_until", "as_of", "replaces", "superseded_by"):
        assert term in doc

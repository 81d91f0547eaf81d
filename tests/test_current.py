"""Current state: supersession chains, validity windows and as_of, on a real tenant and through a real server.

The rules (docs/current-state.md): with `current` (the default) an event superseded by a live event
that exists at the moment, or outside its validity window, is not returned; recall puts the current
heads of its chain in its place, once, marked `replaces`; `as_of` decides what exists.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from conftest import ServerProcess

from storage.log import layout as enc
from storage.log.reader import LogReader
from storage.model import SOURCE_FROM, SUPERSEDES, NewEvent
from storage.read.current import Moment
from storage.read.listing import ListQuery, list_events
from storage.read.recall import Hit, RecallQuery, recall
from storage.tenants.tenant import Tenant

MIN = 60_000_000  # one minute in microseconds
HOUR = 60 * MIN
NOW = time.time_ns() // 1000
T0 = NOW - 10 * 24 * HOUR  # the tenant tests' events happen ten days ago
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


# -- end to end through a real server ---------------------------------------------------------

MONDAY_9 = 1_791_190_800_000_000  # Mon 2026-10-05 09:00:00 UTC
DAY = 24 * HOUR
STATUS_QUERY = {
    "text": "cutover plan for billing: date, freeze, copy time",
    "embedding": [0.7, 0.4, 0.0, 0.6],
    "kind": "fact",
    "k": 3,
}
# The seed's third session (../shared/seeds/001_…): name, ts, kind, text, embedding, sources.
SESSION: list[tuple[str, int, str, str, list[float] | None, tuple[str, ...]]] = [
    ("plan_turn", 8 * MIN, "turn", "Lena: we move billing to the new ledger; cutover on Saturday 10 October", [0.6, 0.2, 0.1, 0.4], ()),
    ("old_date", 9 * MIN, "fact", "Billing cutover to the new ledger is planned for Saturday 2026-10-10", [0.9, 0.2, 0.0, 0.5], ("plan_turn",)),
    ("pref_turn", 10 * MIN, "turn", "Lena: keep status notes short, three bullets, never tables", [0.0, 0.1, 0.9, 0.0], ()),
    ("preference", 11 * MIN, "fact", "Lena wants status notes as three bullets, no tables", [0.0, 0.0, 1.0, 0.0], ("pref_turn",)),
    ("measure", 40 * MIN, "tool_call", "table_stats(invoices) -> 48.2 million rows, 212 GB", None, ()),
    ("size", 41 * MIN, "fact", "The invoices table holds 48 million rows, 212 GB", [0.3, 0.9, 0.0, 0.0], ("measure",)),
    ("dry_run", DAY + HOUR, "tool_call", "dry_run(copy invoices) -> finished in 6:40:12, 0 errors", None, ()),
    ("copy_time", DAY + HOUR + MIN, "fact", "A full copy of invoices took 6 h 40 min in the dry run", [0.1, 0.8, 0.0, 0.1], ("dry_run",)),
    ("moved_turn", DAY + 5 * HOUR + 30 * MIN, "turn", "Lena: finance closes September on 12 October, so we go a week later, on the 17th", [0.8, 0.1, 0.0, 0.3], ()),
    ("new_date", DAY + 5 * HOUR + 32 * MIN + 40_000_000, "fact", "Billing cutover moved to Saturday 2026-10-17: finance closes September on 12 October", [1.0, 0.0, 0.0, 0.2], ("moved_turn", "old_date")),
    ("freeze_turn", DAY + 6 * HOUR, "turn", "Lena: no dual-write, we stop writes to billing while the copy runs", [0.5, 0.3, 0.0, 0.4], ()),
    ("decision", DAY + 6 * HOUR + MIN, "fact", "Decision: writes to billing are frozen during the copy; dual-write was rejected", [0.2, 0.7, 0.0, 0.2], ("freeze_turn",)),
    ("wednesday", 2 * DAY, "turn", "Lena: can you draft the status note for the steering group?", [0.1, 0.1, 0.8, 0.1], ()),
]  # fmt: skip


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the module's end-to-end tests; each test uses its own tenants."""
    server = ServerProcess(tmp_path_factory.mktemp("current") / "data").start()
    yield server
    server.stop()


def client(srv: ServerProcess) -> httpx.Client:
    """A client for a fresh tenant (local mode: the token is the tenant id)."""
    return srv.client(f"cur-{uuid.uuid4().hex[:12]}")


def post(c: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = c.post("/v1/memory/event", json=body)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def load_session(c: httpx.Client, *, top_level: bool) -> dict[str, str]:
    """The project's thirteen events; the new date names the old one as a property, as in the
    seed, and with top_level also in the top-level `supersedes`. Returns name -> id."""
    ids: dict[str, str] = {}
    for name, offset, kind, text, emb, sources in SESSION:
        props: dict[str, Any] = {"source_event_ids": [ids[s] for s in sources]} if sources else {}
        body: dict[str, Any] = {
            "kind": kind,
            "ts": MONDAY_9 + offset,
            "text": text,
            "properties": props,
        }
        if emb is not None:
            body["embedding"] = emb
        if name == "new_date":
            props["supersedes"] = ids["old_date"]
            if top_level:
                body["supersedes"] = [ids["old_date"]]
        ids[name] = post(c, body)["event_id"]
    return ids


def named(ids: dict[str, str], hits: list[dict[str, Any]]) -> list[str]:
    by_id = {v: k for k, v in ids.items()}
    return [by_id[h["event_id"]] for h in hits]


def hits_of(c: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = c.post("/v1/memory/recall", json=body)
    assert r.status_code == 200, r.text
    out: list[dict[str, Any]] = r.json()["hits"]
    return out


def test_seed_third_session_with_top_level_supersedes(srv: ServerProcess) -> None:
    with client(srv) as seed, client(srv) as c:
        # As in the seed, a `supersedes` property means nothing to the server: both dates come back.
        plain = load_session(seed, top_level=False)
        assert named(plain, hits_of(seed, STATUS_QUERY)) == ["old_date", "new_date", "decision"]
        assert seed.get(f"/v1/memory/event/{plain['old_date']}").json()["current"] is True

        ids = load_session(c, top_level=True)
        hits = hits_of(c, STATUS_QUERY)
        assert named(ids, hits) == ["new_date", "decision", "copy_time"]
        assert hits[0]["replaces"] == [ids["old_date"]]
        # The answer counts what current state kept out; the seed's client above sees no new field.
        answer = c.post("/v1/memory/recall", json=STATUS_QUERY).json()
        assert answer["withheld"] == {"superseded": 1, "expired": 0, "not_yet_valid": 0}
        assert set(seed.post("/v1/memory/recall", json=STATUS_QUERY).json()) == {"hits"}
        assert hits[0]["text"].startswith("Billing cutover moved to Saturday 2026-10-17")
        assert hits[0]["score"] == pytest.approx(hits_of(seed, STATUS_QUERY)[0]["score"])
        assert all("replaces" not in h for h in hits[1:])
        # The same question asked as of Monday evening: the old date was the settled one then.
        monday = hits_of(c, {**STATUS_QUERY, "as_of": MONDAY_9 + 10 * HOUR})
        assert named(ids, monday)[0] == "old_date" and "replaces" not in monday[0]
        assert "new_date" not in named(ids, monday)
        # Opting out of current state gives the seed's answer.
        assert named(ids, hits_of(c, {**STATUS_QUERY, "current": False})) == [
            "old_date",
            "new_date",
            "decision",
        ]


def test_get_listing_and_delete_show_and_change_the_state(srv: ServerProcess) -> None:
    with client(srv) as c:
        ids = load_session(c, top_level=True)
        old = c.get(f"/v1/memory/event/{ids['old_date']}").json()
        assert old["current"] is False and old["superseded_by"] == [ids["new_date"]]
        assert old["text"].startswith("Billing cutover to the new ledger")  # GET always returns it
        new = c.get(f"/v1/memory/event/{ids['new_date']}").json()
        assert new["current"] is True and new["superseded_by"] == []
        assert new["supersedes"] == [ids["old_date"]]
        assert new["properties"]["supersedes"] == ids["old_date"]  # the application's own, as sent

        def facts(**params: Any) -> list[str]:
            r = c.get("/v1/memory/events", params={"kind": "fact", **params})
            assert r.status_code == 200, r.text
            return [e["event_id"] for e in r.json()["events"]]

        assert ids["old_date"] not in facts() and ids["new_date"] in facts()
        assert ids["old_date"] in facts(current="false") and len(facts(current="false")) == 6
        assert facts(as_of=MONDAY_9 + 10 * HOUR) == [
            ids["size"],
            ids["preference"],
            ids["old_date"],
        ]
        assert c.get("/v1/memory/events", params={"current": "maybe"}).status_code == 400

        assert c.delete(f"/v1/memory/event/{ids['new_date']}").status_code == 200
        old = c.get(f"/v1/memory/event/{ids['old_date']}").json()
        assert old["current"] is True and old["superseded_by"] == []
        hits = hits_of(c, STATUS_QUERY)
        assert named(ids, hits)[0] == "old_date" and "replaces" not in hits[0]


def test_append_validates_supersedes_and_windows(srv: ServerProcess) -> None:
    with client(srv) as c:
        base = {"kind": "fact", "text": "a fact"}
        known = post(c, base)["event_id"]
        missing = str(uuid.uuid4())
        out = post(c, {**base, "supersedes": [known, missing, "not-a-uuid", missing]})
        assert out["unlinked"] == [missing, "not-a-uuid"]
        got = c.get(f"/v1/memory/event/{out['event_id']}").json()
        assert got["supersedes"] == [known]
        assert "unlinked" not in post(c, {**base, "supersedes": []})
        window = post(c, {**base, "valid_from": T0 + 10, "valid_until": T0 + 20})
        got = c.get(f"/v1/memory/event/{window['event_id']}").json()
        assert (got["valid_from"], got["valid_until"], got["current"]) == (T0 + 10, T0 + 20, False)
        for bad in (
            {"supersedes": known},
            {"supersedes": [1, 2]},
            {"valid_from": T0 + 20, "valid_until": T0 + 20},
            {"valid_from": T0 + 30, "valid_until": T0 + 20},
            {"valid_until": -1},
        ):
            r = c.post("/v1/memory/event", json={**base, **bad})
            assert r.status_code == 400, bad
            assert r.json()["error"] == "invalid_request" and set(r.json()) == {"error", "detail"}
        plain = c.get(f"/v1/memory/event/{known}").json()
        assert "valid_from" not in plain and "supersedes" not in plain
        assert plain["current"] is False and plain["superseded_by"] == [out["event_id"]]


def test_the_docs_page_names_every_field() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "current-state.md").read_text()
    for term in ("supersedes", "valid_from", "valid_until", "as_of", "replaces", "superseded_by"):
        assert term in doc

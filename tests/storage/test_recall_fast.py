"""Recall's cheaper paths answer exactly as the plain ones: records read without their embeddings,
and restrictions counted before they are listed."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from storage.log import layout as records
from storage.model import AppendResult, NewEvent
from storage.read import recall as recall_module
from storage.read.current import Moment
from storage.read.recall import Admission, RecallQuery, RecallResult, recall
from storage.tenants.tenant import Tenant

T0 = 1_000_000


def add(t: Tenant, *events: NewEvent) -> list[str]:
    """Append events in one group commit and return their ids."""
    results = t.submit_append(list(events)).result()
    assert all(isinstance(r, AppendResult) for r in results), results
    return [r.event_id for r in results]


def ask(t: Tenant, *, embeddings: bool = True, **query: Any) -> RecallResult:
    """One recall against the tenant."""
    with t.log.reader() as r:
        return recall(r, t.keyword, t.vectors, RecallQuery(**query), embeddings=embeddings)


def answer(result: RecallResult) -> list[tuple[Any, ...]]:
    """Everything a client sees of a recall but the events' contents: ids, scores, walk."""
    return [(h.event.event_id, h.score, h.via, h.hop, h.replaces) for h in result.hits] + [
        (result.walk,)
    ]


@pytest.fixture
def varied(tenant: Tenant) -> Tenant:
    """A tenant with every kind of field set somewhere: links, supersession, validity, models."""
    ids = add(
        tenant,
        NewEvent(kind="turn", ts=T0, text="the invoice ledger is late", embedding=[1.0, 0, 0, 0]),
        NewEvent(kind="turn", ts=T0 + 1, text="ledger reconciled", embedding=[0.9, 0.1, 0, 0]),
        NewEvent(kind="tool_call", ts=T0 + 2, text="fetch invoice 7", embedding=[0, 1.0, 0, 0]),
    )
    add(
        tenant,
        NewEvent(
            kind="fact",
            ts=T0 + 3,
            text="invoice 7 is overdue",
            embedding=[0.7, 0.7, 0, 0],
            embedding_model="m1",
            properties_raw=b'{"site": "north", "n": 2, "ok": true}',
            source_ids=(ids[0], ids[2]),
            valid_from=T0,
        ),
        NewEvent(
            kind="fact",
            ts=T0 + 4,
            text="invoice 7 was paid",
            embedding=[0.6, 0.8, 0, 0],
            properties_raw=b'{"site": "south"}',
            source_ids=(ids[1],),
            supersedes=(ids[1],),
        ),
        NewEvent(kind="turn", ts=T0 + 5, text="an expired invoice note", valid_until=T0 + 6),
        NewEvent(kind="turn", ts=T0 + 6, text="words only, no vector: invoice"),
    )
    return tenant


def test_a_light_read_is_the_record_less_its_embedding(varied: Tenant) -> None:
    with varied.log.reader() as r:
        every = list(r.all_ids())
        assert len(every) == 7
        for event_id in every:
            whole = r.get(event_id)
            assert whole is not None
            assert r.get_light(event_id) == msgspec.structs.replace(whole, embedding=None)
        assert r.get_light("not-an-id") is None
        assert r.get_light("00000000-0000-4000-8000-000000000000") is None


def test_the_light_record_names_every_stored_field_but_the_embedding() -> None:
    # A field added to StoredEvent and not to _Light would come back as its default.
    from storage.model import StoredEvent

    fields = set(StoredEvent.__struct_fields__) - {"embedding"}
    assert set(records._Light.__struct_fields__) == fields


QUERIES: list[dict[str, Any]] = [
    {"text": "invoice ledger"},
    {"embedding": [1.0, 0.2, 0, 0]},
    {"text": "invoice", "embedding": [0.5, 0.5, 0, 0], "k": 3},
    {"text": "invoice ledger", "embedding": [1.0, 0, 0, 0], "hops": 2},
    {
        "text": "invoice",
        "embedding": [0.6, 0.8, 0, 0],
        "kind": "fact",
        "filters": {"site": "north"},
    },
    {"text": "invoice ledger", "embedding": [0.9, 0.1, 0, 0], "current": False, "hops": 1},
    {"text": "invoice", "embedding": [1.0, 0, 0, 0], "as_of": T0 + 3, "hops": 1},
]


@pytest.mark.parametrize("query", QUERIES)
def test_recall_without_embeddings_answers_the_same(varied: Tenant, query: dict[str, Any]) -> None:
    whole = ask(varied, **query)
    light = ask(varied, embeddings=False, **query)
    assert whole.hits and answer(light) == answer(whole)
    with varied.log.reader() as r:
        for h in whole.hits:
            assert h.event == r.get(h.event.event_id)  # with its embedding, when it has one
    for a, b in zip(light.hits, whole.hits, strict=True):
        assert msgspec.structs.replace(a.event, embedding=None) == msgspec.structs.replace(
            b.event, embedding=None
        )


def test_a_superseded_hit_still_gives_way_to_its_head_without_embeddings(varied: Tenant) -> None:
    light = ask(varied, embeddings=False, text="ledger reconciled", k=1)
    [hit] = light.hits
    assert hit.event.text == "invoice 7 was paid" and len(hit.replaces) == 1


@pytest.mark.parametrize("kind_count", [2, 3, 4])
def test_a_restriction_is_few_up_to_exactly_few_events(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch, kind_count: int
) -> None:
    monkeypatch.setattr(recall_module, "FEW", 3)
    rare = add(
        tenant,
        *(NewEvent(kind="rare", ts=T0 + i, embedding=[1.0, i, 0, 0]) for i in range(kind_count)),
    )
    add(
        tenant,
        *(NewEvent(kind="common", ts=T0 + 10 + i, embedding=[0, 1.0, 0, 0]) for i in range(5)),
    )
    with tenant.log.reader() as r:

        def few(**query: Any) -> list[str] | None:
            q = RecallQuery(embedding=[1.0, 0, 0, 0], **query)
            return recall_module._few_candidates(Admission(r, q, Moment(r, as_of=q.as_of)))

        assert few(kind="rare") == (rare if kind_count <= 3 else None)
        assert few(kind="common") is None
        assert few(kind="absent") == []
        assert few(as_of=T0 + kind_count - 1) == (rare if kind_count <= 3 else None)
        assert few(as_of=T0 - 1) == []
        assert few(kind="common", as_of=T0 + 1) == rare[:2]  # the first that admits few answers


def test_a_filter_is_few_up_to_exactly_few_events(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recall_module, "FEW", 2)
    props = [b'{"site": "north"}', b'{"site": "north"}', b'{"site": "south"}', b'{"site": "south"}']
    props.append(b'{"site": "south"}')
    ids = add(
        tenant,
        *(NewEvent(kind="turn", ts=T0 + i, properties_raw=p) for i, p in enumerate(props)),
    )
    with tenant.log.reader() as r:

        def few(site: str) -> list[str] | None:
            q = RecallQuery(embedding=[1.0, 0, 0, 0], filters={"site": site})
            return recall_module._few_candidates(Admission(r, q, Moment(r)))

        assert sorted(few("north") or []) == sorted(ids[:2])  # listed by id
        assert few("south") is None
        assert few("west") == []


def test_a_common_kind_checked_on_each_hit_ranks_as_the_kind_clause_does(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kind most documents have is left out of the Tantivy query and checked by the
    chokepoint; a rare one stays a clause. Both answer as the clause alone does."""
    words = ["parcel", "refund", "carrier", "street", "signed", "number", "depot", "gate"]
    kinds = ["turn"] * 7 + ["fact"] * 2 + ["tool_call"]
    add(
        tenant,
        *(
            NewEvent(
                kind=kinds[i % 10],
                ts=T0 + i,
                text=" ".join(words[(i * j) % 8] for j in range(1, 5 + i % 4)) + f" n{i}",
            )
            for i in range(400)
        ),
    )
    assert tenant.keyword.kind_share("turn") >= recall_module.COMMON_KIND
    assert tenant.keyword.kind_share("tool_call") < recall_module.COMMON_KIND
    questions = [" ".join(words[i : i + 2]) for i in range(7)]

    def answers() -> list[list[tuple[Any, ...]]]:
        return [
            answer(ask(tenant, text=q, kind=kind, k=k))
            for q in questions
            for kind in ("turn", "fact", "tool_call")
            for k in (3, 10, 40)
        ]

    checked = answers()
    monkeypatch.setattr(recall_module, "COMMON_KIND", 2.0)  # every kind a clause again
    assert checked == answers()
    assert all(len(a) > 1 for a in checked)  # every question found something of each kind

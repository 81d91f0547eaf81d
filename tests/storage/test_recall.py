"""Recall on a real tenant (LMDB, Tantivy, hnswlib in tmp_path): fusion, the chokepoint, the walk
(tests/server/test_recall_http.py has the limits and bad input at the HTTP level)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from storage.errors import EmbeddingMismatch, InvalidRequest
from storage.index import vectors as vectors_module
from storage.model import NewEvent, StoredEvent
from storage.read.recall import RRF_K, RecallResult, fuse
from storage.tenants.tenant import Tenant
from tests.support.recall import add, ev, run


def delete(t: Tenant, *ids: str) -> None:
    """Delete events through the writer."""
    assert t.submit_delete(list(ids)).result() == list(ids)


def ids_of(result: RecallResult) -> list[str]:
    """Event ids of every hit, ranked then walked."""
    return [h.event.event_id for h in result.hits]


def stored(event_id: str) -> StoredEvent:
    """A bare StoredEvent for fusion tests."""
    return StoredEvent(event_id=event_id, seq=0, kind="turn", ts=0)


# -- fusion ----------------------------------------------------------------------


def test_fuse_sums_reciprocal_ranks_and_keeps_only_what_an_arm_returned() -> None:
    a, b, c, d = (stored(x) for x in "abcd")
    fused = fuse([[a, b, c], [c, d, a]])
    assert [e.event_id for e, _s in fused] == ["a", "c", "b", "d"]
    scores = dict((e.event_id, s) for e, s in fused)
    assert scores["a"] == pytest.approx(1 / 61 + 1 / 63)
    assert scores["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert scores["b"] == pytest.approx(1 / 62)
    assert scores["d"] == pytest.approx(1 / 62)


def test_fuse_breaks_ties_by_first_seen_order() -> None:
    a, b = stored("a"), stored("b")
    assert [e.event_id for e, _s in fuse([[a, b], [b, a]])] == ["a", "b"]
    assert [e.event_id for e, _s in fuse([[b, a], [a, b]])] == ["b", "a"]


def test_one_arm_scores_are_one_over_sixty_plus_rank(tenant: Tenant) -> None:
    add(tenant, *(ev(f"apple {'pear ' * i}", [1.0, float(i), 0, 0]) for i in range(5)))
    by_text = run(tenant, text="apple", k=5)
    assert [h.score for h in by_text.hits] == pytest.approx([1 / (RRF_K + r) for r in range(1, 6)])
    by_vector = run(tenant, embedding=[1.0, 0, 0, 0], k=3)
    assert [h.event.embedding for h in by_vector.hits] == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 2, 0, 0]]
    assert [h.score for h in by_vector.hits] == pytest.approx([1 / 61, 1 / 62, 1 / 63])


def test_fused_recall_ranks_by_both_arms(tenant: Tenant) -> None:
    words, near, both = add(
        tenant,
        ev("invoice ledger invoice ledger", [0.0, 1.0, 0, 0]),
        ev("nothing in common", [1.0, 0.0, 0, 0]),
        ev("the invoice", [0.9, 0.1, 0, 0]),
    )
    result = run(tenant, text="invoice ledger", embedding=[1.0, 0, 0, 0], k=3)
    # words: first and third; both: second twice; near: first in the vector arm only.
    assert ids_of(result) == [words, both, near]
    assert [h.score for h in result.hits] == pytest.approx([1 / 61 + 1 / 63, 2 / 62, 1 / 61])
    assert result.walk is None


def test_text_is_words_never_query_syntax(tenant: Tenant) -> None:
    (target,) = add(tenant, ev("order 88213 for Anne's parcel"))
    for text in [
        'order:88213 AND (parcel OR "',
        "NOT parcel",
        "parcel^9 ~2 *",
        "id:x kind:turn",
        "+-!",
    ]:
        result = run(tenant, text=text)
        assert ids_of(result) in ([target], []), text
    assert ids_of(run(tenant, text="NOT parcel")) == [target]
    assert run(tenant, text="?!").hits == []


def test_stemmed_words_match(tenant: Tenant) -> None:
    (target,) = add(tenant, ev("the parcel was signed for at number 16"))
    assert ids_of(run(tenant, text="signing parcels")) == [target]


def test_stop_words_do_not_match_but_a_query_of_only_stop_words_still_searches(
    tenant: Tenant,
) -> None:
    chatter, parcel = add(tenant, ev("when did she call them about it"), ev("the parcel was sent"))
    assert ids_of(run(tenant, text="When did she send the parcel?")) == [parcel]
    assert ids_of(run(tenant, text="when did she")) == [chatter]


def test_each_arm_brings_its_top_k_so_agreement_does_not_outvote_a_first_place(
    tenant: Tenant,
) -> None:
    # 'top' leads the keyword arm and has no embedding; 'middling' is third in both arms. With
    # arms k deep, 'middling' is not fused at all; 50 deep, 2/63 would outrank top's 1/61.
    top, second, _middling, _rest = add(
        tenant,
        ev("apple apple apple apple"),
        ev("apple apple apple", [1.0, 0.0, 0, 0]),
        ev("apple apple", [0.8, 0.6, 0, 0]),
        ev("apple", [0.9, 0.3, 0, 0]),
    )
    result = run(tenant, text="apple", embedding=[1.0, 0, 0, 0], k=2)
    assert ids_of(result) == [second, top]


def test_arms_go_deeper_when_substitution_leaves_fewer_than_k(tenant: Tenant) -> None:
    (old,) = add(tenant, ev("apple apple apple apple"))
    new = NewEvent(kind="turn", ts=2_000, text="apple apple apple", supersedes=(old,))
    (head,) = add(tenant, new)
    c, d = add(tenant, ev("apple apple"), ev("apple"))
    result = run(tenant, text="apple", k=3)
    # The top 3 are old, head, c; old gives way to head, already a hit, so d is fetched.
    assert ids_of(result) == [head, c, d]
    assert result.hits[0].replaces == [old]


# -- the chokepoint: kind, filter and deletes restrict inside the ranking -------------------------


def _crowd(t: Tenant, n: int, kind: str, **props: Any) -> list[str]:
    """N events that match 'apple' and [1,0,0,0] better than anything else."""
    return add(
        t, *(ev("apple apple apple", [1.0, 0.001 * i, 0, 0], kind=kind, **props) for i in range(n))
    )


def _few(t: Tenant, n: int, kind: str, **props: Any) -> list[str]:
    """N events that match 'apple' and [1,0,0,0] weakly."""
    filler = " filler words" * 8
    return add(
        t, *(ev(f"apple {filler}", [0.1, 1.0, float(i), 0], kind=kind, **props) for i in range(n))
    )


@pytest.mark.parametrize("arm", ["text", "embedding", "both"])
def test_kind_restricts_each_arm_before_the_cut(tenant: Tenant, arm: str) -> None:
    _crowd(tenant, 150, "noise")
    wanted = _few(tenant, 5, "turn")
    query: dict[str, Any] = {"text": "apple"} if arm != "embedding" else {}
    if arm != "text":
        query["embedding"] = [1.0, 0, 0, 0]
    result = run(tenant, kind="turn", k=5, **query)
    assert sorted(ids_of(result)) == sorted(wanted)
    assert all(h.event.kind == "turn" for h in result.hits)


@pytest.mark.parametrize("in_graph", [False, True])
def test_kind_and_filter_restrict_inside_the_hnsw_graph(
    tenant: Tenant, in_graph: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Force the graph search (not the exact scan small tenants get) once the vectors are inserted.
    monkeypatch.setattr(vectors_module, "EXACT_BELOW", 0)
    _crowd(tenant, 300, "turn", supplier="SUP-1")
    _crowd(tenant, 300, "fact", supplier="SUP-2")
    wanted = _few(tenant, 7, "fact", supplier="SUP-1")
    if in_graph:
        tenant.vectors.flush()
    result = run(tenant, embedding=[1.0, 0, 0, 0], kind="fact", filters={"supplier": "SUP-1"}, k=7)
    assert sorted(ids_of(result)) == sorted(wanted)
    result = run(tenant, embedding=[1.0, 0, 0, 0], filters={"supplier": "SUP-1"}, k=100)
    assert len(result.hits) == 100 and all(
        h.event.filterable["supplier"] == "SUP-1" for h in result.hits
    )


def test_filter_restricts_the_keyword_arm_with_typed_values(tenant: Tenant) -> None:
    _crowd(tenant, 120, "turn", priority=2, urgent=False)
    two = _few(tenant, 3, "turn", priority=2.0, urgent=True)
    _few(tenant, 3, "turn", priority="2", urgent=True)
    result = run(tenant, text="apple", filters={"priority": 2, "urgent": True}, k=10)
    assert sorted(ids_of(result)) == sorted(two)  # 2 == 2.0, but the string "2" is another value
    assert run(tenant, text="apple", filters={"missing": 1}).hits == []


@pytest.mark.parametrize("in_graph", [False, True])
def test_deleted_events_never_appear(
    tenant: Tenant, in_graph: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vectors_module, "EXACT_BELOW", 0)
    crowd = _crowd(tenant, 80, "turn")
    if in_graph:
        tenant.vectors.flush()
    delete(tenant, *crowd[:60])
    gone = set(crowd[:60])
    for query in (
        {"text": "apple"},
        {"embedding": [1.0, 0, 0, 0]},
        {"text": "apple", "embedding": [1.0, 0, 0, 0]},
    ):
        result = run(tenant, k=30, **query)
        assert len(result.hits) == 20 and not gone & set(ids_of(result)), query


def test_deleting_a_hit_reorders_without_gaps(tenant: Tenant) -> None:
    first, second, third = add(
        tenant,
        ev("apple apple apple", [1, 0, 0, 0]),
        ev("apple apple", [1, 1, 0, 0]),
        ev("apple", [0, 1, 0, 0]),
    )
    delete(tenant, first)
    result = run(tenant, text="apple", embedding=[1.0, 0, 0, 0], k=3)
    assert ids_of(result) == [second, third]
    assert result.hits[0].score == pytest.approx(2 / 61)


def test_a_hit_outside_its_validity_window_is_not_ranked(tenant: Tenant) -> None:
    expired = NewEvent(kind="turn", ts=1, text="apple", embedding=[1, 0, 0, 0], valid_until=2)
    (kept,) = add(tenant, ev("apple", [1, 0.1, 0, 0]))
    add(tenant, expired)
    assert ids_of(run(tenant, text="apple", embedding=[1.0, 0, 0, 0])) == [kept]
    assert len(run(tenant, text="apple", current=False).hits) == 2


# -- the walk ------------------------------------------------------------------------------------


@pytest.fixture
def graph(tenant: Tenant) -> dict[str, str]:
    """hit1 <- a1, a2 (hit1 links to them); hit2 links to b1; c1 links to hit2; b1 links to d1, d2;
    d1 links to e1; x (a tool_call) links to hit1. Only hit1 and hit2 match 'needle'."""
    ids: dict[str, str] = {}
    for name in ("a1", "a2", "e1"):
        (ids[name],) = add(tenant, ev(f"plain {name}"))
    (ids["d1"],) = add(tenant, ev("plain d1", sources=(ids["e1"],)))
    (ids["d2"],) = add(tenant, ev("plain d2"))
    (ids["b1"],) = add(tenant, ev("plain b1", sources=(ids["d1"], ids["d2"])))
    (ids["hit1"],) = add(tenant, ev("needle needle", sources=(ids["a1"], ids["a2"])))
    (ids["hit2"],) = add(tenant, ev("needle", sources=(ids["b1"],)))
    (ids["c1"],) = add(tenant, ev("plain c1", sources=(ids["hit2"],)))
    (ids["x"],) = add(tenant, ev("plain x", kind="tool_call", sources=(ids["hit1"],)))
    return ids


def _names(graph: dict[str, str], result: RecallResult) -> list[tuple[str, str | None, int | None]]:
    back = {v: k for k, v in graph.items()}
    return [(back[h.event.event_id], back.get(h.via or ""), h.hop) for h in result.hits]


def test_walk_goes_both_ways_in_hit_order_and_link_order(
    tenant: Tenant, graph: dict[str, str]
) -> None:
    result = run(tenant, text="needle", k=10, hops=1)
    assert _names(graph, result) == [
        ("hit1", None, None),
        ("hit2", None, None),
        ("a1", "hit1", 1),  # out-links first, in link order
        ("a2", "hit1", 1),
        ("x", "hit1", 1),  # then in-links (of any kind)
        ("b1", "hit2", 1),
        ("c1", "hit2", 1),
    ]
    assert all(h.score == 0.0 for h in result.hits[2:])
    assert result.walk is not None
    assert (result.walk.reached, result.walk.returned, result.walk.omitted) == (5, 5, [])


def test_walk_is_breadth_first_and_credits_the_ranked_hit(
    tenant: Tenant, graph: dict[str, str]
) -> None:
    result = run(tenant, text="needle", k=10, hops=3)
    assert _names(graph, result)[7:] == [("d1", "hit2", 2), ("d2", "hit2", 2), ("e1", "hit2", 3)]
    assert (
        run(tenant, text="needle", k=10, hops=2).walk
        == run(tenant, text="needle", k=10, hops=2).walk
    )
    two = run(tenant, text="needle", k=10, hops=2)
    assert two.walk is not None and two.walk.reached == 7


def test_walk_allowance_is_k_shared_by_all_hits_and_reports_what_it_left_out(
    tenant: Tenant, graph: dict[str, str]
) -> None:
    result = run(tenant, text="needle", k=2, hops=3)
    assert _names(graph, result) == [
        ("hit1", None, None),
        ("hit2", None, None),
        ("a1", "hit1", 1),
        ("a2", "hit1", 1),
    ]
    assert result.walk is not None
    assert result.walk.reached == 8 and result.walk.returned == 2
    assert result.walk.omitted == [graph[n] for n in ("x", "b1", "c1", "d1", "d2", "e1")]


def test_walk_does_not_reach_deleted_events_or_repeat_hits(
    tenant: Tenant, graph: dict[str, str]
) -> None:
    delete(tenant, graph["a2"], graph["b1"])
    result = run(tenant, text="needle", k=10, hops=3)
    names = [n for n, _via, _hop in _names(graph, result)]
    assert names == ["hit1", "hit2", "a1", "x", "c1"]  # b1 was the only way to d1, d2 and e1
    assert len(set(names)) == len(names)


def test_walk_between_two_hits_adds_nothing_twice(tenant: Tenant) -> None:
    (source,) = add(tenant, ev("needle", [1, 0, 0, 0]))
    (derived,) = add(tenant, ev("needle needle", [1, 0, 0, 0], sources=(source,)))
    (third,) = add(tenant, ev("other", sources=(derived, source)))
    result = run(tenant, text="needle", k=5, hops=2)
    assert ids_of(result) == [derived, source, third]
    assert result.hits[2].via == derived and result.hits[2].hop == 1


def test_hops_zero_has_no_walk_account(tenant: Tenant, graph: dict[str, str]) -> None:
    result = run(tenant, text="needle", k=10)
    assert result.walk is None and len(result.hits) == 2


# -- validation in the engine ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "error", "words"),
    [
        ({}, InvalidRequest, "send text, an embedding, or both"),
        ({"text": ""}, InvalidRequest, "send text"),
        ({"text": "a", "k": 0}, InvalidRequest, "k must be from 1 to 100"),
        ({"text": "a", "k": 101}, InvalidRequest, "k must be from 1 to 100"),
        ({"text": "a", "hops": 4}, InvalidRequest, "hops must be from 0 to 3"),
        ({"text": "a", "hops": -1}, InvalidRequest, "hops must be from 0 to 3"),
        (
            {"embedding": [1.0, 0.0]},
            EmbeddingMismatch,
            "embedding has 2 values; this tenant's vectors have 4",
        ),
    ],
)
def test_validate_refuses_with_a_sentence(
    tenant: Tenant, query: dict[str, Any], error: type, words: str
) -> None:
    with pytest.raises(error, match=words):
        run(tenant, **query)


def test_query_model_must_match_the_tenants(tenant: Tenant) -> None:
    add(
        tenant,
        NewEvent(kind="turn", ts=1, text="x", embedding=[1, 0, 0, 0], embedding_model="mini"),
    )
    assert len(run(tenant, embedding=[1.0, 0, 0, 0], embedding_model="mini").hits) == 1
    with pytest.raises(EmbeddingMismatch, match="'mini'"):
        run(tenant, embedding=[1.0, 0, 0, 0], embedding_model="other")


def test_deleting_vectors_while_they_move_into_the_graph_leaves_the_index_sound(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small insert batches, so the inserter is often between its graph insert and its tail
    # clean-up when a delete of the same labels arrives.
    monkeypatch.setattr(vectors_module, "INSERT_BATCH", 4)
    monkeypatch.setattr(vectors_module, "EXACT_BELOW", 8)  # a graph from the first rounds on
    rng = np.random.default_rng(5)
    kept: list[str] = []
    for _round in range(60):
        ids = add(
            tenant, *(ev(f"round {_round}", rng.standard_normal(4).tolist()) for _ in range(12))
        )
        delete(tenant, *ids[::2])
        kept += ids[1::2]
    vec = tenant.vectors
    vec.flush()
    assert vec.index is not None and not vec._stopping  # the inserts survived every race
    assert vec.count() == len(kept)
    result = run(tenant, embedding=[1.0, 0, 0, 0], k=100)
    assert len(result.hits) == 100 and set(ids_of(result)) <= set(kept)

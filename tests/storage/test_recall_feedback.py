"""Pseudo-relevance feedback for the vector arm (storage.read.recall.Feedback) on a real tenant: the
query moves toward the keyword arm's first admitted hits, and without feedback nothing moves."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from storage.model import AppendResult, NewEvent
from storage.read.recall import Feedback, RecallQuery, RecallResult, recall, validate
from storage.tenants.tenant import Tenant

# Vectors in 4 dimensions. The query's vector is APPLE's; the word "banana" is BANANA's text.
# Ranked by the query vector alone: apple (1.0), durian (0.8), then the rest. Moved toward
# BANANA by half (unit([1, 0.5, 0, 0]) = [0.894, 0.447, 0, 0]): durian 0.983 > apple 0.894.
APPLE = [1.0, 0.0, 0.0, 0.0]
BANANA = [0.0, 1.0, 0.0, 0.0]
DURIAN = [0.8, 0.6, 0.0, 0.0]
ELDER = [0.0, 0.0, 1.0, 0.0]
QUERY = {"text": "banana", "embedding": APPLE, "k": 4, "explain": True}


def event(text: str, emb: list[float] | None, kind: str = "turn") -> NewEvent:
    """A turn (or another kind) carrying its text as its name property."""
    raw = msgspec.json.encode({"name": text.split()[0]})
    return NewEvent(kind=kind, ts=1_000, text=text, embedding=emb, properties_raw=raw)


def add(t: Tenant, *events: NewEvent) -> None:
    """Append events in one group commit."""
    results = t.submit_append(list(events)).result()
    assert all(isinstance(r, AppendResult) for r in results), results


def run(t: Tenant, feedback: Feedback | None = None, **query: Any) -> RecallResult:
    """Validate and run one recall as the engine does, with or without feedback."""
    q = RecallQuery(**{**QUERY, **query})
    with t.log.reader() as r:
        validate(q, t.dim, r.meta_str("model"))
        return recall(r, t.keyword, t.vectors, q, feedback=feedback)


def vector_ranks(result: RecallResult) -> dict[str, int | None]:
    """Each hit's vector-arm rank (explain), by the hit's name."""
    out = {}
    for hit in result.hits:
        assert hit.ranks is not None and hit.event.properties_raw is not None
        out[msgspec.json.decode(hit.event.properties_raw)["name"]] = hit.ranks[1]
    return out


@pytest.fixture
def fruit(tenant: Tenant) -> Tenant:
    """apple, banana, durian and elder: one keyword match (banana), four vectors."""
    add(
        tenant,
        event("apple pie", APPLE),
        event("banana bread", BANANA),
        event("durian ice", DURIAN),
        event("elder flower", ELDER),
    )
    return tenant


@pytest.mark.parametrize("kind", [None, "turn"])  # the graph's search, and the exact arm over few
def test_feedback_moves_the_vector_arm_toward_the_keyword_hits(
    fruit: Tenant, kind: str | None
) -> None:
    plain = vector_ranks(run(fruit, kind=kind))
    assert plain["apple"] == 1 and plain["durian"] == 2
    moved = vector_ranks(run(fruit, Feedback(hits=1, weight=0.5), kind=kind))
    assert moved["durian"] == 1 and moved["apple"] == 2


def test_without_feedback_the_request_is_ranked_as_sent(fruit: Tenant) -> None:
    default = run(fruit)
    assert [(h.event.event_id, h.score) for h in run(fruit, None).hits] == [
        (h.event.event_id, h.score) for h in default.hits
    ]


def test_feedback_reads_only_admitted_hits(fruit: Tenant) -> None:
    # A fact that out-scores the banana turn on "banana": with kind turn it is not a keyword
    # hit, so feedback never moves the query toward it.
    add(fruit, event("banana banana banana", [0.0, 0.0, 0.0, 1.0], kind="fact"))
    turns = vector_ranks(run(fruit, Feedback(hits=1, weight=0.5), kind="turn"))
    assert turns["durian"] == 1 and turns["apple"] == 2
    # Unrestricted, the fact is the first keyword hit: the query moves toward it instead.
    anything = run(fruit, Feedback(hits=1, weight=0.5))
    assert vector_ranks(anything)["apple"] == 1


def test_a_keyword_hit_without_a_vector_gives_no_feedback(fruit: Tenant) -> None:
    add(fruit, event("banana banana banana", None))  # the first keyword hit, with no vector
    assert vector_ranks(run(fruit, Feedback(hits=1, weight=0.5)))["apple"] == 1
    # The next hit has one: with two hits, the query moves toward banana's vector alone.
    assert vector_ranks(run(fruit, Feedback(hits=2, weight=0.5)))["durian"] == 1


def test_no_keyword_hit_leaves_the_query_as_sent(fruit: Tenant) -> None:
    plain = run(fruit, text="zucchini")
    fed = run(fruit, Feedback(hits=2, weight=0.5), text="zucchini")
    assert [h.event.event_id for h in fed.hits] == [h.event.event_id for h in plain.hits]


def test_feedback_needs_both_arms(fruit: Tenant) -> None:
    # Text only: no vector arm to move. Embedding only: no keyword hits to move it toward.
    for query in ({"embedding": None}, {"text": None}):
        plain = run(fruit, **query)
        fed = run(fruit, Feedback(), **query)
        assert [h.event.event_id for h in fed.hits] == [h.event.event_id for h in plain.hits]


@pytest.mark.parametrize("hits, weight", [(0, 0.5), (2, 0.0), (2, -1.0), (2, float("nan"))])
def test_feedback_settings_are_checked(hits: int, weight: float) -> None:
    with pytest.raises(ValueError, match="feedback needs"):
        Feedback(hits=hits, weight=weight)

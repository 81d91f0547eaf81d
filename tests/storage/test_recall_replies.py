"""The reply and time arms (storage/read/replies.py, storage/read/times.py), question scaffolding
left out of keyword queries, and explain naming every arm that ranked a hit."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from storage.index.keyword import query_terms
from storage.model import CHAIN_GAP_US, NewEvent
from storage.read.recall import RRF_K, RecallQuery, RecallResult, recall, validate
from storage.read.times import asks_when, says_time
from storage.tenants.tenant import Tenant
from tests.support.recall import add

MINUTE = 60_000_000
T0 = 1_683_504_000_000_000  # 2023-05-08 00:00 UTC


def turn(text: str, ts: int, emb: list[float] | None = None, **props: Any) -> NewEvent:
    """A turn with these properties (`who` names it in the assertions)."""
    return NewEvent(
        kind="turn", ts=ts, text=text, embedding=emb, properties_raw=msgspec.json.encode(props)
    )


def ask(t: Tenant, text: str, emb: list[float] | None = None, k: int = 5, **q: Any) -> RecallResult:
    """Validate and run one recall as the engine does, with explain."""
    query = RecallQuery(text=text, embedding=emb, k=k, explain=True, **q)
    with t.log.reader() as r:
        validate(query, t.dim, r.meta_str("model"))
        return recall(r, t.keyword, t.vectors, query)


def who(result: RecallResult) -> list[str]:
    """Each hit's `who`, in rank order."""
    return [msgspec.json.decode(h.event.properties_raw or b"{}")["who"] for h in result.hits]


def fused(result: RecallResult) -> list[float]:
    """Each hit's score recomputed from every rank explain gives it."""
    out = []
    for h in result.hits:
        assert h.ranks is not None and h.arm_ranks is not None
        ranks = [r for r in (*h.ranks, *h.arm_ranks.values()) if r is not None]
        out.append(sum(1 / (RRF_K + r) for r in ranks))
    return out


# -- replies ----------------------------------------------------------------------------------------


@pytest.fixture
def dance(tenant: Tenant) -> Tenant:
    add(
        tenant,
        turn("Gina: my team won first place at the dance competition", T0, who="G1"),
        turn(
            "Jon: Winning first place at a dance competition! What dance was it?",
            T0 + MINUTE,
            who="J1",
        ),
        turn("Gina: A contemporary piece called Finding Freedom.", T0 + 2 * MINUTE, who="G2"),
        turn("Gina: a dance class on Friday, first time in a while", T0 + 90 * MINUTE, who="G3"),
        turn("Jon: first place, wow", T0 + 91 * MINUTE, who="J2"),
    )
    return tenant


def test_the_reply_to_a_question_turn_ranks_beside_it(dance: Tenant) -> None:
    result = ask(dance, "What dance won first place?")
    ranked = who(result)
    assert "G2" in ranked  # no word of the question: only the reply arm brings it
    g2 = result.hits[ranked.index("G2")]
    assert g2.ranks == (None, None) and g2.arm_ranks == {"replies": 1}
    assert [h.score for h in result.hits] == pytest.approx(fused(result))


def test_a_reply_is_the_next_turn_of_the_same_conversation_within_the_gap(tenant: Tenant) -> None:
    add(
        tenant,
        turn("Ann: Where did you hide the spare key?", T0, conversation="a", who="A1"),
        turn("Bo: under the blue flowerpot", T0 + MINUTE, conversation="b", who="B1"),
        turn("Cy: behind the loose brick", T0 + 2 * MINUTE, conversation="a", who="A2"),
        turn("Di: Where is the spare key now?", T0 + 10 * MINUTE, who="D1"),
        turn("Ed: gone", T0 + 10 * MINUTE + CHAIN_GAP_US + 1, who="D2"),
    )
    result = ask(tenant, "spare key hide", k=10)
    replies = {w: h.arm_ranks for w, h in zip(who(result), result.hits, strict=True)}
    assert replies["A2"] == {"replies": 1}  # conversation a's next turn, not b's
    assert "B1" not in replies
    assert "D2" not in replies  # past the chain's gap: no reply


def test_a_reply_obeys_the_request_restrictions(dance: Tenant) -> None:
    assert "G2" not in who(ask(dance, "What dance won first place?", as_of=T0 + MINUTE))


def test_no_reply_arm_without_a_question_turn(dance: Tenant) -> None:
    result = ask(dance, "class on Friday")  # only G3 holds the words, and it asks nothing
    assert who(result) == ["G3"] and result.hits[0].arm_ranks == {}


# -- times ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "when"),
    [
        ("When did Melanie paint a sunrise?", True),
        ("  when is the talent show", True),
        ("How long has Caroline had her friends?", True),
        ("What date is the wedding?", True),
        ("What did Melanie paint?", False),
        ("Since when?", False),  # only a question that opens asking when
    ],
)
def test_asks_when(text: str, when: bool) -> None:
    assert asks_when(text) is when


@pytest.mark.parametrize(
    ("text", "time"),
    [
        ("I ran a charity race last Saturday", True),
        ("we went camping two weeks ago", True),
        ("back in 2019 I started", True),
        ("I ran a charity race for the shelter", False),
    ],
)
def test_says_time(text: str, time: bool) -> None:
    ev = NewEvent(kind="turn", ts=0, text=text)
    assert says_time(ev) is time  # type: ignore[arg-type]


def test_a_question_asking_when_puts_the_hit_that_says_a_time_first(tenant: Tenant) -> None:
    add(
        tenant,
        turn("Mel: the charity race for the shelter, a charity race to remember", T0, who="R1"),
        turn("Mel: I ran a charity race last Saturday", T0 + MINUTE, who="R2"),
    )
    what = ask(tenant, "What was the charity race for?")
    assert who(what)[0] == "R1"  # more of the words
    when = ask(tenant, "When did Mel run the charity race?")
    assert who(when)[0] == "R2"
    assert when.hits[0].arm_ranks == {"time.keyword": 1}
    assert when.focus is not None and when.focus.when
    assert [h.score for h in when.hits] == pytest.approx(fused(when))


# -- scaffolding and explain --------------------------------------------------------------------------


def test_question_scaffolding_is_left_out_of_keyword_queries() -> None:
    assert query_terms("What kind of music did she mention?") == ["music"]
    assert query_terms("How long has he lived there?") == ["lived"]
    assert query_terms("kind of") == ["kind", "of"]  # nothing else: the words as they are


def test_explain_names_the_focus_arms_that_ranked_each_hit(tenant: Tenant) -> None:
    add(
        tenant,
        turn(
            "Caroline: I painted a sunset, painting and paint",
            T0,
            [1, 0.1, 0, 0],
            who="C1",
            speaker="Caroline",
        ),
        turn(
            "Melanie: I painted a bird",
            T0 + 32 * 86_400_000_000,
            [0.6, 0.8, 0, 0],
            who="M1",
            speaker="Melanie",
        ),
    )
    result = ask(tenant, "What did Melanie paint?", [1.0, 0, 0, 0])
    assert result.focus is not None and result.focus.people == [("speaker", "Melanie")]
    first = result.hits[0]
    assert who(result)[0] == "M1"
    assert first.arm_ranks == {"person.keyword": 1, "person.vector": 1}
    assert [h.score for h in result.hits] == pytest.approx(fused(result))
    plain = RecallQuery(text="What did Melanie paint?", embedding=[1.0, 0, 0, 0], k=5)
    with tenant.log.reader() as r:
        unexplained = recall(r, tenant.keyword, tenant.vectors, plain)
    assert unexplained.focus is None and all(h.arm_ranks is None for h in unexplained.hits)

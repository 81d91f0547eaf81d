"""Query focus (storage/read/focus.py): the dates a recall's text names as windows over `ts`,
the people it names that the tenant has seen, and the focus arms that rank their events first."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from storage.model import AppendResult, NewEvent
from storage.read.dates import DAY_PAD_US, DAY_US, windows
from storage.read.focus import embedded_question, understand
from storage.read.recall import RecallQuery, RecallResult, recall, validate
from storage.read.speakers import candidates, people
from storage.tenants.tenant import Tenant


def us(*args: int) -> int:
    """µs since the epoch of a UTC date (and time)."""
    return int(datetime(*args, tzinfo=UTC).timestamp()) * 1_000_000  # type: ignore[misc]


REF = us(2023, 10, 20, 15, 30)  # a Friday afternoon
REFERENCE = lambda: REF  # noqa: E731


def day(y: int, m: int, d: int) -> tuple[int, int]:
    """The window a named day gets: the day, padded."""
    lo = us(y, m, d)
    return lo - DAY_PAD_US, lo + DAY_US + DAY_PAD_US


# -- dates ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "What did she paint on October 13, 2023?",
        "what did she paint on 13 October, 2023",
        "What happened on 13th October 2023?",
        "What happened on the 13th of October 2023?",
        "What happened on Oct. 13, 2023?",
        "What happened on 2023-10-13?",
        "the walk on October 13,2023",
    ],
)
def test_an_absolute_day_in_several_forms(text: str) -> None:
    assert windows(text, REFERENCE).windows == [day(2023, 10, 13)]


def test_a_day_without_its_year_is_the_latest_before_the_reference() -> None:
    assert windows("What did he say on 13 October?", REFERENCE).windows == [day(2023, 10, 13)]
    assert windows("What did he say on 25 December?", REFERENCE).windows == [day(2022, 12, 25)]


def test_months_and_years() -> None:
    assert windows("What did Tim learn in August 2023?", REFERENCE).windows == [
        (us(2023, 8, 1), us(2023, 9, 1))
    ]
    assert windows("What did Tim do in December?", REFERENCE).windows == [
        (us(2022, 12, 1), us(2023, 1, 1))
    ]
    assert windows("Which prize did he win in 2022?", REFERENCE).windows == [
        (us(2022, 1, 1), us(2023, 1, 1))
    ]


@pytest.mark.parametrize(
    ("text", "window"),
    [
        ("What did Joanna write yesterday?", (us(2023, 10, 19), us(2023, 10, 20))),
        ("what did we decide today", (us(2023, 10, 20), us(2023, 10, 21))),
        ("What did she find last week?", (us(2023, 10, 6), us(2023, 10, 20))),
        ("What did he cook last Monday?", (us(2023, 10, 16), us(2023, 10, 17))),
        ("What did he cook 3 days ago?", (us(2023, 10, 17), us(2023, 10, 18))),
        ("Where did she go two weeks ago?", (us(2023, 10, 3), us(2023, 10, 10))),
    ],
)
def test_relative_dates_count_back_from_the_reference(text: str, window: tuple[int, int]) -> None:
    assert windows(text, REFERENCE).windows == [window]


@pytest.mark.parametrize(
    "text",
    [
        "May I ask what she likes?",
        "What did she paint on 31 February 2023?",
        "Which of the 2 dogs is older?",
        "What is her phone number, 555 2023?",
        "What did they march for?",
    ],
)
def test_no_date(text: str) -> None:
    assert windows(text, REFERENCE).windows == []


def test_the_reference_is_read_only_when_needed() -> None:
    def reference() -> int:
        raise AssertionError("an absolute date needs no reference")

    assert windows("on 13 October 2023", reference).windows == [day(2023, 10, 13)]
    assert windows("what did she like", reference).windows == []


# -- people -----------------------------------------------------------------------------------------


def add(t: Tenant, *events: NewEvent) -> None:
    """Append events in one group commit."""
    results = t.submit_append(list(events)).result()
    assert all(isinstance(r, AppendResult) for r in results), results


def turn(
    text: str,
    ts: int = REF,
    emb: list[float] | None = None,
    subjects: tuple[str, ...] = (),
    **props: Any,
) -> NewEvent:
    """A turn with these properties."""
    raw = msgspec.json.encode(props)
    return NewEvent(
        kind="turn", ts=ts, text=text, embedding=emb, properties_raw=raw, subjects=subjects
    )


def test_candidates_are_capitalised_words_not_sentence_openers() -> None:
    assert candidates("Will Ann come to the party?") == ["Ann"]
    assert candidates("What did Will say about Ann's dog?") == ["Will", "Ann"]
    assert candidates("Did Ann Smith call?") == ["Ann Smith", "Ann", "Smith"]
    assert candidates("what did the grace period cover?") == []


@pytest.fixture
def people_tenant(tenant: Tenant) -> Tenant:
    """Turns said by Will, Grace and ann (lowercase), one about the subject 'Mo'."""
    add(
        tenant,
        turn("the trip was long", speaker="Will"),
        turn("I loved the museum", speaker="Grace"),
        turn("the hotel was fine", actor="ann"),
        turn("a note about someone", subjects=("Mo",)),
        turn("the weather was grace itself", speaker="the"),
    )
    return tenant


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("What did Will say about the trip?", [("speaker", "Will")]),
        ("Will Grace visit the museum?", [("speaker", "Grace")]),
        ("What will grace do?", []),  # lowercase: a word, not a name
        ("What did Ann think of the hotel?", [("actor", "ann")]),
        ("What do we know about Mo?", [("$subject", "Mo")]),
        ("What happened to The hotel?", []),  # "The" opens nothing here, but "the" is no name
        ("What did Will and Grace do?", [("speaker", "Will"), ("speaker", "Grace")]),
        ("What did Bob say?", []),
    ],
)
def test_people_the_tenant_has_seen(people_tenant: Tenant, text: str, found: list[Any]) -> None:
    with people_tenant.log.reader() as r:
        assert people(r, text) == found


@pytest.mark.parametrize(
    ("text", "embedded"),
    [
        ("What did Will say about the trip?", "What did   say about the trip?"),
        ("What did Will and Grace's son do?", "What did   and   son do?"),
        ("What do we know about Mo?", "What do we know about  ?"),  # a data subject
        ("What did Bob say in Paris?", "What did Bob say in Paris?"),  # not seen: kept
        ("What will grace do?", "What will grace do?"),  # a word, not a name
        ("Grace?", "Grace?"),  # nothing else: the text as asked
    ],
)
def test_the_server_embeds_the_question_less_the_people_it_names(
    people_tenant: Tenant, text: str, embedded: str
) -> None:
    with people_tenant.log.reader() as r:
        assert embedded_question(r, text, None) == embedded


def test_a_month_taken_by_a_date_is_no_name(tenant: Tenant) -> None:
    add(tenant, turn("hello", speaker="May"), turn("hi", ts=us(2023, 5, 2), speaker="Ann"))
    with tenant.log.reader() as r:
        focus = understand(r, "What did May say in May?", None)
        assert focus.people == [("speaker", "May")]
        assert focus.windows == [(us(2023, 5, 1), us(2023, 6, 1))]  # May before the newest ts
        assert understand(r, "What did Ann say in May?", None).people == [("speaker", "Ann")]


# -- the focus arms ---------------------------------------------------------------------------------

# Vectors in 4 dimensions; the query's is PAINT. Without focus, Caroline's long turn about
# painting wins both arms (more of the words, the nearer vector); Melanie's is second in both.
PAINT = [1.0, 0.0, 0.0, 0.0]


def ask(t: Tenant, text: str, emb: list[float] | None = PAINT) -> RecallResult:
    """Validate and run one recall as the engine does, with explain."""
    q = RecallQuery(text=text, embedding=emb, k=5, explain=True)
    with t.log.reader() as r:
        validate(q, t.dim, r.meta_str("model"))
        return recall(r, t.keyword, t.vectors, q)


def said(result: RecallResult) -> list[str]:
    """Each hit's `who` property, in rank order."""
    return [msgspec.json.decode(h.event.properties_raw or b"{}")["who"] for h in result.hits]


@pytest.fixture
def painters(tenant: Tenant) -> Tenant:
    add(
        tenant,
        turn(
            "I painted a sunset, painting and paint",
            us(2023, 5, 8),
            [1, 0.1, 0, 0],
            who="C1",
            speaker="Caroline",
        ),
        turn("I painted a bird", us(2023, 6, 9), [0.6, 0.8, 0, 0], who="M1", speaker="Melanie"),
        turn("my kids paint too", us(2023, 5, 8), [0.5, 0, 0.86, 0], who="C2", speaker="Caroline"),
        turn("we went hiking", us(2023, 7, 1), [0, 0, 0, 1], who="M2", speaker="Melanie"),
    )
    return tenant


def test_the_person_named_ranks_their_turn_first(painters: Tenant) -> None:
    plain = ask(painters, "What did someone paint?")
    assert said(plain)[:2] == ["C1", "M1"]  # without a name: the arms' own order
    named = ask(painters, "What did Melanie paint?")
    assert said(named)[0] == "M1"
    first = named.hits[0]
    assert first.ranks is not None and None not in first.ranks and min(first.ranks) > 1


def test_the_date_named_ranks_that_day_first(painters: Tenant) -> None:
    assert said(ask(painters, "What did she paint on 9 June, 2023?"))[0] == "M1"
    assert said(ask(painters, "What did she paint in May 2023?"))[:2] == ["C1", "C2"]


def test_focus_works_for_the_keyword_arm_alone(painters: Tenant) -> None:
    assert said(ask(painters, "What did someone paint?", None))[0] == "C1"
    assert said(ask(painters, "What did Melanie paint?", None))[0] == "M1"


def test_focus_obeys_the_request_restrictions(painters: Tenant) -> None:
    q = RecallQuery(text="What did Melanie paint?", embedding=PAINT, k=5, filters={"who": "C1"})
    with painters.log.reader() as r:
        result = recall(r, painters.keyword, painters.vectors, q)
    assert said(result) == ["C1"]


def test_a_window_that_holds_no_event_or_every_event_is_dropped(tenant: Tenant) -> None:
    add(tenant, turn("hello", us(2023, 5, 2, 10)), turn("hi", us(2023, 5, 3, 11)))
    with tenant.log.reader() as r:
        assert understand(r, "What did they say in 2023?", None).windows == []  # every event
        assert understand(r, "What did they say on 9 May 2023?", None).windows == []  # none
        assert understand(r, "What did they say on 2 May 2023?", None).windows == [day(2023, 5, 2)]

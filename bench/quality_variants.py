"""Query-side ranking variants on LoCoMo's development conversations, both modes, in process.

Each development conversation (0-4) is written twice through storage's real stores, as
bench/quality_server.py writes it: once with the vectors a server that embeds would store
(`chosen`: the chain) and once with the client's MiniLM vectors (the npz's). Every question is
asked as the engine asks it (`validate`, then `storage.read.recall.recall`, `kind: turn`,
`k: 10`, the server's feedback), text and vector, with one variant of the ranking switched in
at a time (`VARIANTS`: each patches storage's own functions for the duration of its run).
Rows per category as bench/quality_server.py reports them. The baseline row is the code as it
is; it equals quality_server.py's `chosen` and `client` figures.

Conversations 0-4 only: variants are chosen here. `--held-out --only NAME` runs named
variants on 5-9 to report them, once, after the choice.
LoCoMo is CC BY-NC 4.0, used here to evaluate only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
import quality_server as qs  # noqa: E402  (plain file beside this one)
from common import scratch_dir, write_json  # noqa: E402

import storage.index.keyword as keyword_mod  # noqa: E402
import storage.read.recall as rr  # noqa: E402
from storage.index.flat import as_float32, unit  # noqa: E402
from storage.model import CHAIN_GAP_US, StoredEvent  # noqa: E402
from storage.read.focus import embedded_question, understand  # noqa: E402
from storage.read.recall import RecallQuery, recall, validate  # noqa: E402
from storage.tenants.tenant import Tenant  # noqa: E402

Patch = Callable[[], contextlib.AbstractContextManager[None]]


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


@dataclass
class Variant:
    """One row: a name, what it switches in (a context manager over storage's functions) and
    which question vectors a server-embedded tenant is asked with (QUESTION_TEXTS)."""

    name: str
    patch: Patch = _nothing
    asked: str = "the server's"
    turns: str = "as sent"  # the text a server-embedded turn's vector is made from (TURN_TEXTS)


# -- the variants -----------------------------------------------------------------------------------
#
# Each replaces storage.read.recall.rank for its run by `ranking(...)` below, which is rank()
# with extra arms and weights: `extra(kw, vec, adm, depth, rankings, focused, fused)` returns
# (ranking, weight) pairs fused after the first fusion (a second fusion over everything).


Extra = Callable[..., list[tuple[list[StoredEvent], float]]]


def weighted_fuse(
    rankings: list[tuple[list[StoredEvent], float, int]],
) -> list[tuple[StoredEvent, float]]:
    """RRF with a weight and a constant per ranking; ties keep first-seen order."""
    scores: dict[str, float] = {}
    events: dict[str, StoredEvent] = {}
    for ranking, w, c in rankings:
        for n, ev in enumerate(ranking, start=1):
            scores[ev.event_id] = scores.get(ev.event_id, 0.0) + w / (c + n)
            events.setdefault(ev.event_id, ev)
    order = sorted(scores, key=lambda e: -scores[e])
    return [(events[e], scores[e]) for e in order]


@dataclass(frozen=True)
class Knobs:
    """What a variant changes in rank()."""

    extra: Extra | None = None
    main_c: tuple[int, int] = (60, 60)  # RRF constants: keyword, vector
    focus_c: int = 60
    focus_w: float = 1.0
    query_text: Callable[[str], str] | None = None  # the main keyword arm's text
    moved: Callable[..., np.ndarray] | None = None  # feedback's moved query


def ranking(knobs: Knobs) -> Callable[..., list[rr.Hit]]:
    """storage.read.recall.rank with the knobs."""

    def rank(kw, vec, adm, k, feedback=None, focus=None):  # type: ignore[no-untyped-def]
        depth = k
        while True:
            rankings: list[list[StoredEvent]] = []
            query = None
            if adm.q.text:
                main = rr._unfocused(adm, focus)
                if knobs.query_text is not None:
                    main = main.narrowed({}, None) if main is adm else main
                    main.focused = False
                    main.q = msgspec.structs.replace(main.q, text=knobs.query_text(main.q.text))
                rankings.append(rr.keyword_arm(kw, main, depth))
                if feedback is not None and adm.q.embedding is not None:
                    moved = knobs.moved or rr.moved_query
                    query = moved(adm, rankings[0], feedback)
            if adm.q.embedding is not None:
                rankings.append(rr.vector_arm(vec, adm, depth, query))
            named = rr.focus_arms(kw, vec, adm, depth, query, focus) if focus else []
            focused = [ranking for _name, ranking in named]
            consts = list(knobs.main_c[: len(rankings)]) if adm.q.text else [knobs.main_c[1]]
            lists = [(r, 1.0, c) for r, c in zip(rankings, consts, strict=True)]
            lists += [(r, knobs.focus_w, knobs.focus_c) for r in focused]
            fused = weighted_fuse(lists)
            if knobs.extra is not None:
                more = knobs.extra(kw, vec, adm, depth, rankings, focused, fused, query)
                if more:
                    fused = weighted_fuse(lists + [(r, w, 60) for r, w in more])
            hits = rr.substitute(fused, adm, k)
            exhausted = all(len(r) < depth for r in rankings)
            if len(hits) >= k or exhausted or depth >= rr.MAX_ARM_DEPTH:
                return hits
            depth = min(4 * depth, rr.MAX_ARM_DEPTH)

    return rank


def knobs(stop: frozenset[str] = keyword_mod.STOP_WORDS, **kw: Any) -> Patch:
    """A patch that ranks as main did before this bench (rank() without the time and reply
    arms, queries less the stop words alone) with these knobs and these query stop words."""

    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        saved, words = rr.rank, keyword_mod.QUERY_STOP_WORDS
        rr.rank = ranking(Knobs(**kw))
        keyword_mod.QUERY_STOP_WORDS = stop
        try:
            yield
        finally:
            rr.rank, keyword_mod.QUERY_STOP_WORDS = saved, words

    return patch


def _conversation(ev: StoredEvent) -> Any:
    return ev.filterable.get("conversation")


def next_turn(adm: rr.Admission, ev: StoredEvent, after: bool) -> StoredEvent | None:
    """The admitted turn right after (before) ev in ts order, of its conversation, within the
    chain's gap."""
    r = adm.r
    if after:
        ids = r.raw_ids_by_ts(ev.ts + 1, ev.ts + CHAIN_GAP_US)
    else:
        ids = reversed(list(r.raw_ids_by_ts(ev.ts - CHAIN_GAP_US, ev.ts)))
    for raw in ids:
        other = r.get_light_raw(raw)
        if other is None or other.event_id == ev.event_id or other.kind != ev.kind:
            continue
        if _conversation(other) != _conversation(ev):
            continue
        return other if adm.admit(other) else None
    return None


def neighbours(
    top: int,
    weight: float,
    after: bool = True,
    before: bool = False,
    source: str = "fused",
    asking: bool = False,
) -> Extra:
    """An arm of the turns next to (after and/or before) the first `top` fused hits, in order."""

    def extra(kw, vec, adm, depth, rankings, focused, fused, query):  # type: ignore[no-untyped-def]
        if source == "fused":
            base = [ev for ev, _s in fused[:top]]
        elif source == "keyword":
            base = rankings[0][:top] if adm.q.text else []
        else:
            base = rankings[-1][:top]
        out: dict[str, StoredEvent] = {}
        for ev in base:
            if asking and not (ev.text or "").rstrip().endswith("?"):
                continue
            for side in ([True] if after else []) + ([False] if before else []):
                n = next_turn(adm, ev, side)
                if n is not None:
                    out.setdefault(n.event_id, n)
        return [(list(out.values()), weight)]

    return extra


TIME_WORDS = re.compile(
    r"\b(yesterday|today|tonight|tomorrow|ago|last|next|week|weekend|month|year|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday|"
    r"january|february|march|april|may|june|july|august|september|october|november|december|"
    r"\d{4}|since|recently|lately|soon)\b",
    re.I,
)
WHEN = re.compile(r"^\s*(when|how long|what (day|date|time|year|month))\b", re.I)


def timed(weight: float, deep: int = 5, arms: str = "both") -> Extra:
    """For a question asking when: an arm of the main keyword and vector arms' hits, deeper,
    that say a time (yesterday, last week, a weekday, a month, a year)."""

    def extra(kw, vec, adm, depth, rankings, focused, fused, query):  # type: ignore[no-untyped-def]
        if not adm.q.text or not WHEN.search(adm.q.text):
            return []
        main = rr._unfocused(adm, None)
        out = []
        if arms != "vector":
            deeper = rr.keyword_arm(kw, main, depth * deep)
            said = [e for e in deeper if e.text and TIME_WORDS.search(e.text)]
            out.append((said[:depth], weight))
        if adm.q.embedding is not None and arms != "keyword":
            v = rr.vector_arm(vec, adm, depth * deep, query)
            out.append(([e for e in v if e.text and TIME_WORDS.search(e.text)][:depth], weight))
        return out

    return extra


# Question scaffolding as storage.index.keyword's QUERY_STOP_WORDS adds it (the variant tried
# on the main keyword arm alone).
SCAFFOLD = keyword_mod.QUERY_STOP_WORDS - keyword_mod.STOP_WORDS


def unscaffolded(text: str) -> str:
    """The text less question scaffolding words (kept if nothing else would remain)."""
    words = re.findall(r"[^\W_]+", text)
    kept = [w for w in words if w.lower() not in SCAFFOLD]
    return " ".join(kept) if kept else text


def moved_with_vector(hits: int, weight: float) -> Callable[..., np.ndarray]:
    """Feedback from the keyword hits as now, then toward the first `hits` of a first vector
    search with that moved query too (Rocchio over the stored vectors of both)."""

    def moved(adm, keyword, feedback):  # type: ignore[no-untyped-def]
        q = rr.moved_query(adm, keyword, feedback)
        return _rocchio(adm, q, hits, weight)

    return moved


def _rocchio(adm: rr.Admission, q: np.ndarray, hits: int, weight: float) -> np.ndarray:
    vec = _VEC[0]
    first = rr.vector_arm(vec, adm, hits, q)
    rows = []
    for ev in first:
        whole = adm.r.get(ev.event_id)
        if whole is not None and whole.embedding is not None:
            rows.append(unit(as_float32(whole.embedding)))
    if not rows:
        return q
    return unit(q + np.float32(weight) * np.mean(rows, axis=0))


_VEC: list[Any] = [None]  # the tenant's vector index during a run (Rocchio's first search)


def both(*extras: Extra) -> Extra:
    """Several extras' arms together."""

    def extra(*a):  # type: ignore[no-untyped-def]
        return [x for e in extras for x in e(*a)]

    return extra


def moved_kw(hits: int, weight: float) -> Callable[..., np.ndarray]:
    """Feedback from the first `hits` keyword hits at `weight`."""

    def moved(adm, keyword, feedback):  # type: ignore[no-untyped-def]
        return rr.moved_query(adm, keyword, rr.Feedback(hits=hits, weight=weight))

    return moved


# -- round 6 (h36-quality3) -------------------------------------------------------------------------


def content_words(text: str | None) -> int:
    """Distinct words of a text that a query could search for (stop words and scaffolding out)."""
    return len({w for w in keyword_mod.query_words(text or "")} - keyword_mod.QUERY_STOP_WORDS)


def short_last(fewest: int, drop: bool = False) -> Patch:
    """Keyword arms (main and focus) with the hits of at most `fewest` content words after the
    others (or dropped): greetings and thanks that match one word of the question and win on
    BM25's length normalisation ("Nate: Take care!")."""

    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        saved = rr.keyword_arm

        def arm(kw, adm, depth, most=None):  # type: ignore[no-untyped-def]
            ranked = saved(kw, adm, depth, most)
            long = [e for e in ranked if content_words(e.text) > fewest]
            return long if drop else long + [e for e in ranked if content_words(e.text) <= fewest]

        rr.keyword_arm = arm
        try:
            yield
        finally:
            rr.keyword_arm = saved

    return patch


def firsts_of_days(top: int, hours: int = 24) -> Patch:
    """One more RRF list at the first fusion: the first fused hit of each day (UTC, or each
    `hours` block) among the first `top`, in fused order (session-aware fusion, softer than a
    cap: the best turn of every session it touches gains one list's share)."""

    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        saved = rr.fuse
        block = hours * 3_600_000_000

        def fuse(rankings):  # type: ignore[no-untyped-def]
            fused = saved(rankings)
            seen: set[int] = set()
            firsts = []
            for ev, _s in fused[:top]:
                if ev.ts // block not in seen:
                    seen.add(ev.ts // block)
                    firsts.append(ev)
            return saved([*rankings, firsts])

        rr.fuse = fuse
        try:
            yield
        finally:
            rr.fuse = saved

    return patch


_MEANS: dict[tuple[int, str, str], np.ndarray] = {}  # (tenant, property, value) -> mean vector


def _mean(r: Any, key: tuple[int, str, str], ids: Any) -> np.ndarray | None:
    if key not in _MEANS:
        rows = [unit(as_float32(e.embedding)) for e in map(r.get, ids) if e and e.embedding]
        _MEANS[key] = np.mean(rows, axis=0) if rows else None  # type: ignore[assignment]
    return _MEANS[key]


def less_person_direction(beta: float, project: bool = True) -> Patch:
    """Feedback's moved query, then less the direction from the tenant's mean turn vector to
    the mean vector of each person the text names (their turns' shared part: the name)."""

    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        saved = rr.moved_query

        def moved(adm, keyword, feedback):  # type: ignore[no-untyped-def]
            q = saved(adm, keyword, feedback)
            focus = understand(adm.r, adm.q.text, None)
            if not focus.people:
                return q
            tid = id(_VEC[0])
            every = _mean(adm.r, (tid, "", ""), adm.r.ids_by_kind("turn"))
            for prop, value in focus.people:
                own = _mean(adm.r, (tid, prop, value), adm.r.ids_by_property(prop, value))
                if own is None or every is None:
                    continue
                d = unit(own - every)
                q = q - np.float32(beta * (float(q @ d) if project else 1.0)) * d
            return unit(q)

        rr.moved_query = moved
        try:
            yield
        finally:
            rr.moved_query = saved

    return patch


def first_person_arms() -> Patch:
    """Person arms for the first person named when the text names several (the subject of
    "What did Nate recommend to Joanna?")."""

    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        saved = rr.focus_arms

        def arms(kw, vec, adm, depth, query, focus):  # type: ignore[no-untyped-def]
            if len(focus.people) > 1:
                focus = msgspec.structs.replace(focus, people=focus.people[:1])
            return saved(kw, vec, adm, depth, query, focus)

        rr.focus_arms = arms
        try:
            yield
        finally:
            rr.focus_arms = saved

    return patch


def no_main_vector_when_one_person() -> Patch:
    """When the text names one person, the main vector arm's list is left out of the fusion
    (the person's own vector arm ranks inside their events; the main one leans to the name)."""

    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        saved_rank = rr.rank

        def rank(kw, vec, adm, k, feedback=None, focus=None):  # type: ignore[no-untyped-def]
            if focus is None or len(focus.people) != 1:
                return saved_rank(kw, vec, adm, k, feedback, focus)
            saved_vec = rr.vector_arm
            calls = [0]

            def vector_arm(v, a, depth, query=None):  # type: ignore[no-untyped-def]
                calls[0] += 1
                if not a.focused and calls[0] == 1:
                    return []
                return saved_vec(v, a, depth, query)

            rr.vector_arm = vector_arm
            try:
                return saved_rank(kw, vec, adm, k, feedback, focus)
            finally:
                rr.vector_arm = saved_vec

        rr.rank = rank
        try:
            yield
        finally:
            rr.rank = saved_rank

    return patch


def feedback_when_named(weight: float, hits: int = 2) -> Patch:
    """Feedback at `weight` (from `hits` keyword hits) when the text names a person the tenant
    has seen, as it is otherwise: the keyword arms leave the name out, so moving the vector
    further toward their hits dilutes the name in a vector that holds it."""

    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        saved = rr.moved_query

        def moved(adm, keyword, feedback):  # type: ignore[no-untyped-def]
            if understand(adm.r, adm.q.text, None).people:
                feedback = rr.Feedback(hits=hits, weight=weight)
            return saved(adm, keyword, feedback)

        rr.moved_query = moved
        try:
            yield
        finally:
            rr.moved_query = saved

    return patch


def replies_from(top: int) -> Patch:
    """The reply arm looks for the replies of question turns among the first `top` fused."""

    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        import storage.read.replies as replies_mod

        saved = replies_mod.REPLY_FROM
        replies_mod.REPLY_FROM = top
        try:
            yield
        finally:
            replies_mod.REPLY_FROM = saved

    return patch


def focus_deeper(times: int) -> Patch:
    """Focus arms `times` as deep as the main arms."""

    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        saved = rr.focus_arms

        def arms(kw, vec, adm, depth, query, focus):  # type: ignore[no-untyped-def]
            return saved(kw, vec, adm, depth * times, query, focus)

        rr.focus_arms = arms
        try:
            yield
        finally:
            rr.focus_arms = saved

    return patch


def speaker_goes_on(top: int = 10) -> Patch:
    """One more RRF list after the reply arm: for each of the first `top` fused turns that asks
    nothing, the next turn of its conversation by the same speaker within the chain's gap
    (the speaker going on after the other's reply)."""

    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        import storage.read.replies as replies_mod

        saved = rr.reply_arm

        def reply_arm(r, fused, admit):  # type: ignore[no-untyped-def]
            out = saved(r, fused, admit)
            more: dict[str, StoredEvent] = {}
            for ev in fused[:top]:
                if replies_mod.asks(ev):
                    continue
                who = ev.filterable.get("speaker") if ev.filterable else None
                if who is None:
                    props = msgspec.json.decode(ev.properties_raw or b"{}")
                    who = props.get("speaker")
                for n, raw in enumerate(r.raw_ids_by_ts(ev.ts + 1, ev.ts + CHAIN_GAP_US)):
                    if n >= 8:
                        break
                    other = r.get_light_raw(raw)
                    if other is None or other.kind != ev.kind:
                        continue
                    props = msgspec.json.decode(other.properties_raw or b"{}")
                    if props.get("speaker") == who:
                        if admit(other) and other.event_id not in more:
                            more[other.event_id] = other
                        break
            seen = {o.event_id for o in out}
            return out + [e for e in more.values() if e.event_id not in seen]

        rr.reply_arm = reply_arm
        try:
            yield
        finally:
            rr.reply_arm = saved

    return patch


def _without_people(r: Any, text: str, least: int) -> str:
    """The text less the people it names (as the focus reads them), when it names `least`."""
    focus = understand(r, text, None)
    if len(focus.people) < least:
        return text
    return focus.without(text, people=True, dates=False)


def _without_focus(r: Any, text: str) -> str:
    """The text less the people and the dates it names (as the focus reads them)."""
    return understand(r, text, None).without(text, people=True, dates=True)


def _without_candidates(text: str) -> str:
    """The text less every word that could be a name, known to the tenant or not."""
    import re as _re

    from storage.read.speakers import candidates

    out = text
    for name in sorted(candidates(text), key=len, reverse=True):
        out = _re.sub(rf"\b{_re.escape(name)}(?:'s|\u2019s)?\b", " ", out)
    return out if _re.search(r"\w", out) else text


# The texts a server may embed for a question (variants' `asked`), made per tenant at build;
# "the server's" is what storage/tenants/serving.py embeds (the baseline).
QUESTION_TEXTS: dict[str, Callable[[Any, str], str]] = {
    "the server's": lambda r, text: embedded_question(r, text, None),
    "as asked": lambda r, text: text,
    "less the people, when two or more": lambda r, text: _without_people(r, text, 2),
    "less the people": lambda r, text: _without_people(r, text, 1),
    "less the people and dates": lambda r, text: _without_focus(r, text),
    "less every capitalised candidate": lambda r, text: _without_candidates(text),
    "less the people, question word dropped": lambda r, text: qs.QUERY_TEXTS[
        "question word dropped"
    ](embedded_question(r, text, None)),
    "less the people, no question mark": lambda r, text: qs.QUERY_TEXTS["no question mark"](
        embedded_question(r, text, None)
    ),
}


VARIANTS: list[Variant] = [
    Variant("baseline (the code as it is)"),
    Variant("main: rank() as it was", knobs()),
    Variant("next turns of fused top 10, w 1", knobs(extra=neighbours(10, 1.0))),
    Variant("next turns of fused top 10, w 0.5", knobs(extra=neighbours(10, 0.5))),
    Variant("next turns of fused top 5, w 0.5", knobs(extra=neighbours(5, 0.5))),
    Variant(
        "next+prev turns of fused top 10, w 0.5", knobs(extra=neighbours(10, 0.5, before=True))
    ),
    Variant(
        "prev turns of fused top 10, w 0.5",
        knobs(extra=neighbours(10, 0.5, after=False, before=True)),
    ),
    Variant(
        "next turns of keyword top 10, w 0.5", knobs(extra=neighbours(10, 0.5, source="keyword"))
    ),
    Variant(
        "next turns of vector top 10, w 0.5", knobs(extra=neighbours(10, 0.5, source="vector"))
    ),
    Variant("when: time-word arms, w 1", knobs(extra=timed(1.0))),
    Variant("when: time-word arms, w 0.5", knobs(extra=timed(0.5))),
    Variant("query less scaffolding words", knobs(query_text=unscaffolded)),
    Variant("focus arms RRF constant 30", knobs(focus_c=30)),
    Variant("focus arms RRF constant 120", knobs(focus_c=120)),
    Variant("keyword RRF constant 40", knobs(main_c=(40, 60))),
    Variant("vector RRF constant 40", knobs(main_c=(60, 40))),
    Variant("feedback 3 keyword hits x 0.5", knobs(moved=moved_kw(3, 0.5))),
    Variant("feedback 2 keyword hits x 0.7", knobs(moved=moved_kw(2, 0.7))),
    Variant("feedback + Rocchio over vector top 3 x 0.3", knobs(moved=moved_with_vector(3, 0.3))),
    Variant("feedback + Rocchio over vector top 5 x 0.5", knobs(moved=moved_with_vector(5, 0.5))),
    # round 2
    Variant("r2 next turns of fused top 10, w 0.75", knobs(extra=neighbours(10, 0.75))),
    Variant("r2 next turns of fused top 10, w 1.5", knobs(extra=neighbours(10, 1.5))),
    Variant("r2 next turns of fused top 20, w 1", knobs(extra=neighbours(20, 1.0))),
    Variant(
        "r2 next+prev turns of fused top 10, w 1", knobs(extra=neighbours(10, 1.0, before=True))
    ),
    Variant(
        "r2 next turns of question turns in fused top 10, w 1",
        knobs(extra=neighbours(10, 1.0, asking=True)),
    ),
    Variant(
        "r2 next turns of question turns in fused top 20, w 1",
        knobs(extra=neighbours(20, 1.0, asking=True)),
    ),
    Variant("r2 when: time-word arms, w 1.5", knobs(extra=timed(1.5))),
    Variant("r2 when: time-word arms 10 deep, w 1", knobs(extra=timed(1.0, deep=10))),
    Variant("r2 when: time-word keyword arm, w 1", knobs(extra=timed(1.0, arms="keyword"))),
    Variant("r2 when: time-word vector arm, w 1", knobs(extra=timed(1.0, arms="vector"))),
    Variant(
        "r2 when w1 + scaffolding + focus c 30",
        knobs(extra=timed(1.0), query_text=unscaffolded, focus_c=30),
    ),
    Variant("r3 asking-next w 0.75", knobs(extra=neighbours(10, 0.75, asking=True))),
    Variant("r3 asking-next w 1.5", knobs(extra=neighbours(10, 1.5, asking=True))),
    Variant(
        "r3 asking-next + when", knobs(extra=both(timed(1.0), neighbours(10, 1.0, asking=True)))
    ),
    Variant(
        "r3 asking-next + when + scaffolding",
        knobs(extra=both(timed(1.0), neighbours(10, 1.0, asking=True)), query_text=unscaffolded),
    ),
    Variant(
        "r3 asking-next + when + focus c 30",
        knobs(extra=both(timed(1.0), neighbours(10, 1.0, asking=True)), focus_c=30),
    ),
    Variant(
        "r3 asking-next + when + scaffolding + focus c 30",
        knobs(
            extra=both(timed(1.0), neighbours(10, 1.0, asking=True)),
            query_text=unscaffolded,
            focus_c=30,
        ),
    ),
    Variant(
        "r4 asking-next + when + scaffolding in every keyword query",
        knobs(
            extra=both(timed(1.0), neighbours(10, 1.0, asking=True)),
            stop=keyword_mod.QUERY_STOP_WORDS,
        ),
    ),
    Variant("r4 scaffolding in every keyword query", knobs(stop=keyword_mod.QUERY_STOP_WORDS)),
    *(
        Variant(
            f"r5 asking-next + scaffolding + time arms {arms} {deep}x deep",
            knobs(
                extra=both(timed(1.0, deep=deep, arms=arms), neighbours(10, 1.0, asking=True)),
                stop=keyword_mod.QUERY_STOP_WORDS,
            ),
        )
        for arms, deep in (("both", 1), ("both", 2), ("keyword", 5), ("keyword", 2), ("vector", 2))
    ),
    Variant(
        "r2 when w1 + next turns w1 + scaffolding + focus c 30",
        knobs(extra=both(timed(1.0), neighbours(10, 1.0)), query_text=unscaffolded, focus_c=30),
    ),
    # round 6 (h36-quality3): over the code as it is
    Variant("r6 keyword hits of <= 3 content words last", short_last(3)),
    Variant("r6 first hit of each day among fused 30", firsts_of_days(30)),
    Variant("r6 first hit of each day among fused 20", firsts_of_days(20)),
    Variant("r6 keyword hits of <= 4 content words last", short_last(4)),
    Variant("r6 keyword hits of <= 2 content words last", short_last(2)),
    Variant("r6 keyword hits of <= 3 content words dropped", short_last(3, drop=True)),
    Variant("r6 server embeds the question as asked (main)", asked="as asked"),
    Variant("r7 query less the person's direction, projected x1", less_person_direction(1.0)),
    Variant("r7 first of several people named gets arms", first_person_arms()),
    Variant("r8 replies of question turns among the first 20", replies_from(20)),
    Variant("r9 server embeds turns without the speaker's name", turns="no speaker"),
    Variant(
        "r9 server embeds the question less its people and question word",
        asked="less the people, question word dropped",
    ),
    Variant(
        "r9 server embeds the question less its people and question mark",
        asked="less the people, no question mark",
    ),
    Variant(
        "r9 server embeds turns without the speaker's name, questions as asked",
        turns="no speaker",
        asked="as asked",
    ),
    Variant("r8 replies of question turns among the first 5", replies_from(5)),
    Variant("r8 focus arms twice as deep", focus_deeper(2)),
    Variant(
        "r8 the speaker's next turn after each of the first 10, in the reply list",
        speaker_goes_on(),
    ),
    Variant("r7 feedback x1 when a person is named", feedback_when_named(1.0)),
    Variant("r7 feedback x0.75 when a person is named", feedback_when_named(0.75)),
    Variant("r7 no main vector arm when one person is named", no_main_vector_when_one_person()),
    Variant("r7 query less the person's direction, projected x0.5", less_person_direction(0.5)),
    Variant("r7 query less the person's direction x0.3", less_person_direction(0.3, False)),
    Variant(
        "r6 server embeds the question less 2+ people", asked="less the people, when two or more"
    ),
    Variant("r6 server embeds the question less its people", asked="less the people"),
    Variant(
        "r6 server embeds the question less people and dates", asked="less the people and dates"
    ),
    Variant(
        "r6 server embeds the question less capitalised words",
        asked="less every capitalised candidate",
    ),
]


@dataclass
class Built:
    """One conversation written once per mode, with each mode's question vectors."""

    conv: qs.Conversation
    tenants: dict[str, Tenant]
    questions: dict[str, np.ndarray]
    asked: dict[str, np.ndarray]  # server-embedded tenants' question vectors of other texts


def build(
    work: Path, convs: list[qs.Conversation], emb: qs.Embeddings, wanted: list[Variant]
) -> list[Built]:
    """Each conversation's two tenants: server-embedded (the chain) and client vectors."""
    out = []
    chosen = qs.PROCEDURES["chosen"]
    for conv in convs:
        own = emb.embed([t.text for t in conv.turns])
        server = qs.server_vectors(conv.turns, own, chosen.context)
        tenant = qs.build_tenant(work / f"server-{conv.index}", conv, server)
        asked = {}
        for name in dict.fromkeys(["the server's", *(v.asked for v in wanted)]):
            with tenant.log.reader() as r:
                texts = [QUESTION_TEXTS[name](r, q) for q in conv.questions]
            asked[name] = emb.embed(texts)
        tenants = {
            "server": tenant,
            "client": qs.build_tenant(work / f"client-{conv.index}", conv, conv.ref_turns),
        }
        for name in {v.turns for v in wanted} - {"as sent"}:  # other turn texts embedded
            texts = [qs.TURN_TEXTS[name](conv.turns, i) for i in range(len(conv.turns))]
            vectors = qs.server_vectors(conv.turns, emb.embed(texts), chosen.context)
            tenants[f"server:{name}"] = qs.build_tenant(
                work / f"server-{name}-{conv.index}", conv, vectors
            )
        out.append(
            Built(
                conv=conv,
                tenants=tenants,
                questions={"server": asked["the server's"], "client": conv.ref_questions},
                asked=asked,
            )
        )
    return out


def ask(tenant: Tenant, text: str, vector: np.ndarray) -> list[str]:
    """One recall as the engine runs it for a text and a vector: dia_ids ranked."""
    q = RecallQuery(text=text, embedding=vector.tolist(), kind="turn", k=qs.K)
    with tenant.log.reader() as r:
        validate(q, tenant.dim, r.meta_str("model"))
        result = recall(
            r, tenant.keyword, tenant.vectors, q, embeddings=False, feedback=qs.FEEDBACK
        )
    return [msgspec.json.decode(h.event.properties_raw or b"{}")["dia_id"] for h in result.hits]


def run(built: list[Built], mode: str, v: Variant) -> tuple[list[qs.Row], list[list[str]]]:
    """Every question of every conversation in one mode under one variant."""
    rows: list[qs.Row] = []
    ranked: list[list[str]] = []
    with v.patch():
        for b in built:
            tenant = b.tenants[
                mode if v.turns == "as sent" or mode != "server" else f"server:{v.turns}"
            ]
            _VEC[0] = tenant.vectors
            for i, question in enumerate(b.conv.questions):
                vectors = b.asked[v.asked] if mode == "server" else b.questions[mode]
                got = ask(tenant, question, vectors[i])
                ranked.append(got)
                rows.append((*qs.metrics(got, b.conv.evidence[i]), b.conv.categories[i]))
    return rows, ranked


def main(argv: list[str] | None = None) -> int:
    """Run the variants (all, or --only) in both modes and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="a variant's name prefix")
    parser.add_argument("--modes", default="server,client")
    parser.add_argument("--held-out", action="store_true", help="5-9, with --only: report only")
    parser.add_argument("--rankings", type=Path, default=None, help="write each question's list")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.held_out and not args.only:
        raise SystemExit("the held-out conversations run only named variants, to report")
    z = np.load(qs.NPZ)
    raw = json.loads(qs.JSON.read_text())
    convs = [qs.load(z, raw, c) for c in (qs.HELD_OUT if args.held_out else qs.DEV)]
    chosen = [v for v in VARIANTS if not args.only or any(v.name.startswith(o) for o in args.only)]
    work = scratch_dir("quality-variants")
    emb = qs.Embeddings()
    doc: dict[str, Any] = {"conversations": [c.index for c in convs], "variants": {}}
    rankings: dict[str, Any] = {}
    started = time.perf_counter()
    built = build(work, convs, emb, chosen)
    try:
        print(qs.HEADER)
        for v in chosen:
            for mode in args.modes.split(","):
                t0 = time.perf_counter()
                rows, ranked = run(built, mode, v)
                s = qs.summarise(rows)
                s["seconds"] = round(time.perf_counter() - t0, 1)
                doc["variants"].setdefault(v.name, {})[mode] = s
                rankings.setdefault(v.name, {})[mode] = ranked
                print(qs.line(f"{mode:6s} {v.name}", s), flush=True)
    finally:
        for b in built:
            for t in b.tenants.values():
                t.close()
        shutil.rmtree(work, ignore_errors=True)
    doc["seconds"] = round(time.perf_counter() - started, 1)
    if args.rankings is not None:
        args.rankings.write_text(json.dumps(rankings))
    name = "quality-variants-held-out" if args.held_out else "quality-variants"
    print(f"wrote {write_json(name, doc, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Recall: keyword and vector arms behind one admission chokepoint, RRF fusion, current-state
substitution and the bounded SOURCE_FROM walk."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

import msgspec
import numpy as np

from storage.errors import EmbeddingMismatch, InvalidRequest
from storage.index.flat import as_float32, top, unit
from storage.index.keyword import KeywordIndex
from storage.index.vectors import EXACT_BELOW, VectorIndex
from storage.log import layout
from storage.log.reader import LogReader
from storage.model import SOURCE_FROM, FilterValue, StoredEvent
from storage.read.current import EXPIRED, NOT_YET_VALID, SUPERSEDED, Moment
from storage.read.focus import Focus, understand
from storage.read.replies import reply_arm
from storage.read.times import says_time

RRF_K = 60
MAX_K = 100
MAX_HOPS = 3
# Each arm brings its top k to fusion. Deeper lists let RRF's sum rank events that both arms
# place middling above events one arm places first, which ranked worse on LoCoMo at every k
# tried (bench/RESULTS.md, "Retrieval quality on LoCoMo"). Arms go deeper only when
# substitution leaves fewer than k hits.
MAX_ARM_DEPTH = 1000
# The vector arm over-fetches up to this many times its depth before it filters inside the graph,
# and ranks exactly when a kind, filter or as_of admits at most FEW events.
OVERFETCH = 32
FEW = 256
# A kind held by at least this share of a tenant's documents is not a clause of the keyword
# search but checked by the chokepoint on each hit: as a Must clause it intersects the words'
# postings with most of the index and doubles the search, while the arm's over-fetch still
# brings its depth of that kind (bench/RESULTS.md, "Recall at 10,000 and 100,000 events").
# The order is the same: the clause adds one constant to every score.
COMMON_KIND = 0.6
# A focus arm's keyword search reads at most this many times its depth of hits to find its
# depth inside the focus (a narrow window of a large tenant would otherwise read the index).
FOCUS_FETCH = 16


class RecallQuery(msgspec.Struct, frozen=True, kw_only=True):
    """A validated recall request."""

    text: str | None = None
    embedding: list[float] | None = None
    embedding_model: str | None = None
    kind: str | None = None
    k: int = 10
    hops: int = 0
    filters: dict[str, FilterValue] = {}
    current: bool = True
    as_of: int | None = None
    explain: bool = False  # ranked hits carry the arm ranks their score was fused from


class Feedback(msgspec.Struct, frozen=True, kw_only=True):
    """Pseudo-relevance feedback for the vector arm: before the vector search, the query vector
    moves toward the stored vectors of the keyword arm's first `hits` events, added at `weight`
    (to the unit query) and renormalised. For queries whose vector the server made from the text
    (docs/recall.md, "Server-embedded recall"); a client's own vector is ranked as sent."""

    hits: int = 2
    weight: float = 0.5

    def __post_init__(self) -> None:
        if self.hits < 1 or not 0 < self.weight < float("inf"):
            raise ValueError("feedback needs hits >= 1 and a positive, finite weight")


class Hit(msgspec.Struct, kw_only=True):
    """One recalled event: ranked (score, maybe replaces, with explain its ranks) or walked (via, hop)."""

    event: StoredEvent
    score: float
    via: str | None = None
    hop: int | None = None
    replaces: list[str] = []
    ranks: tuple[int | None, int | None] | None = None  # (keyword, vector); None: not explained
    # With explain, the other arms that ranked it (focus, time, replies): arm name -> rank.
    arm_ranks: dict[str, int] | None = None


class Walk(msgspec.Struct, frozen=True, kw_only=True):
    """What the walk found within hops, and what the allowance left out."""

    reached: int
    returned: int
    omitted: list[str]


class Withheld(msgspec.Struct, frozen=True, kw_only=True):
    """Events current state kept out of the answer among those recall read to fill it, by reason."""

    superseded: int = 0
    expired: int = 0
    not_yet_valid: int = 0


class RecallResult(msgspec.Struct, kw_only=True):
    """Ranked hits followed by walked hits, the walk's account when hops > 0, and what current
    state withheld when it withheld anything."""

    hits: list[Hit]
    walk: Walk | None = None
    withheld: Withheld | None = None
    focus: Focus | None = None  # with explain: what the text was read to name


# Names of the arms beside the main keyword and vector arms (explain's `arm_ranks`).
Arms = list[tuple[str, list[StoredEvent]]]
KEYWORD, VECTOR, REPLIES = "keyword", "vector", "replies"


class Admission:
    """The one chokepoint: a candidate of either arm is live, of the kind, matches the filters,
    exists and (with current state) is inside its window.

    The arms read their rankings best first and take the window test last, in `_first`, so the
    events it turns away are the ones that would have ranked: `withheld` keeps them (and the
    superseded hits substitution passes over) with the reason, for the answer to report.
    """

    def __init__(
        self,
        r: LogReader,
        q: RecallQuery,
        moment: Moment,
        windows: list[tuple[int, int]] | None = None,
    ) -> None:
        self.r = r
        self.q = q
        self.moment = moment
        self.windows = windows  # a focus arm's: the event's ts lies in one of these [lo, hi)
        self.focused = False  # a focus arm's (narrowed)
        self.withheld: dict[str, str] = {}  # event id -> SUPERSEDED, EXPIRED or NOT_YET_VALID
        self._wanted = {name: layout.value_bytes(v) for name, v in q.filters.items()}
        self._by_label: dict[int, StoredEvent | None] = {}
        self._light: dict[int, StoredEvent | None] = {}

    def narrowed(
        self, filters: dict[str, FilterValue], windows: list[tuple[int, int]] | None
    ) -> Admission:
        """This chokepoint with more filters and (maybe) time windows, for a focus arm: it
        shares this one's reads and withheld notes."""
        q = msgspec.structs.replace(self.q, filters={**self.q.filters, **filters})
        sub = Admission(self.r, q, self.moment, windows)
        sub.focused = True
        sub.withheld = self.withheld
        sub._light = self._light
        return sub

    def admit(self, ev: StoredEvent | None, *, window: bool = True) -> bool:
        """Whether an event may rank (superseded ones may: recall substitutes their heads);
        with window=False, everything but the window test."""
        if ev is None or (self.q.kind is not None and ev.kind != self.q.kind):
            return False
        for name, want in self._wanted.items():
            if not layout.tag_matches(ev, name, want):
                return False
        if not self.moment.exists(ev):
            return False
        if self.windows is not None and not any(lo <= ev.ts < hi for lo, hi in self.windows):
            return False
        return not window or not self.moment.current or self.moment.in_window(ev)

    def in_window(self, ev: StoredEvent, *, note: bool = True) -> bool:
        """The window test of current state; an event it turns away is noted as withheld."""
        if not self.moment.current:
            return True
        reason = self.moment.window_reason(ev)
        if reason is None:
            return True
        if note:
            self.withheld.setdefault(ev.event_id, reason)
        return False

    def event_for_label(self, label: int) -> StoredEvent | None:
        """The event behind a vector label if it passes all but the window (read light)."""
        if label not in self._by_label:
            ev = self.light_for_label(label)
            self._by_label[label] = ev if self.admit(ev, window=False) else None
        return self._by_label[label]

    def light_for_label(self, label: int) -> StoredEvent | None:
        """The live event behind a label (an appending op's seq) in this snapshot, read light."""
        if label not in self._light:
            self._light[label] = self.r.light_at(label)  # records are keyed by seq: one lookup
        return self._light[label]

    def text_for_label(self, label: int) -> str | None:
        """The text of that event, None if the snapshot holds no live event there."""
        ev = self.light_for_label(label)
        return None if ev is None else ev.text

    def withheld_counts(self) -> Withheld | None:
        """The withheld events by reason, None if there are none."""
        if not self.withheld:
            return None
        reasons = list(self.withheld.values())
        return Withheld(
            superseded=reasons.count(SUPERSEDED),
            expired=reasons.count(EXPIRED),
            not_yet_valid=reasons.count(NOT_YET_VALID),
        )


def validate(q: RecallQuery, dim: int, model: str | None) -> None:
    """Refuse what recall cannot answer, with a sentence saying what to fix."""
    if not q.text and q.embedding is None:
        raise InvalidRequest("send text, an embedding, or both")
    if not 1 <= q.k <= MAX_K:
        raise InvalidRequest(f"k must be from 1 to {MAX_K}")
    if not 0 <= q.hops <= MAX_HOPS:
        raise InvalidRequest(f"hops must be from 0 to {MAX_HOPS}")
    if q.embedding is not None and len(q.embedding) != dim:
        raise EmbeddingMismatch(
            f"embedding has {len(q.embedding)} values; this tenant's vectors have {dim}"
        )
    if q.embedding_model is not None and model is not None and q.embedding_model != model:
        raise EmbeddingMismatch(
            f"this tenant's embeddings come from '{model}'; query with a vector from the same model"
        )


def keyword_arm(
    kw: KeywordIndex, adm: Admission, depth: int, most: int | None = None
) -> list[StoredEvent]:
    """BM25 ranking restricted inside the search by filters and an uncommon kind, then by the
    chokepoint; over-fetches until depth admitted events, the index runs out or (given) the
    search would pass `most` hits."""
    assert adm.q.text
    kind = adm.q.kind
    checked = kind is not None and kw.kind_share(kind) >= COMMON_KIND
    if checked:
        kind = None  # the chokepoint checks it on each hit
    # Hits come back in their exact order (ties by seq) whatever the limit, so a deeper search
    # only saves a second one when the chokepoint turns hits away: a kind checked here, or
    # as_of. Otherwise almost every hit is admitted, and a search for depth hits scores fewer
    # documents and reads fewer seqs (bench/RESULTS.md, "Recall at 10,000 and 100,000 events").
    limit = depth * 2 if checked or adm.q.as_of is not None else depth
    while True:
        found = kw.ranked(
            adm.q.text, limit=limit, kind=kind, filters=adm.q.filters, text_of=adm.text_for_label
        )
        # Hits reach their events by seq, as vector labels do: one read of an event both arms find.
        ranked = _first(adm, map(adm.event_for_label, found.seqs), depth)
        if len(ranked) >= depth or len(found) < limit or (most is not None and limit >= most):
            return ranked
        limit = 4 * limit if most is None else min(4 * limit, most)


def _first(adm: Admission, events: Iterable[StoredEvent | None], depth: int) -> list[StoredEvent]:
    """The first depth admitted events (None: not admitted but for the window, which is tested
    here), reading no further than needed."""
    out: list[StoredEvent] = []
    for ev in events:
        if ev is not None and adm.in_window(ev):
            out.append(ev)
            if len(out) == depth:
                break
    return out


def vector_arm(
    vec: VectorIndex, adm: Admission, depth: int, query: np.ndarray | None = None
) -> list[StoredEvent]:
    """Cosine ranking restricted by the chokepoint before the cut; by similarity to `query`
    when given (feedback's moved vector), else to the request's embedding.

    A restriction that admits few events is answered exactly from the log's own indexes. Else
    the graph is searched unfiltered for a few times depth and the chokepoint checks what comes
    back, best first: hnswlib's filter would call into Python, and LMDB, for every node it
    visits. Only when that leaves too few does the graph search take the filter."""
    assert adm.q.embedding is not None
    if query is None:
        query = as_float32(adm.q.embedding)  # once, however many searches follow
    if adm.focused and vec.count() <= EXACT_BELOW:
        return _small_focus_arm(vec, adm, depth, query)
    few = _few_candidates(adm)
    if few is not None:
        return _exact_arm(few, adm, depth, query)
    fetch = 2 * depth
    while fetch <= OVERFETCH * depth:
        found = vec.search(query, fetch)
        out = _first(adm, (adm.event_for_label(label) for label, _s in found), depth)
        if len(out) >= depth or len(found) < fetch:
            return out
        fetch *= 4

    def allowed(label: int) -> bool:  # asked by the graph search of every node it visits: no notes
        ev = adm.event_for_label(label)
        return ev is not None and adm.in_window(ev, note=False)

    found = vec.search(query, depth, allowed)
    return _first(adm, (adm.event_for_label(label) for label, _s in found), depth)


def _few_candidates(adm: Admission) -> list[str] | None:
    """Ids of the events a kind, filter or as_of allows, if one of them allows at most FEW."""
    r, q = adm.r, adm.q
    # Keys are counted before ids are listed: building an id string is most of a key's cost,
    # and a common kind would make FEW + 1 of them on every query for nothing
    # (bench/RESULTS.md, "Recall at 10,000 and 100,000 events").
    if q.kind is not None and not r.more_keys_than(FEW, "by_kind", layout.kind_prefix(q.kind)):
        return list(r.ids_by_kind(q.kind))
    for name, value in q.filters.items():
        if not r.more_keys_than(FEW, "by_prop", layout.property_prefix(name, value)):
            return list(r.ids_by_property(name, value))
    if adm.windows is not None:
        raw: dict[bytes, None] = {}
        for lo, hi in adm.windows:  # keys only, FEW + 1 at most
            raw.update(dict.fromkeys(islice(r.raw_ids_by_ts(lo, hi), FEW + 1 - len(raw))))
        if len(raw) <= FEW:
            return [layout.id_str(e) for e in raw]
    if q.as_of is not None:
        below = layout.ts_bytes(q.as_of + 1)
        if not r.more_keys_than(FEW, "by_ts", b"", below):
            return list(r.ids_by_ts(None, q.as_of + 1))
    return None


def _small_focus_arm(
    vec: VectorIndex, adm: Admission, depth: int, query: np.ndarray
) -> list[StoredEvent]:
    """A focus arm in a small vector index, which scans its rows exactly anyway: the chokepoint
    is asked of its labels best first, reading (light) only as far as the depth needs."""

    def allowed(label: int) -> bool:
        ev = adm.event_for_label(label)
        return ev is not None and adm.in_window(ev, note=False)

    found = vec.search(query, depth, allowed)
    return _first(adm, (adm.event_for_label(label) for label, _s in found), depth)


def _exact_arm(ids: list[str], adm: Admission, depth: int, query: np.ndarray) -> list[StoredEvent]:
    """Exact cosine ranking of these events' embeddings against query (ties by append order)."""
    events = [ev for ev in map(adm.r.get, ids) if ev is not None and ev.embedding is not None]
    events = [ev for ev in events if adm.admit(ev, window=False)]
    if not events:
        return []
    rows = unit(np.asarray([ev.embedding for ev in events], dtype=np.float32))
    sims = rows @ unit(query)
    seqs = np.asarray([ev.seq for ev in events], dtype=np.int64)
    by_seq = {ev.seq: ev for ev in events}
    # The window last and best first, as in _first: what it turns away would have ranked.
    ranked = top(seqs, sims, depth, lambda seq: adm.in_window(by_seq[seq]))
    return [by_seq[seq] for seq, _sim in ranked]


def fuse(rankings: list[list[StoredEvent]]) -> list[tuple[StoredEvent, float]]:
    """Reciprocal rank fusion: score = Σ 1/(60 + rank), ranks from 1; ties keep first-seen order."""
    scores: dict[str, float] = {}
    events: dict[str, StoredEvent] = {}
    for ranking in rankings:
        for rank, ev in enumerate(ranking, start=1):
            scores[ev.event_id] = scores.get(ev.event_id, 0.0) + 1.0 / (RRF_K + rank)
            events.setdefault(ev.event_id, ev)
    order = sorted(scores, key=lambda e: -scores[e])  # sorted() is stable
    return [(events[e], scores[e]) for e in order]


def substitute(fused: list[tuple[StoredEvent, float]], adm: Admission, k: int) -> list[Hit]:
    """Up to k ranked hits; a superseded hit gives way, once, to its current heads at its rank."""
    hits: dict[str, Hit] = {}
    for ev, score in fused:
        if len(hits) >= k and ev.event_id not in hits:
            break
        if not adm.moment.current or not adm.moment.is_superseded(ev):
            if ev.event_id not in hits:
                hits[ev.event_id] = Hit(event=ev, score=score)
            continue
        adm.withheld.setdefault(ev.event_id, SUPERSEDED)
        for head in adm.moment.heads(ev):
            if not adm.admit(head):
                continue
            hit = hits.get(head.event_id)
            if hit is None:
                if len(hits) >= k:
                    continue  # no room for this head, but a later one may already be a hit
                hits[head.event_id] = hit = Hit(event=head, score=score)
            if ev.event_id not in hit.replaces:
                hit.replaces.append(ev.event_id)
    return list(hits.values())[:k]


def walk(
    r: LogReader, hits: list[Hit], moment: Moment, hops: int, allowance: int
) -> tuple[list[Hit], Walk]:
    """Breadth-first over SOURCE_FROM both ways from the hits, in hit and link order, adding at most allowance events."""
    seen = {h.event.event_id for h in hits}
    frontier = [
        (h.event.event_id, h.event.event_id) for h in hits
    ]  # (node, ranked hit it came from)
    added: list[Hit] = []
    omitted: list[str] = []
    for hop in range(1, hops + 1):
        nxt: list[tuple[str, str]] = []
        for node, origin in frontier:
            for nid in r.links_out(node, SOURCE_FROM) + r.links_in(node, SOURCE_FROM):
                if nid in seen:
                    continue
                ev = r.get_light(nid)
                if ev is None or not moment.visible(ev):
                    continue
                seen.add(nid)
                nxt.append((nid, origin))
                if len(added) < allowance:
                    added.append(Hit(event=ev, score=0.0, via=origin, hop=hop))
                else:
                    omitted.append(nid)
        frontier = nxt
    return added, Walk(reached=len(added) + len(omitted), returned=len(added), omitted=omitted)


def rank(
    kw: KeywordIndex,
    vec: VectorIndex,
    adm: Admission,
    k: int,
    feedback: Feedback | None = None,
    focus: Focus | None = None,
) -> list[Hit]:
    """Fuse each arm's top k (the main arms, the focus and time arms, then the reply arm) and
    substitute heads; deeper while that leaves fewer than k hits."""
    depth = k
    while True:
        arms: Arms = []
        query = None
        if adm.q.text:
            arms.append((KEYWORD, keyword_arm(kw, _unfocused(adm, focus), depth)))
            if feedback is not None and adm.q.embedding is not None:
                query = moved_query(adm, arms[0][1], feedback)
        if adm.q.embedding is not None:
            arms.append((VECTOR, vector_arm(vec, adm, depth, query)))
        main = [ranking for _name, ranking in arms]
        if focus is not None:
            timed = time_arms(arms) if focus.when else []
            arms += focus_arms(kw, vec, adm, depth, query, focus) if focus else []
            arms += timed
        fused = fuse([ranking for _name, ranking in arms])
        if adm.q.text:
            replies = reply_arm(adm.r, [ev for ev, _s in fused], adm.admit)
            if replies:
                arms.append((REPLIES, replies))
                fused = fuse([ranking for _name, ranking in arms])
        hits = substitute(fused, adm, k)
        exhausted = all(len(ranking) < depth for ranking in main)
        if len(hits) >= k or exhausted or depth >= MAX_ARM_DEPTH:
            if adm.q.explain:
                explain(hits, fused, arms)
            return hits
        depth = min(4 * depth, MAX_ARM_DEPTH)


def _unfocused(adm: Admission, focus: Focus | None) -> Admission:
    """The chokepoint for the main keyword arm: its query without the names and dates that
    the focus arms stand for (they rank by them instead)."""
    if not focus or adm.q.text is None:
        return adm
    text = focus.without(adm.q.text, people=True, dates=True)
    if text == adm.q.text:
        return adm
    main = adm.narrowed({}, None)
    main.focused = False
    main.q = msgspec.structs.replace(main.q, text=text)
    return main


def focus_arms(
    kw: KeywordIndex,
    vec: VectorIndex,
    adm: Admission,
    depth: int,
    query: np.ndarray | None,
    focus: Focus,
) -> Arms:
    """Both arms again inside each focus the text names (docs/recall.md, "Query focus"): the
    events of the one person it names, those within the dates it names, and those of that
    person within those dates, each named by its restriction and arm ("person.keyword"). A
    focus arm's keyword query leaves out the name and the dates its restriction stands for."""
    person: dict[str, FilterValue] = dict(focus.people) if len(focus.people) == 1 else {}
    restrictions: list[tuple[str, dict[str, FilterValue], list[tuple[int, int]] | None]] = []
    if person:
        restrictions.append(("person", person, None))
    if focus.windows:
        restrictions.append(("dates", {}, focus.windows))
        if person:
            restrictions.append(("person_dates", person, focus.windows))
    out: Arms = []
    for name, filters, windows in restrictions:
        sub = adm.narrowed(filters, windows)
        if adm.q.text:
            text = focus.without(adm.q.text, people=bool(filters), dates=windows is not None)
            sub.q = msgspec.structs.replace(sub.q, text=text)
            out.append((f"{name}.{KEYWORD}", keyword_arm(kw, sub, depth, most=FOCUS_FETCH * depth)))
        if adm.q.embedding is not None:
            out.append((f"{name}.{VECTOR}", vector_arm(vec, sub, depth, query)))
    return out


def time_arms(main: Arms) -> Arms:
    """For a text that asks when (docs/recall.md, "Replies and times"): each main arm's own
    hits that say a time, in its order. No search of their own: searching five times deeper
    measured +0.004 recall@10 on LoCoMo (noise) for twice the CPU of such a recall."""
    return [(f"time.{name}", [ev for ev in ranking if says_time(ev)]) for name, ranking in main]


def moved_query(adm: Admission, keyword: list[StoredEvent], feedback: Feedback) -> np.ndarray:
    """The unit query plus weight times the mean of the keyword ranking's first hits' stored
    vectors (of those that have one; each at unit length), renormalised; the query alone when
    none has a vector.

    The keyword hits are admitted events, so feedback reads nothing the request could not see.
    Their records are read whole here (ranking reads records without their embeddings)."""
    assert adm.q.embedding is not None
    query = unit(as_float32(adm.q.embedding))
    total: np.ndarray | None = None
    n = 0
    for ev in keyword[: feedback.hits]:
        whole = adm.r.get(ev.event_id)
        if whole is not None and whole.embedding is not None and len(whole.embedding) == len(query):
            row = unit(as_float32(whole.embedding))
            total = row if total is None else total + row
            n += 1
    if total is None:
        return query
    return unit(query + np.float32(feedback.weight / n) * total)


def explain(hits: list[Hit], fused: list[tuple[StoredEvent, float]], arms: Arms) -> None:
    """Give each ranked hit the keyword and vector ranks (from 1, None where that arm did not
    return it or did not run) and the ranks of the other arms that returned it, all of the
    event whose fused score it carries."""
    places = {name: _places(ranking) for name, ranking in arms}
    keyword, vector = places.get(KEYWORD, {}), places.get(VECTOR, {})
    order = _places(ev for ev, _score in fused)
    for hit in hits:
        # A substituted head carries the score of the first event in fused order that made it a
        # hit (substitute): itself, or one of the superseded events it replaces.
        made = [e for e in (hit.event.event_id, *hit.replaces) if e in order]
        scored = min(made, key=order.__getitem__)
        hit.ranks = (keyword.get(scored), vector.get(scored))
        hit.arm_ranks = {
            name: at[scored]
            for name, at in places.items()
            if name not in (KEYWORD, VECTOR) and scored in at
        }


def _places(events: Iterable[StoredEvent]) -> dict[str, int]:
    """Event id -> its rank in a ranking, from 1."""
    return {ev.event_id: n for n, ev in enumerate(events, start=1)}


def recall(
    r: LogReader,
    kw: KeywordIndex,
    vec: VectorIndex,
    q: RecallQuery,
    *,
    embeddings: bool = True,
    feedback: Feedback | None = None,
) -> RecallResult:
    """Rank by keyword and vector, fuse, apply current state, then walk the links.

    Candidates are read without their embeddings; with embeddings=False the hits' events may
    lack theirs too (the HTTP answer never shows them), else each hit's event is read whole.
    With feedback and both text and an embedding, the vector arm searches with the query moved
    toward the keyword arm's first hits (Feedback); without, each arm ranks the request as sent."""
    moment = Moment(r, current=q.current, as_of=q.as_of)
    adm = Admission(r, q, moment)
    focus = understand(r, q.text, q.as_of) if q.text else None
    hits = rank(kw, vec, adm, q.k, feedback, focus)
    account = None
    if q.hops > 0:
        walked, account = walk(r, hits, moment, q.hops, q.k)
        hits = hits + walked
    if embeddings:
        for hit in hits:
            whole = r.get(hit.event.event_id)
            assert whole is not None  # read from this snapshot a moment ago
            hit.event = whole
    shown = focus if q.explain and focus is not None and (focus or focus.when) else None
    return RecallResult(hits=hits, walk=account, withheld=adm.withheld_counts(), focus=shown)

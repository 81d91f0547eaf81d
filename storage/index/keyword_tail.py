"""The keyword index's tail: documents acknowledged but not yet in a durable Tantivy commit, and
BM25 computed as Tantivy computes it, so the tail is searched exactly beside the committed index.

Tantivy's BM25 (its `query/bm25.rs`): for each query term, idf = ln(1 + (N - n + 0.5) / (n + 0.5))
times (k1 + 1) times tf / (tf + k1 (1 - b + b dl / avgdl)), summed over the terms a document
holds; N counts every document of every segment (deleted ones too, until a merge drops them), n
the documents holding the term (likewise), avgdl is the field's tokens over N, and dl is the
document's token count rounded down to one of 256 stored lengths (`FIELDNORMS`). A commit of the
tail adds its documents to N, n and the tokens: `Stats.plus` is that sum, and scoring the
committed hits and the tail with it ranks them as the committed index would rank them once the
tail were committed (`tests/storage/test_keyword_tail.py` holds this against Tantivy's own scores).
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_right
from collections import Counter
from typing import Any, cast

import msgspec
import tantivy

K1 = 1.2
B = 0.75
FIELD = "text"


def _fieldnorm_table() -> list[int]:
    """The lengths Tantivy stores a field's token count as: exact to 40, then eight steps of each
    width from 2, doubling (checked against Tantivy in tests/storage/test_keyword_tail.py)."""
    table = list(range(41))
    value, step = 40, 2
    while len(table) < 256:
        for _ in range(8):
            if len(table) == 256:
                break
            value += step
            table.append(value)
        step *= 2
    return table


FIELDNORMS = _fieldnorm_table()

# The keyword index's `en_stem` analyzer, rebuilt from the same parts in the same order (words of
# letters and digits, tokens over 40 bytes dropped, lowercased, English Snowball stems).
ANALYZER = (
    tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
    .filter(tantivy.Filter.remove_long(40))
    .filter(tantivy.Filter.lowercase())
    .filter(tantivy.Filter.stemmer("english"))
    .build()
)


def fieldnorm(length: int) -> int:
    """The length Tantivy scores a field of this many tokens with."""
    return FIELDNORMS[bisect_right(FIELDNORMS, length) - 1]


# An ASCII text is split here, word by word, and each word's term (or "" if the analyzer drops
# it) is looked up in _TERMS: one analyzer call per text cost most of a batch's publish, and a
# conversation reuses few words (bench/RESULTS.md, "Batch append"). In ASCII, Tantivy's simple
# tokenizer (it splits at every char that is not alphanumeric) keeps exactly these runs; its
# filters see one token at a time, so a word alone gets the term it gets in its text.
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+")
_TERMS: dict[str, str] = {}
MAX_TERMS = 65536  # bounded (a few MB at most): words are client data
_CACHED_WORD = 40  # longer words are dropped by the analyzer's remove_long(40): never cached


def analyze(text: str) -> tuple[dict[str, int], int]:
    """A text's term frequencies and its token count, as the index sees them."""
    if not text.isascii():
        tokens = ANALYZER.analyze(text)
        return Counter(tokens), len(tokens)
    words = _ASCII_WORD.findall(text)
    cached: Counter[str | None] = Counter(map(_TERMS.get, words))
    tf = Counter(map(_term, words)) if None in cached else cast("Counter[str]", cached)
    dropped = tf.pop("", 0)
    return tf, len(words) - dropped


def _term(word: str) -> str:
    """The term the analyzer makes of one ASCII word, "" if it drops it."""
    term = _TERMS.get(word)
    if term is None:
        tokens = ANALYZER.analyze(word)
        term = tokens[0] if tokens else ""
        if len(word) < _CACHED_WORD:
            if len(_TERMS) >= MAX_TERMS:
                _TERMS.clear()
            _TERMS[word] = term
    return term


def query_tokens(words: list[str]) -> list[str] | None:
    """The terms Tantivy's query parser makes of these words: one clause per distinct word (it
    drops a repeated word, not a repeated term: "parcels parcel" is two clauses of "parcel",
    which score it twice); None if a word becomes more than one token, a phrase this module
    does not score."""
    out: list[str] = []
    for word in dict.fromkeys(words):
        tokens = ANALYZER.analyze(word)
        if len(tokens) > 1:
            return None
        if tokens:
            out.append(tokens[0])
    return out


class Stats(msgspec.Struct, frozen=True):
    """What BM25 counts of the text field: documents (N) and their tokens."""

    docs: int
    tokens: int

    def plus(self, docs: int, tokens: int) -> Stats:
        """These statistics once more documents are committed."""
        return Stats(self.docs + docs, self.tokens + tokens)

    def avgdl(self) -> float:
        """The average field length, as Tantivy divides it."""
        return self.tokens / self.docs if self.docs else 0.0


EMPTY = Stats(0, 0)


def idf(df: int, docs: int) -> float:
    """Tantivy's idf of a term held by df of docs documents."""
    return math.log(1.0 + (docs - df + 0.5) / (df + 0.5))


class Scorer:
    """BM25 of the text field under one set of statistics and one query's document frequencies."""

    def __init__(self, terms: list[str], df: dict[str, int], stats: Stats) -> None:
        self.terms = terms
        self.weights = {t: idf(df[t], stats.docs) * (1.0 + K1) for t in set(terms) if df[t]}
        self.avgdl = stats.avgdl()
        self._norms: dict[int, float] = {}  # length -> its penalty: documents share few lengths

    def norm(self, length: int) -> float:
        """The length penalty of a document of this many tokens."""
        norm = self._norms.get(length)
        if norm is None:
            norm = K1 * (1.0 - B + B * fieldnorm(length) / self.avgdl) if self.avgdl else K1
            self._norms[length] = norm
        return norm

    def score(self, tf: dict[str, int], length: int) -> float:
        """A document's score: each query term it holds adds its share."""
        total = 0.0
        norm = self.norm(length)
        for term in self.terms:
            freq = tf.get(term)
            if freq:
                total += self.weights[term] * freq / (freq + norm)
        return total

    def score_postings(self, postings: dict[str, list[TailDoc]]) -> list[tuple[float, TailDoc]]:
        """Each document of these postings (a term's holders) with its score.

        The shares are added term by term in the query's order, as `score` adds them, so a
        document scores the same to the bit (equal texts tie, committed or queued); but only
        the postings are visited, not every query term of every document that holds one.
        """
        totals: dict[int, float] = {}
        docs: dict[int, TailDoc] = {}
        norms = self._norms
        for term in self.terms:
            holders = postings.get(term)
            weight = self.weights.get(term)
            if not holders or weight is None:
                continue
            for d in holders:
                key = id(d)
                freq = d.tf[term]
                norm = norms.get(d.length)
                if norm is None:
                    norm = self.norm(d.length)
                share = weight * freq / (freq + norm)
                total = totals.get(key)
                if total is None:
                    totals[key] = 0.0 + share
                    docs[key] = d
                else:
                    totals[key] = total + share
        return [(total, docs[key]) for key, total in totals.items()]


def bounds(
    terms: list[str], df_committed: dict[str, int], df_tail: dict[str, int], old: Stats, new: Stats
) -> tuple[float, float]:
    """How far a committed document's score can move, as a ratio, from old statistics to new.

    A document's score is a sum of its terms' shares; each share moves by its term's idf ratio
    (the tail adds docs to N and df_tail to n) times the move of its length penalty, which lies
    between 1 and the ratio of the average field lengths. So the whole score moves by a ratio
    between the smallest and the largest of those, over the terms committed documents hold."""
    ratios = [
        idf(df + df_tail.get(term, 0), new.docs) / idf(df, old.docs)  # old.docs >= df > 0
        for term in set(terms)
        if (df := df_committed[term])
    ]
    if not ratios:
        return 1.0, 1.0
    avgdl = new.avgdl() / old.avgdl() if old.tokens and new.tokens else 1.0
    return min(ratios) * min(1.0, avgdl), max(ratios) * max(1.0, avgdl)


def explained_stats(explanation: str) -> Stats | None:
    """N and avgdl as a Tantivy explanation of a term's BM25 states them (the one place Tantivy
    tells N with deleted documents counted and the field's total tokens)."""
    docs: float | None = None
    avgdl: float | None = None

    def walk(node: dict[str, Any]) -> None:
        nonlocal docs, avgdl
        desc = str(node.get("description", ""))
        if desc.startswith("N,"):
            docs = float(node["value"])
        elif desc.startswith("avgdl"):
            avgdl = float(node["value"])
        for child in node.get("details", []):
            walk(child)

    walk(json.loads(explanation))
    if docs is None or avgdl is None:
        return None
    return Stats(int(docs), round(avgdl * docs))


def committed_stats(
    index: tantivy.Index, searcher: tantivy.Searcher, term: str | None
) -> Stats | None:
    """The committed index's statistics, read from the explanation of one hit of a term it holds
    (the most frequent term when none is given); None if no live document holds one."""
    if searcher.num_segments == 0:
        return EMPTY
    if term is None:
        found = searcher.terms_with_prefix(FIELD, "", limit=1)
        if not found:
            return EMPTY if searcher.num_docs == 0 else None
        term = str(found[0][0])
    query = tantivy.Query.term_query(index.schema, FIELD, term)
    hits = searcher.search(query, 1).hits
    if not hits:
        return None
    return explained_stats(query.explain(searcher, hits[0][1]).to_json())


class TailDoc:
    """A queued document as the tail searches it: seq, id, kind, tags, terms and length."""

    __slots__ = ("event_id", "kind", "length", "seq", "tags", "tf")

    def __init__(self, seq: int, event_id: str, kind: str, tags: frozenset[str], text: str) -> None:
        self.seq = seq
        self.event_id = event_id
        self.kind = kind
        self.tags = tags
        self.tf, self.length = analyze(text)


class Tail:
    """The queued additions of the keyword index with their postings; the index's lock guards it."""

    def __init__(self) -> None:
        self.docs: list[TailDoc] = []
        self.tokens = 0
        self.kinds: Counter[str] = Counter()
        self.postings: dict[str, list[TailDoc]] = {}

    def add_all(self, docs: list[TailDoc]) -> None:
        """More queued additions, in order."""
        postings = self.postings
        for doc in docs:
            for term in doc.tf:
                found = postings.get(term)
                if found is None:
                    postings[term] = [doc]
                else:
                    found.append(doc)
        self.docs += docs
        self.tokens += sum(d.length for d in docs)
        self.kinds.update(d.kind for d in docs)

    def drop(self, count: int) -> None:
        """The first count additions are in a durable commit now: no longer the tail's."""
        if not count:
            return
        gone = self.docs[:count]
        del self.docs[:count]
        self.tokens -= sum(d.length for d in gone)
        self.kinds.subtract(d.kind for d in gone)
        dropped = {id(d) for d in gone}
        for term in {t for d in gone for t in d.tf}:
            kept = [d for d in self.postings[term] if id(d) not in dropped]
            if kept:
                self.postings[term] = kept
            else:
                del self.postings[term]

    def clear(self) -> None:
        """Nothing queued."""
        self.docs.clear()
        self.postings.clear()
        self.kinds.clear()
        self.tokens = 0

    def matching(self, terms: list[str]) -> tuple[dict[str, list[TailDoc]], dict[str, int]]:
        """The terms' postings here (copies: publish appends to them), and each term's
        document count here."""
        postings = {t: list(self.postings.get(t, ())) for t in terms}
        return postings, {t: len(docs) for t, docs in postings.items()}

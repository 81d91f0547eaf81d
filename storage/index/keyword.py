"""The keyword index: a Tantivy projection of the log holding ids and indexed (never stored) text."""

from __future__ import annotations

import functools
import logging
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import msgspec
import tantivy

from storage import failpoints
from storage.errors import DiskFull
from storage.index.background import Task, shared_pool
from storage.index.held import held
from storage.index.keyword_tail import (
    FIELD,
    Scorer,
    Stats,
    Tail,
    TailDoc,
    analyze,
    bounds,
    committed_stats,
    query_tokens,
)
from storage.log import layout
from storage.model import FilterValue, StoredEvent
from storage.space import disk_full

log = logging.getLogger("memspine.keyword")

# Words are runs of letters and digits; everything else separates them, so no query syntax
# can reach Tantivy's parser (lowercasing also disarms its AND/OR/NOT operators).
_WORD = re.compile(r"[^\W_]+")
MAX_QUERY_WORDS = 64
TIE_HITS = 1024  # hits a search takes past its limit to order equal scores by append order
# A search fetches this many times its limit at once: the hits past the cut say whether equal
# scores run across it, and a second search to find out costs a whole search where a deeper
# first one costs little (bench/RESULTS.md, "Recall at 10,000 and 100,000 events").
TIE_FETCH = 2
# When equal scores run past that, the search is repeated twice as deep, up to TIE_HITS. Where
# most cuts fall among equal scores (a tenant of many equal texts: at a million events every
# query of bench/recall.py, each chain four searches deep), the first search takes this many
# past the limit at once: a top 266 costs Tantivy a little more than a top 21, each search of a
# chain a whole one (bench/RESULTS.md, "The keyword arm at a million events"). The answer is the
# same either way.
TIE_FIRST = 256
# Ties: a tied cut counts up 3, another down 2, so the first search goes deep while more than
# two cuts in five are tied: below that the chains cost less than deep first searches (at
# 100,000 events, where a quarter of the cuts tie in short runs, deep first searches were slower).
TIE_UP, TIE_DOWN, TIE_MAX, TIE_COMMON = 3, 2, 64, 32
# Tantivy's floor for one indexing thread (15 MB in tantivy 0.22+); the arena is allocated as
# documents fill it, so a tenant that folds a few documents a round touches little of it.
WRITER_HEAP_BYTES = 16_000_000
# The fold commits at most this often: every commit is a new segment (fsyncs now, merge CPU
# later), and at hundreds of appends a second one commit per group commit spent a large share of
# a core merging tiny segments (bench/RESULTS.md, "Appends"). Searches do not wait for it: they
# read what is queued from the tail.
FOLD_INTERVAL_SECS = 0.25
# Past this many queued documents a search waits for the fold rather than score the tail in
# Python: the fold is that far behind only when it cannot keep up (or cannot commit).
TAIL_MAX_DOCS = 20_000
# Resident memory, for memory_bytes: the searcher's own state is small (segments are
# memory-mapped files, so page cache); a writer, while a fold has work, keeps its indexing arena
# (measured after a commit, bench/RESULTS.md); a queued document holds its text, and the tail
# its terms, until the fold.
READER_BYTES = 32_000
WRITER_BYTES = 3_000_000
QUEUED_DOC_BYTES = 2_000
# After a failed commit (a full disk) the fold tries again after this long, doubling up to the
# cap: recovery within seconds of space coming back, without a commit attempt per search.
RETRY_FIRST_SECS = 0.25
RETRY_MAX_SECS = 2.0
LOG_EVERY = 30  # failed commits in a row between two log lines
FULL = (
    "the server's disk is full: recall cannot include the newest events until space is freed; "
    "nothing is lost, retry later"
)


class KeywordDoc(msgspec.Struct, frozen=True):
    """What the keyword index needs of one event (seq: the log op that appended it); text ""
    for an event without text, indexed for its properties' words only (WORDS)."""

    event_id: str
    kind: str
    text: str
    filterable: dict[str, FilterValue]
    seq: int
    subjects: tuple[str, ...] | list[str] = ()  # each tagged as layout.SUBJECT's value
    properties: bytes | None = None  # the properties JSON as stored, for WORDS


def keyword_doc(ev: StoredEvent) -> KeywordDoc:
    """The document of a stored event (one that is `indexed`)."""
    return KeywordDoc(
        ev.event_id, ev.kind, ev.text or "", ev.filterable, ev.seq, ev.subjects, ev.properties_raw
    )


def indexed(text: str | None, properties: bytes | None) -> bool:
    """Whether an event has a document in the keyword index: it has text or properties."""
    return bool(text) or bool(properties)


# The field an erasure's identifier search reads (storage/read/subjects.py): every word of the
# text and of the properties (keys and values), lowercased and folded to ASCII, neither stemmed
# nor scored (no frequencies), so an identifier's words are found as they were written.
WORDS = "words"
WORDS_TOKENIZER = "memspine_words"


def _words_analyzer() -> tantivy.TextAnalyzer:
    """Runs of letters and digits, lowercased and folded to ASCII ("Zoë" -> "zoe")."""
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.ascii_fold())
        .build()
    )


_WORDS_ANALYZER = _words_analyzer()


def words(text: str) -> list[str]:
    """The words WORDS indexes of a text, as the index makes them (Tantivy's own analyzer)."""
    return _WORDS_ANALYZER.analyze(text)


def searched_text(text: str | None, properties: bytes | None) -> str:
    """An event's text and its properties' strings (keys and values), as one string."""
    if not properties:
        return text or ""
    if b"\\" in properties:  # an escape in the JSON: its strings as they read
        texts = [text] if text else []
        value = msgspec.json.decode(properties)
        _strings(value if isinstance(value, dict) else {}, texts)
        return " ".join(texts)
    # the JSON text itself holds every key and value as written
    props = properties.decode(errors="replace")
    return f"{text} {props}" if text else props


def _strings(value: object, into: list[str]) -> None:
    """Every string and number in a decoded JSON value (keys included), as text."""
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            into.append(key)
            _strings(item, into)
    elif isinstance(value, list):
        for item in value:
            _strings(item, into)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        into.append(str(value))


def open_tantivy(path: Path | None) -> tantivy.Index:
    """The Tantivy index at path (None: in memory) with the keyword schema (made if there is
    none) and WORDS' analyzer registered, which its writers need (without it a writer dies at
    its first document); ValueError for an index of another schema."""
    index = tantivy.Index(_schema(), path=None if path is None else str(path), reuse=True)
    index.register_tokenizer(WORDS_TOKENIZER, _words_analyzer())
    return index


# A queued change: (the document to add, or None to delete, its id, whether an add first
# deletes any document of that id).
Op = tuple[KeywordDoc | None, str, bool]


def _schema() -> tantivy.Schema:
    """Id (stored, exact), text (indexed with stemming, not stored), kind and property tags
    (exact), and the appending op's seq as a fast field.

    A search's hits come back as document addresses. Reading each hit's id from the document
    store decompresses a block of it per hit (and pushes the vector graph out of the CPU's
    caches); the seq is read from a column instead, and recall reaches the event from the seq
    the way it does from a vector label.
    """
    b = tantivy.SchemaBuilder()
    b.add_text_field("id", stored=True, tokenizer_name="raw")
    b.add_text_field("text", stored=False, tokenizer_name="en_stem", index_option="freq")
    b.add_text_field("kind", stored=False, tokenizer_name="raw")
    b.add_text_field("tag", stored=False, tokenizer_name="raw")
    b.add_text_field(WORDS, stored=False, tokenizer_name=WORDS_TOKENIZER, index_option="basic")
    b.add_unsigned_field("seq", stored=False, indexed=False, fast=True)
    return b.build()


@functools.lru_cache(maxsize=layout.PREFIX_CACHE, typed=True)  # as layout.property_prefix
def property_tag(name: str, value: FilterValue) -> str:
    """One exact-match token per filterable property: the same typed encoding as the log's index."""
    return layout.property_prefix(name, value).hex()


# The Snowball project's English stop words (apostrophe forms left out: they never survive _WORD).
# Dropped from queries only, never from the index: question words and pronouns ("when did she")
# match most of a conversation and outvote the words that carry the question (bench/RESULTS.md,
# "Retrieval quality on LoCoMo").
_STOP_WORDS = """
    a about above after again against all am an and any are as at be because been before being
    below between both but by cannot could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its itself
    me more most my myself no nor not of off on once only or other ought our ours ourselves out
    over own same she should so some such than that the their theirs them themselves then there
    these they this those through to too under until up very was we were what when where which
    while who whom why with would you your yours yourself yourselves
"""
STOP_WORDS = frozenset(_STOP_WORDS.split())
# Words that frame a question rather than carry it ("what kind of…", "did she mention…",
# "how long…"): dropped from queries beside the stop words, never from the index, nor from
# what counts as a name (storage/read/speakers.py takes STOP_WORDS alone).
# On LoCoMo's development conversations +0.003 recall@10 (bench/RESULTS.md).
_SCAFFOLD = """
    kind type sort thing things something mention mentioned say said tell told talk talked
    describe name list many much long often recently recent likely might may will can get got
"""
QUERY_STOP_WORDS = STOP_WORDS | frozenset(_SCAFFOLD.split())


def query_words(text: str) -> list[str]:
    """The lowercase words of a user's text, at most MAX_QUERY_WORDS of them."""
    return [w.lower() for w in _WORD.findall(text)][:MAX_QUERY_WORDS]


def query_terms(text: str) -> list[str]:
    """The words a query searches for: its words less stop words and question scaffolding, or
    all of them if only those."""
    words = query_words(text)
    return [w for w in words if w not in QUERY_STOP_WORDS] or words


class KeywordIndex:
    """BM25 search over one tenant's event text, restricted by kind and property tags.

    A durable Tantivy commit costs several fsyncs, too slow to sit in every group commit or in
    every search (bench/RESULTS.md, "Appends" and "Recall while appending"). So the writer only
    `publish`es documents, the shared background pool (storage/index/background.py) folds them
    into the index with one durable commit per round, and a search reads the committed index
    and the queued tail side by side (the tail: `keyword_tail.py`), scoring both with the statistics the index would have once the tail
    were committed: appends never wait for Tantivy, a recall never waits for a commit, and it sees
    every acknowledged event ranked as if it had been committed with its append.

    A published document leaves the queue only once a commit holding it is durable and the
    searcher that sees it is in place, and committed_seq (which the tenant records as its
    keyword watermark) moves only then: a crash loses only what the log replays on open. A
    commit that fails (a full disk) is rolled back and retried with everything still queued,
    and searches meanwhile answer 503 rather than answer while the index cannot keep up.

    The Tantivy writer (its arena and its threads) exists only while there is something to
    fold: made by the first fold after a write, closed by the fold that finds nothing more. The
    Tantivy index itself (its reader, its file-watching thread, its mapped segments) is let go
    once unused for a while, and opened again by the next search (storage/index/held.py).
    """

    def __init__(self, path: Path, index: tantivy.Index, committed_seq: int = 0) -> None:
        self.path = path
        self._index: tantivy.Index | None = index  # None while let go (held.py)
        self.schema = index.schema
        self._writer: tantivy.IndexWriter | None = None  # made on first write: reopens stay light
        self.writer_lock = threading.Lock()  # Tantivy writers refuse concurrent use
        self.committed_seq = committed_seq  # the log op the committed index covers
        self._published_seq = committed_seq
        # Published and not yet durably committed, in order (Op).
        self._queue: list[Op] = []
        self._tail = Tail()  # the queue's additions, searchable (guarded by _cond, as the queue)
        # The committed searcher (replaced with the queue's prefix); None while let go.
        self._current: View | None = View(index)
        self._ties = Ties()  # how deep a search goes first (a hint)
        self._cond = threading.Condition()
        self._stopping = False
        self._waiting = 0  # searches waiting for the fold: it commits at once for them
        self._last_fold = 0.0
        self._error: Exception | None = None  # why the last commit failed; None once one succeeds
        self._full = False  # that failure was a full disk
        self._failures = 0  # commits failed in a row (the retry backs off)
        self._retry_at = 0.0
        self._attempts = 0  # commits tried, failed or not (a waiter sees one end)
        self._task: Task | None = None  # the fold's slot in the pool, from the first publish
        self._closed = False
        self._staged = False  # the direct path staged changes its commit has not made durable
        held().touch(self)

    @classmethod
    def open(cls, path: Path, committed_seq: int = 0) -> KeywordIndex:
        """Open the index at path, creating an empty one if there is none; raises ValueError
        for an index of any other schema (the tenant then rebuilds it from the log)."""
        path.mkdir(parents=True, exist_ok=True)
        return cls(path, open_tantivy(path), committed_seq)

    @property
    def index(self) -> tantivy.Index:
        """The Tantivy index, opened again if it was let go."""
        index = self._index
        if index is None:
            with self._cond:
                index = self._hold()
        else:
            held().touch(self)
        return index

    @property
    def _view(self) -> View:
        """The committed searcher, the index opened again if it was let go."""
        with self._cond:
            return self._view_now()

    def _view_now(self) -> View:
        """The committed searcher (the caller holds _cond)."""
        view = self._current
        if view is None:
            self._hold()
            view = self._current
            assert view is not None
        else:
            held().touch(self)
        return view

    def _hold(self) -> tantivy.Index:
        """Open the Tantivy index again after it was let go, with a searcher of its last
        commit (the caller holds _cond; a release takes it too)."""
        index = self._index
        if index is None:
            if self._closed:
                raise RuntimeError("the keyword index is closed")
            index = open_tantivy(self.path)
            self._index, self._current = index, View(index)
        held().touch(self)
        return index

    def release(self) -> bool:
        """Let the Tantivy index go unless a writer, a fold or staged changes need it (its
        thread ends at its next poll once in-flight searches drop their searchers); True if
        it is not held now."""
        if not self.writer_lock.acquire(blocking=False):
            return False  # a fold or a direct write is under way: asked again later
        try:
            with self._cond:
                busy = self._writer is not None or self._staged or self._waiting
                if busy or self._published_seq != self.committed_seq:
                    return False  # the fold would open it again at once
                self._index, self._current = None, None
                return True
        finally:
            self.writer_lock.release()

    @classmethod
    def create_empty(cls, path: Path) -> KeywordIndex:
        """Replace whatever is at path with an empty index (used to rebuild a damaged one)."""
        shutil.rmtree(path, ignore_errors=True)
        return cls.open(path)

    @property
    def writer(self) -> tantivy.IndexWriter:
        """The index's writer, created on first use (callers hold writer_lock)."""
        if self._writer is None:
            self._writer = self.index.writer(heap_size=WRITER_HEAP_BYTES, num_threads=1)
        return self._writer

    # -- direct path (replays into a fresh index, rebuilds) ---------------------

    def add(self, docs: Iterable[KeywordDoc]) -> None:
        """Stage documents; replaces any earlier one with the same id (replays are idempotent)."""
        with self.writer_lock:
            self._staged = True
            for d in docs:
                self.writer.delete_documents_by_term("id", d.event_id)
                self.writer.add_document(document(d))

    def delete(self, event_ids: Iterable[str]) -> None:
        """Stage deletions by id."""
        with self.writer_lock:
            self._staged = True
            for e in event_ids:
                self.writer.delete_documents_by_term("id", e)

    def commit(self) -> None:
        """Fold anything published, then make staged changes durable and visible."""
        self.flush()
        with self.writer_lock:
            self.writer.commit()
            self._staged = False
        index = self.index
        index.reload()
        with self._cond:
            self._current = View(index)
        if self.settled():
            self._close_writer()

    # -- the writer's path ----------------------------------------------------

    def publish(
        self, docs: list[KeywordDoc], deletes: list[str], seq: int, *, new: bool = False
    ) -> None:
        """Hand the changes of log ops up to seq to the background fold; searchable at once.

        new: the documents are events just appended, whose ids no document of the index or of
        the queue has, so the fold adds them without first deleting by id (a replay after a
        crash may find its documents committed already, and must)."""
        tail = [_tail_doc(d) for d in docs]  # tokenized before the lock: searches go on meanwhile
        with self._cond:
            self._queue.extend((d, d.event_id, not new) for d in docs)
            self._queue.extend((None, e, True) for e in deletes)
            self._tail.add_all(tail)
            self._published_seq = seq
            if self._task is None:
                self._task = shared_pool().task(self._fold, f"keyword {self.path.parent.name}")
            task = self._task
            self._cond.notify_all()
        task.wake()

    def _fold(self) -> float | None:
        """A pool step: commit what was published in one durable commit, once FOLD_INTERVAL_SECS
        have passed since the last (or a retry is due); returns when to come back (None: once
        woken), and closes the writer when nothing is left to fold."""
        with self._cond:
            if self._stopping:
                return None
            if self._published_seq != self.committed_seq:
                left = self._gather()
                if left > 0:
                    return left
        if self._published_seq != self.committed_seq:
            self._fold_once()
        with self._cond:
            if self._published_seq != self.committed_seq:
                if self._error is not None:
                    return max(0.0, self._retry_at - time.monotonic())
                return 0.0  # the next step waits out the interval
        self._close_writer()  # nothing more to fold: the writer's arena and threads go
        return None

    def _fold_once(self) -> bool:
        """Commit everything queued in one durable commit; False if it failed (then retried)."""
        with self._cond:
            ops = list(self._queue)  # publish appends meanwhile; these leave only once durable
            seq = self._published_seq
            # After a failure, every add deletes by id first: a commit that failed once it
            # was durable (its reload, its statistics) must not leave a document twice.
            retry = self._failures > 0
        try:
            view = self._commit_ops(ops, replace_all=retry) if ops else None
        except Exception as exc:
            self._failed_commit(exc)
            return False
        with self._cond:
            if self._failures:
                log.warning("keyword commits resumed after %d failed", self._failures)
            # The committed searcher and the shorter queue change together: a search sees
            # each queued document in one of the two.
            if view is not None:
                self._current = view
            self._tail.drop(sum(1 for doc, _id, _replace in ops if doc is not None))
            del self._queue[: len(ops)]
            self.committed_seq = seq
            self._error, self._full, self._failures = None, False, 0
            self._attempts += 1
            self._last_fold = time.monotonic()
            self._cond.notify_all()
        return True

    def _close_writer(self) -> None:
        """Close an idle writer, letting its merges finish (its threads and arena go with it)."""
        with self.writer_lock:
            if self._staged:  # closing would drop what the direct path's commit is yet to make
                return
            writer, self._writer = self._writer, None
            if writer is None:
                return
            try:
                writer.wait_merging_threads()
            except Exception:  # a merge that failed leaves its segments as they were
                log.warning("keyword writer did not close cleanly", exc_info=True)

    def _failed_commit(self, exc: Exception) -> None:
        """Roll the writer back to the last commit and schedule a retry of everything queued."""
        self._roll_back()
        # A streak that began on a full disk stays one until a commit succeeds: a retry that
        # fails as space comes back (a writer killed by the earlier error) is the same outage.
        full = self._full or disk_full(exc, self.path)
        with self._cond:
            self._failures += 1
            failures = self._failures
            delay = min(RETRY_MAX_SECS, RETRY_FIRST_SECS * 2 ** (failures - 1))
            self._retry_at = time.monotonic() + delay
            self._error, self._full = exc, full
            self._attempts += 1
            self._cond.notify_all()
        if failures == 1 or failures % LOG_EVERY == 0:  # one line per minute of an outage
            if full:
                log.error("keyword commit failed %d times: the disk is full; retrying", failures)
            else:
                log.error("keyword commit failed %d times; retrying", failures, exc_info=exc)

    def _roll_back(self) -> None:
        """Drop the writer and what the failed commit staged (all of it is still queued): an
        I/O error in one of its threads kills a Tantivy writer for good, and the retry makes a
        new one (dropping the old releases its lock)."""
        with self.writer_lock:
            self._writer = None

    def _gather(self) -> float:
        """How long more work may pile up: until FOLD_INTERVAL_SECS after the last commit, or
        until the retry is due after a failure; 0 for a waiting search (caller holds _cond)."""
        if self._error is not None:
            return self._retry_at - time.monotonic()  # a waiting search does not hurry it
        if self._waiting:
            return 0.0
        return self._last_fold + FOLD_INTERVAL_SECS - time.monotonic()

    def _commit_ops(self, ops: list[Op], *, replace_all: bool = False) -> View:
        """Apply queued adds and deletes in order, commit durably, reload the searcher; the new
        view, its statistics read here, off the searches' path (replace_all: every add deletes
        by id first, whatever its op says)."""
        with self.writer_lock:
            for doc, event_id, replace in ops:
                if replace or replace_all:
                    self.writer.delete_documents_by_term("id", event_id)
                if doc is not None:
                    self.writer.add_document(document(doc))
            failpoints.hit("keyword.commit")
            self.writer.commit()
        failpoints.hit("keyword.reload")
        index = self.index
        index.reload()
        view = View(index, _a_term(ops))
        view.stats()
        return view

    def flush(self, upto: int | None = None) -> None:
        """Wait until the committed index covers op upto (default: everything published); while
        commits fail, raise DiskFull (or the failure) at once instead of waiting."""
        with self._cond:
            target = self._published_seq if upto is None else upto
            if self.committed_seq >= target:
                return  # nothing to wait for: do not cut the fold's gathering short
            if self._error is not None:
                raise self._refusal()
            self._waiting += 1
            attempts = self._attempts
            task = self._task
        try:
            if task is not None:
                task.wake()  # the fold stops gathering and commits for us
            with self._cond:
                while self.committed_seq < target:
                    if self._error is not None and self._attempts != attempts:
                        raise self._refusal()  # the commit this search waited for failed
                    if self._closed or task is None:
                        raise RuntimeError("the keyword index is closed")
                    self._cond.wait(timeout=1.0)
        finally:
            with self._cond:
                self._waiting -= 1

    def _refusal(self) -> Exception:
        """What a search is told while commits fail (caller holds _cond)."""
        if self._full:
            return DiskFull(FULL)
        return RuntimeError("the keyword index cannot be committed")

    # -- reads ------------------------------------------------------------------

    def memory_bytes(self) -> int:
        """Estimated resident bytes: the searcher, the writer once made, documents not yet folded."""
        writer = WRITER_BYTES if self._writer is not None else 0
        reader = READER_BYTES if self._index is not None else 0
        return reader + writer + QUEUED_DOC_BYTES * len(self._queue)

    def backlog(self) -> tuple[int, int]:
        """Ops published and not yet in a durable commit, and the bytes of their text."""
        with self._cond:
            return len(self._queue), sum(len(doc.text) for doc, _id, _r in self._queue if doc)

    def settled(self) -> bool:
        """Whether everything published is in a durable commit (a hint)."""
        return self.committed_seq >= self._published_seq

    def failing(self) -> bool:
        """Whether the last commit failed: searches are refused until one succeeds."""
        return self._error is not None

    def searches_at_once(self) -> bool:
        """Whether a recall's search would start without waiting for the fold (a hint)."""
        return len(self._tail.docs) <= TAIL_MAX_DOCS

    def search(
        self,
        text: str,
        *,
        limit: int,
        kind: str | None = None,
        filters: dict[str, FilterValue] | None = None,
    ) -> list[tuple[str, float]]:
        """(event id, BM25 score) best first, kind and filters applied inside the search."""
        return list(self.ranked(text, limit=limit, kind=kind, filters=filters))

    def ranked(
        self,
        text: str,
        *,
        limit: int,
        kind: str | None = None,
        filters: dict[str, FilterValue] | None = None,
        text_of: Callable[[int], str | None] | None = None,
    ) -> Ranked:
        """As search, but each hit's id is read from the index only when the caller gets to it.

        Read-your-writes: every document published before the call is searched. With text_of
        (a seq's text in the caller's snapshot, None for an event it does not hold) the queued
        tail is searched beside the committed index and both are scored with the statistics of
        the index once the tail is committed; without it, the search waits for the fold."""
        words = query_terms(text)
        if not words or limit <= 0:
            return Ranked(None, [])
        with self._cond:
            self._refuse_if_failing()
            view, queued = self._view_now(), len(self._tail.docs)
            settled = self.committed_seq >= self._published_seq
        # The committed searcher holds everything published; or all that is queued is deletes,
        # and the caller's snapshot no longer holds what they delete.
        if settled or (not queued and text_of is not None):
            return _search(view, words, limit, kind, filters, self._ties)
        terms = query_tokens(words) if text_of is not None and queued <= TAIL_MAX_DOCS else None
        if terms is not None:
            with self._cond:  # the searcher and the tail as one moment (the fold swaps both)
                self._refuse_if_failing()
                view, queued, tokens = self._view_now(), len(self._tail.docs), self._tail.tokens
                tail, tail_df = self._tail.matching(terms)
            committed = view.stats() if queued else None
            if not queued:
                return _search(view, words, limit, kind, filters, self._ties)
            if committed is not None:
                assert text_of is not None
                stats = (committed, committed.plus(queued, tokens))
                merge = Merge(view, words, terms, stats, tail_df)
                return merge.ranked(tail, limit, kind, filters, text_of)
        # No snapshot to read texts from, a tail too long to score here, or no statistics to
        # score with (every committed document deleted): wait for the fold instead.
        self.flush()
        with self._cond:
            view = self._view_now()
        return _search(view, words, limit, kind, filters, self._ties)

    def with_words(self, groups: list[list[str]]) -> tuple[list[int], int]:
        """The seqs of the committed documents holding every word of one of the groups (each
        as `words` makes them), and the log op that commit covers: what was published since is
        not searched (the caller reads it from the log). An erasure's identifier search."""
        with self._cond:
            view, covered = self._view, self.committed_seq
        searcher, schema = view.searcher, self.schema
        Occur, Query = tantivy.Occur, tantivy.Query
        query = Query.boolean_query(
            [
                (
                    Occur.Should,
                    Query.boolean_query(
                        [(Occur.Must, Query.term_query(schema, WORDS, w)) for w in group]
                    ),
                )
                for group in groups
            ]
        )
        first = searcher.search(query, 1, count=True)
        count = cast(int, first.count)  # type: ignore[attr-defined]  # the stub lacks it
        hits = first.hits if count <= 1 else searcher.search(query, count, count=False).hits
        if not hits:
            return [], covered
        return cast(list[int], searcher.fast_field_values("seq", [a for _s, a in hits])), covered

    def _refuse_if_failing(self) -> None:
        """No answer while what was acknowledged cannot be folded (caller holds _cond)."""
        if self._error is not None and self.committed_seq < self._published_seq:
            raise self._refusal()

    def kind_share(self, kind: str) -> float:
        """The share of documents of this kind, queued ones included (deleted ones not yet
        merged away count: a hint)."""
        with self._cond:
            searcher = self._view_now().searcher
            queued, of_kind = len(self._tail.docs), self._tail.kinds[kind]
        total = searcher.num_docs + queued
        return (searcher.doc_freq("kind", kind) + of_kind) / total if total else 0.0

    def doc_count(self) -> int:
        """Number of live documents."""
        self.flush()
        return int(self._view.searcher.num_docs)

    def close(self) -> None:
        """Commit what is pending, leave the pool and wait for merges.

        If that last commit fails, what it held is dropped here: committed_seq still says what
        the index covers, and the tenant replays the rest from the log when it next opens.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            task = self._task
        if task is not None:
            task.cancel()  # a fold under way finishes first
            self._task = None  # the task's step refers back here: no cycle outlives the close
        if self._published_seq != self.committed_seq:
            self._fold_once()  # one last attempt; a failure leaves the rest to the log's replay
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            behind = self._published_seq - self.committed_seq
            self._queue.clear()
            self._tail.clear()
        held().forget(self)
        if behind:
            log.warning("keyword index closed %d ops behind the log; they replay on open", behind)
        with self.writer_lock:
            if self._writer is not None:
                try:
                    if behind:
                        self._writer.rollback()
                    self._writer.wait_merging_threads()
                except Exception:  # a merge that failed leaves its segments as they were
                    log.warning("keyword writer did not close cleanly", exc_info=True)
                self._writer = None


def document(d: KeywordDoc) -> tantivy.Document:
    """The Tantivy document of an event: id, text, kind, one tag per filterable property, the
    words of its text and properties, seq."""
    doc = tantivy.Document()
    doc.add_text("id", d.event_id)
    if d.text:
        doc.add_text("text", d.text)
    doc.add_text("kind", d.kind)
    doc.add_text(WORDS, searched_text(d.text, d.properties))
    for tag in _tags(d):
        doc.add_text("tag", tag)
    doc.add_unsigned("seq", d.seq)
    return doc


def _tail_doc(d: KeywordDoc) -> TailDoc:
    """A published document as the tail searches it."""
    return TailDoc(d.seq, d.event_id, d.kind, frozenset(_tags(d)), d.text)


def _tags(d: KeywordDoc) -> list[str]:
    """The tags of an event: one per filterable property, one per subject."""
    tags = [property_tag(name, value) for name, value in d.filterable.items()]
    if d.subjects:
        tags += [property_tag(layout.SUBJECT, s) for s in d.subjects]
    return tags


def _a_term(ops: list[Op]) -> str | None:
    """A term of the last document these ops add (to read a fresh commit's statistics by)."""
    for doc, _id, _replace in reversed(ops):
        if doc is not None:
            tf, _length = analyze(doc.text)
            if tf:
                return next(iter(tf))
    return None


class View:
    """One committed searcher and its BM25 statistics, read once when first needed."""

    def __init__(self, index: tantivy.Index, term: str | None = None) -> None:
        self.index = index
        self.searcher = index.searcher()
        self._term = term
        self._stats: Stats | None = None
        self._read = False
        self._lock = threading.Lock()

    def stats(self) -> Stats | None:
        """N and the text field's tokens as Tantivy counts them; None if they cannot be read."""
        if not self._read:
            with self._lock:
                if not self._read:
                    self._stats = committed_stats(self.index, self.searcher, self._term)
                    self._read = True
        return self._stats

    def query(
        self, words: list[str], kind: str | None, filters: dict[str, FilterValue] | None
    ) -> tantivy.Query:
        """The words OR-ed, with kind and tags as required clauses that add nothing to the
        score: the order is the words' BM25 alone, whatever tags an event carries."""
        return _query(self.index, words, kind, filters)


def _query(
    index: tantivy.Index,
    words: list[str],
    kind: str | None,
    filters: dict[str, FilterValue] | None,
) -> tantivy.Query:
    """See View.query."""
    schema = index.schema
    query, _errors = index.parse_query_lenient(" ".join(words), [FIELD])
    clauses = [(tantivy.Occur.Must, query)]
    if kind is not None:
        clause = tantivy.Query.term_query(schema, "kind", kind)
        clauses.append((tantivy.Occur.Must, tantivy.Query.const_score_query(clause, 0.0)))
    for name, value in (filters or {}).items():
        clause = tantivy.Query.term_query(schema, "tag", property_tag(name, value))
        clauses.append((tantivy.Occur.Must, tantivy.Query.const_score_query(clause, 0.0)))
    if len(clauses) > 1:  # alone, the parsed words: same hits and scores, 4 % faster
        query = tantivy.Query.boolean_query(clauses)
    return query


class Ties:
    """How often a search's cut has lately fallen among equal scores that run past the first
    TIE_FETCH * limit + 1 hits: a hint for how deep the first search goes (races on it are
    harmless; only the cost of a search depends on it, never its answer)."""

    __slots__ = ("score",)

    def __init__(self) -> None:
        self.score = 0  # up TIE_UP for a tied cut, down TIE_DOWN for another, within 0..TIE_MAX

    def common(self) -> bool:
        """Whether the first search should go TIE_FIRST deep at once."""
        return self.score >= TIE_COMMON

    def note(self, tied: bool) -> None:
        """Count one search's cut."""
        score = self.score + TIE_UP if tied else self.score - TIE_DOWN
        self.score = min(TIE_MAX, max(0, score))


def _search(
    view: View,
    words: list[str],
    limit: int,
    kind: str | None,
    filters: dict[str, FilterValue] | None,
    ties: Ties,
) -> Ranked:
    """One committed searcher's BM25 hits for the words, kind and tags required."""
    searcher = view.searcher
    query = view.query(words, kind, filters)
    shallow = TIE_FETCH * limit + 1
    fetch = max(shallow, limit + TIE_FIRST) if ties.common() else shallow
    hits = searcher.search(query, fetch, count=False).hits
    ties.note(len(hits) >= shallow and hits[shallow - 1][0] == hits[limit - 1][0])
    # Equal scores come out in the segments' document order, which a purge's rebuild or a
    # merge changes (and a copy of the tenant has its own): when the cut falls among equal
    # scores, take all of them, so that Ranked's order by seq decides which make it (up to
    # TIE_HITS more: past that many equal scores the order is the segments' again). Whichever
    # depth the first search had, the hits Ranked orders are the same.
    while len(hits) == fetch and hits[-1][0] == hits[limit - 1][0] and fetch < limit + TIE_HITS:
        fetch = min(2 * fetch, limit + TIE_HITS)
        hits = searcher.search(query, fetch, count=False).hits
    return Ranked(searcher, hits, limit=limit)


# Tantivy scores in float32: a committed hit's score and the one the merge computes for it agree
# to this relative precision, so every bound below is widened by it.
EPS = 1e-5
# How many committed hits a merge fetches first (bench/RESULTS.md, "Recall while appending").
FETCH_TIMES = 4
FETCH_MIN = 40


class _Item:
    """A candidate of a merge: the bounds of its score under the combined statistics (equal once
    known exactly), its seq, and its address in the searcher (or its event id, for the tail's)."""

    __slots__ = ("exact", "hi", "live", "lo", "seq", "where")

    def __init__(self, lo: float, hi: float, seq: int, where: Any, exact: bool) -> None:
        self.lo, self.hi, self.seq, self.where, self.exact = lo, hi, seq, where, exact
        self.live = False  # the caller's snapshot holds it (checked only near the top)


def _head(queued: list[tuple[float, int, str]], n: int) -> list[tuple[float, int, str]]:
    """The first n of the tail's scored hits and any tied with the last of them: while n of
    them are live, no other can be among the first n of the merge."""
    end = min(n, len(queued))
    while 0 < end < len(queued) and queued[end][0] == queued[end - 1][0]:
        end += 1
    return queued[:end]


class Merge:
    """A search of a committed searcher and the queued tail, ranked as the index will rank them
    once the tail is committed.

    The tail's documents are scored exactly with the combined statistics. A committed hit's
    Tantivy score is under the committed ones; the combined statistics move it by a ratio
    within `bounds` (keyword_tail.py), so each hit is an interval, and only where intervals
    overlap near the top is a hit scored again from its text (the caller's snapshot holds it):
    the order of the rest is already certain. A committed document below the last one fetched
    scores at most that bound above it; the search fetches deeper until the first `limit`
    are certain to rank above every document not fetched."""

    def __init__(
        self,
        view: View,
        words: list[str],
        terms: list[str],
        stats: tuple[Stats, Stats],
        tail_df: dict[str, int],
    ) -> None:
        committed, combined = stats
        self.view = view
        self.words = words
        self.terms = terms
        searcher = view.searcher
        self.df = {t: int(searcher.doc_freq(FIELD, t)) for t in set(terms)}
        df = {t: n + tail_df.get(t, 0) for t, n in self.df.items()}
        self.scorer = Scorer(terms, df, combined)
        self.lo, self.hi = bounds(terms, self.df, tail_df, committed, combined)
        self._by_text: dict[str, float] = {}  # a text's score: equal texts are analysed once

    def score_text(self, text: str) -> float:
        """The score of a document of this text under the combined statistics."""
        score = self._by_text.get(text)
        if score is None:
            score = self._by_text[text] = self.scorer.score(*analyze(text))
        return score

    def ranked(
        self,
        tail: dict[str, list[TailDoc]],
        limit: int,
        kind: str | None,
        filters: dict[str, FilterValue] | None,
        text_of: Callable[[int], str | None],
    ) -> Ranked:
        """The merged hits best first, at most limit of them, each live in the caller's snapshot
        (tail: the queued documents' postings of the query's terms)."""
        tags = {property_tag(name, value) for name, value in (filters or {}).items()}
        queued = [
            (score, d.seq, d.event_id)
            for score, d in self.scorer.score_postings(tail)
            if (kind is None or d.kind == kind) and tags <= d.tags
        ]
        queued.sort(key=lambda e: (-e[0], e[1]))  # equal scores: the oldest first (see Ranked)
        known: dict[int, float | None] = {}  # seq -> exact score, None if not live
        live: set[int] = set()
        searcher = self.view.searcher if any(self.df.values()) else None
        query = self.view.query(self.words, kind, filters) if searcher is not None else None
        # Deep enough that the first limit are usually certain after one search: a deeper top-k
        # costs Tantivy little, a second search costs a whole one.
        fetch = max(FETCH_MIN, FETCH_TIMES * limit)
        lo, hi = self.lo * (1.0 - EPS), self.hi * (1.0 + EPS)
        hits: list[tuple[Any, Any]] = []
        seqs: list[int] = []
        searched = 0
        dead = 0  # the tail's hits found not live: the head grows by as many
        while True:
            if searcher is not None and searched != fetch:
                assert query is not None
                hits = searcher.search(query, fetch, count=False).hits
                seqs = cast(list[int], searcher.fast_field_values("seq", [a for _s, a in hits]))
                searched = fetch
            head = _head(queued, limit + dead)
            items = [
                _Item(float(sc) * lo, float(sc) * hi, seq, addr, False)
                for (sc, addr), seq in zip(hits, seqs, strict=True)
            ]
            items += [_Item(sc, sc, seq, eid, True) for sc, seq, eid in head]
            top = self._resolve(items, limit, text_of, known, live)
            gone = sum(1 for _sc, seq, _eid in head if seq in known and known[seq] is None)
            if gone > dead and len(head) < len(queued):
                dead = gone
                continue
            if searcher is None or len(hits) < fetch:  # every committed hit is here
                return self._ranked(searcher, top, limit, text_of)
            floor = float(hits[-1][0]) * hi  # what a document not fetched can score at most
            if len(top) >= limit and min(it.lo for it in top[:limit]) > floor:
                return self._ranked(searcher, top, limit, text_of)
            fetch *= 4

    def _resolve(
        self,
        items: list[_Item],
        limit: int,
        text_of: Callable[[int], str | None],
        known: dict[int, float | None],
        live: set[int],
    ) -> list[_Item]:
        """The live items in their exact order as far as the first limit: where intervals overlap
        there, their committed hits are scored from their text; each of the first limit is
        checked to be live in the caller's snapshot."""
        for it in items:
            if it.seq in known:
                score = known[it.seq]
                if score is not None:
                    it.lo = it.hi = score
                    it.exact = True
            it.live = it.seq in live
        while True:
            items = [it for it in items if known.get(it.seq, 0.0) is not None]
            items.sort(key=lambda it: (-it.hi, it.seq))  # equal scores: the oldest first
            changed = False
            i, n = 0, len(items)
            while i < n and i < limit:
                j, low = i + 1, items[i].lo
                while j < n and items[j].hi >= low:  # overlaps the run: order unknown
                    if items[j].lo < low:
                        low = items[j].lo
                    j += 1
                for it in items[i:j]:
                    if it.live and (it.exact or j == i + 1):
                        continue
                    text = text_of(it.seq)
                    if text is None:  # deleted, or not in the caller's snapshot
                        known[it.seq] = None
                        changed = True
                        continue
                    it.live = True
                    live.add(it.seq)
                    if not it.exact and j > i + 1:
                        it.lo = it.hi = self.score_text(text)
                        it.exact = True
                        known[it.seq] = it.lo
                        changed = True
                i = j
            if not changed:
                return items

    def _ranked(
        self,
        searcher: tantivy.Searcher | None,
        items: list[_Item],
        limit: int,
        text_of: Callable[[int], str | None],
    ) -> Ranked:
        """The first limit items as hits; a hit's exact score is computed only if it is read."""

        def score_of(seq: int) -> float:
            text = text_of(seq)
            return self.score_text(text) if text is not None else 0.0

        entries = [(it.lo if it.exact else None, it.seq, it.where) for it in items[:limit]]
        return Ranked(searcher, [], entries=entries, score_of=score_of)


class Ranked:
    """A search's hits best first: their seqs, read from a column (or known, for the tail's), and
    their event ids, each read from the index's document store as it is reached."""

    def __init__(
        self,
        searcher: tantivy.Searcher | None,
        hits: list[tuple[Any, Any]],
        *,
        entries: list[tuple[float | None, int, Any]] | None = None,
        score_of: Callable[[int], float] | None = None,
        limit: int = 0,
    ) -> None:
        self.searcher = searcher
        self.score_of = score_of  # a hit's score where the entry leaves it None
        if entries is None:  # Tantivy's hits as they come: (score, address)
            if limit and len(hits) > limit:  # only the ties of the cut compete for its places
                cut, end = hits[limit - 1][0], limit
                while end < len(hits) and hits[end][0] == cut:
                    end += 1
                hits = hits[:end]
            values: list[int] = []
            if searcher is not None:
                addrs = [addr for _score, addr in hits]
                values = cast(list[int], searcher.fast_field_values("seq", addrs))
            entries = [(float(sc), seq, addr) for (sc, addr), seq in zip(hits, values, strict=True)]
            # Equal scores: the oldest event first, as Tantivy ranks them within one segment;
            # across segments it goes by segment, and the fold's timing decides those.
            entries.sort(key=lambda e: (-cast(float, e[0]), e[1]))
            if limit:
                del entries[limit:]  # the ties fetched past the cut decided which made it
        # (score or None, seq, the hit's address in the searcher, or its event id if the tail's)
        self.entries = entries
        self.seqs = [seq for _score, seq, _where in entries]

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[tuple[str, float]]:
        """(event id, BM25 score) pairs."""
        for known, seq, where in self.entries:
            if known is not None:
                score = known
            else:  # a committed hit whose order was certain without its exact score
                assert self.score_of is not None  # there are None scores only with score_of
                score = self.score_of(seq)
            if isinstance(where, str):
                yield where, score
                continue
            assert self.searcher is not None  # there are addresses only with a searcher
            # get_first: cheaper than doc(addr)["id"][0], which builds the whole document.
            yield cast(str, self.searcher.doc(where).get_first("id")), score

"""The keyword index: a Tantivy projection of the log holding ids and indexed (never stored) text."""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import msgspec
import tantivy

from storage import failpoints
from storage.errors import DiskFull
from storage.log import layout
from storage.model import FilterValue
from storage.space import disk_full

log = logging.getLogger("memspine.keyword")

# Words are runs of letters and digits; everything else separates them, so no query syntax
# can reach Tantivy's parser (lowercasing also disarms its AND/OR/NOT operators).
_WORD = re.compile(r"[^\W_]+")
MAX_QUERY_WORDS = 64
WRITER_HEAP_BYTES = 16_000_000
# The fold commits at most this often unless a search is waiting: every commit is a new segment
# (fsyncs now, merge CPU later), and at hundreds of appends a second one commit per group commit
# spent a large share of a core merging tiny segments (bench/RESULTS.md, "Appends").
FOLD_INTERVAL_SECS = 0.25
# Resident memory, for memory_bytes: the searcher's own state is small (segments are
# memory-mapped files, so page cache); a writer, once made, keeps its indexing arena and thread
# (measured after a commit, bench/RESULTS.md); a queued document holds its text until the fold.
READER_BYTES = 64_000
WRITER_BYTES = 3_000_000
QUEUED_DOC_BYTES = 1_000
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
    """What the keyword index needs of one event (seq: the log op that appended it)."""

    event_id: str
    kind: str
    text: str
    filterable: dict[str, FilterValue]
    seq: int


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
    b.add_unsigned_field("seq", stored=False, indexed=False, fast=True)
    return b.build()


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


def query_words(text: str) -> list[str]:
    """The lowercase words of a user's text, at most MAX_QUERY_WORDS of them."""
    return [w.lower() for w in _WORD.findall(text)][:MAX_QUERY_WORDS]


def query_terms(text: str) -> list[str]:
    """The words a query searches for: its words less stop words, or all of them if only those."""
    words = query_words(text)
    return [w for w in words if w not in STOP_WORDS] or words


class KeywordIndex:
    """BM25 search over one tenant's event text, restricted by kind and property tags.

    A durable Tantivy commit costs several fsyncs, too slow to sit in every group commit
    (bench/RESULTS.md, "Appends"). So the writer only `publish`es documents, a background thread folds them into the
    index with one durable commit per round, and a search first waits until every document
    published before it began is committed: appends never wait for Tantivy, and a recall sees
    every acknowledged event, ranked exactly as if it had been committed with its append.

    A published document leaves the queue only once a commit holding it is durable, and
    committed_seq (which the tenant records as its keyword watermark) moves only then: a commit
    that fails (a full disk) is rolled back and retried with everything still queued, and
    searches meanwhile answer 503 rather than silently miss what was acknowledged.
    """

    def __init__(self, path: Path, index: tantivy.Index, committed_seq: int = 0) -> None:
        self.path = path
        self.index = index
        self.schema = index.schema
        self._writer: tantivy.IndexWriter | None = None  # made on first write: reopens stay light
        self.writer_lock = threading.Lock()  # Tantivy writers refuse concurrent use
        self.committed_seq = committed_seq  # the log op the committed index covers
        self._published_seq = committed_seq
        # Published and not yet durably committed, in order: (doc to add | None to delete, id).
        self._queue: list[tuple[KeywordDoc | None, str]] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._waiting = 0  # searches waiting for the fold: it commits at once for them
        self._last_fold = 0.0
        self._error: Exception | None = None  # why the last commit failed; None once one succeeds
        self._full = False  # that failure was a full disk
        self._failures = 0  # commits failed in a row (the retry backs off)
        self._retry_at = 0.0
        self._attempts = 0  # commits tried, failed or not (a waiter sees one end)
        self._thread: threading.Thread | None = None

    @classmethod
    def open(cls, path: Path, committed_seq: int = 0) -> KeywordIndex:
        """Open the index at path, creating an empty one if there is none; raises ValueError
        for an index of any other schema (the tenant then rebuilds it from the log)."""
        path.mkdir(parents=True, exist_ok=True)
        index = tantivy.Index(_schema(), path=str(path), reuse=True)
        return cls(path, index, committed_seq)

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
            for d in docs:
                self.writer.delete_documents_by_term("id", d.event_id)
                self.writer.add_document(document(d))

    def delete(self, event_ids: Iterable[str]) -> None:
        """Stage deletions by id."""
        with self.writer_lock:
            for e in event_ids:
                self.writer.delete_documents_by_term("id", e)

    def commit(self) -> None:
        """Fold anything published, then make staged changes durable and visible."""
        self.flush()
        with self.writer_lock:
            self.writer.commit()
        self.index.reload()

    # -- the writer's path ----------------------------------------------------

    def publish(self, docs: list[KeywordDoc], deletes: list[str], seq: int) -> None:
        """Hand the changes of log ops up to seq to the background fold."""
        with self._cond:
            self._queue.extend((d, d.event_id) for d in docs)
            self._queue.extend((None, e) for e in deletes)
            self._published_seq = seq
            if self._thread is None:
                self._thread = threading.Thread(target=self._fold, name="keyword", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _fold(self) -> None:
        """Background: commit what was published, one durable commit per round, retrying failures."""
        while True:
            with self._cond:
                while self._published_seq == self.committed_seq and not self._stopping:
                    self._cond.wait()
                if self._published_seq == self.committed_seq:
                    return
                self._gather()
                final = self._stopping  # close() is waiting: one last attempt, then give up
                ops = list(self._queue)  # publish appends meanwhile; these leave only once durable
                seq = self._published_seq
            try:
                if ops:
                    self._commit_ops(ops)
            except Exception as exc:
                self._failed_commit(exc)
                if final:
                    return
                continue
            with self._cond:
                if self._failures:
                    log.warning("keyword commits resumed after %d failed", self._failures)
                del self._queue[: len(ops)]
                self.committed_seq = seq
                self._error, self._full, self._failures = None, False, 0
                self._attempts += 1
                self._last_fold = time.monotonic()
                self._cond.notify_all()

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

    def _gather(self) -> None:
        """Let more work pile up until FOLD_INTERVAL_SECS after the last commit, or until the
        retry is due after a failure (caller holds _cond)."""
        while not self._stopping:
            if self._error is not None:
                left = self._retry_at - time.monotonic()  # a waiting search does not hurry it
            elif self._waiting:
                return
            else:
                left = self._last_fold + FOLD_INTERVAL_SECS - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(timeout=left)

    def _commit_ops(self, ops: list[tuple[KeywordDoc | None, str]]) -> None:
        """Apply queued adds and deletes in order, commit durably, reload the searcher."""
        with self.writer_lock:
            for doc, event_id in ops:
                self.writer.delete_documents_by_term("id", event_id)
                if doc is not None:
                    self.writer.add_document(document(doc))
            failpoints.hit("keyword.commit")
            self.writer.commit()
        self.index.reload()

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
            self._cond.notify_all()  # the fold stops gathering and commits for us
            attempts = self._attempts
            try:
                while self.committed_seq < target:
                    if self._error is not None and self._attempts != attempts:
                        raise self._refusal()  # the commit this search waited for failed
                    if self._thread is None or not self._thread.is_alive():
                        raise RuntimeError("the keyword index is closed")
                    self._cond.wait(timeout=1.0)
            finally:
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
        return READER_BYTES + writer + QUEUED_DOC_BYTES * len(self._queue)

    def settled(self) -> bool:
        """Whether a search would start at once: everything published is committed (a hint)."""
        return self.committed_seq >= self._published_seq

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
    ) -> Ranked:
        """As search, but each hit's id is read from the index only when the caller gets to it."""
        words = query_terms(text)
        if not words or limit <= 0:
            return Ranked(None, [])
        self.flush()  # read-your-writes: every document acknowledged before now is searchable
        return _search(self.index, words, limit, kind, filters)

    def kind_share(self, kind: str) -> float:
        """The share of documents of this kind (deleted ones not yet merged away count: a
        hint); waits for the fold as a search does, which the search after it then need not."""
        self.flush()
        searcher = self.index.searcher()
        total = searcher.num_docs
        return searcher.doc_freq("kind", kind) / total if total else 0.0

    def doc_count(self) -> int:
        """Number of live documents."""
        self.flush()
        return int(self.index.searcher().num_docs)

    def close(self) -> None:
        """Commit what is pending, stop the background thread and wait for merges.

        If that last commit fails, what it held is dropped here: committed_seq still says what
        the index covers, and the tenant replays the rest from the log when it next opens.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._cond:
            behind = self._published_seq - self.committed_seq
            self._queue.clear()
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
    """The Tantivy document of an event: id, text, kind, one tag per filterable property, seq."""
    doc = tantivy.Document()
    doc.add_text("id", d.event_id)
    doc.add_text("text", d.text)
    doc.add_text("kind", d.kind)
    for name, value in d.filterable.items():
        doc.add_text("tag", property_tag(name, value))
    doc.add_unsigned("seq", d.seq)
    return doc


def _search(
    index: tantivy.Index,
    words: list[str],
    limit: int,
    kind: str | None,
    filters: dict[str, FilterValue] | None,
) -> Ranked:
    """One index's BM25 hits for the words, with kind and tags as required clauses."""
    schema = index.schema
    query, _errors = index.parse_query_lenient(" ".join(words), ["text"])
    clauses = [(tantivy.Occur.Must, query)]
    if kind is not None:
        clauses.append((tantivy.Occur.Must, tantivy.Query.term_query(schema, "kind", kind)))
    for name, value in (filters or {}).items():
        tag = tantivy.Query.term_query(schema, "tag", property_tag(name, value))
        clauses.append((tantivy.Occur.Must, tag))
    if len(clauses) > 1:  # alone, the parsed words: same hits and scores, 4 % faster
        query = tantivy.Query.boolean_query(clauses)
    searcher = index.searcher()
    return Ranked(searcher, searcher.search(query, limit).hits)


class Ranked:
    """A search's hits best first: their seqs, read from a column, and their event ids, each read
    from the index's document store as it is reached."""

    def __init__(self, searcher: tantivy.Searcher | None, hits: list[tuple[Any, Any]]) -> None:
        self.searcher = searcher
        self.hits = hits
        self.seqs: list[int] = []
        if searcher is not None:
            values = searcher.fast_field_values("seq", [addr for _score, addr in hits])
            self.seqs = cast(list[int], values)  # every document has its seq

    def __len__(self) -> int:
        return len(self.hits)

    def __iter__(self) -> Iterator[tuple[str, float]]:
        """(event id, BM25 score) pairs."""
        for score, addr in self.hits:
            assert self.searcher is not None  # there are hits only with a searcher
            # get_first: cheaper than doc(addr)["id"][0], which builds the whole document.
            yield cast(str, self.searcher.doc(addr).get_first("id")), float(score)

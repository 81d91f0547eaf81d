"""The keyword index: a Tantivy projection of the log holding ids and indexed (never stored) text."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable
from pathlib import Path

import msgspec
import tantivy

from storage import encoding as enc
from storage.model import FilterValue

# Words are runs of letters and digits; everything else separates them, so no query syntax
# can reach Tantivy's parser (lowercasing also disarms its AND/OR/NOT operators).
_WORD = re.compile(r"[^\W_]+")
MAX_QUERY_WORDS = 64
WRITER_HEAP_BYTES = 16_000_000


class KeywordDoc(msgspec.Struct, frozen=True):
    """What the keyword index needs of one event."""

    event_id: str
    kind: str
    text: str
    filterable: dict[str, FilterValue]


def _schema() -> tantivy.Schema:
    """Id (stored, exact), text (indexed with stemming, not stored), kind and property tags (exact)."""
    b = tantivy.SchemaBuilder()
    b.add_text_field("id", stored=True, tokenizer_name="raw")
    b.add_text_field("text", stored=False, tokenizer_name="en_stem", index_option="freq")
    b.add_text_field("kind", stored=False, tokenizer_name="raw")
    b.add_text_field("tag", stored=False, tokenizer_name="raw")
    return b.build()


def property_tag(name: str, value: FilterValue) -> str:
    """One exact-match token per filterable property: the same typed encoding as the log's index."""
    return enc.property_prefix(name, value).hex()


# The Snowball project's English stop words (apostrophe forms left out: they never survive _WORD).
# Dropped from queries only, never from the index: question words and pronouns ("when did she")
# match most of a conversation and outvote the words that carry the question. On LoCoMo
# conversations 0-4 this alone lifts BM25 from nDCG@10 0.438 to 0.482 (bench/RESULTS.md).
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
    """BM25 search over one tenant's event text, restricted by kind and property tags."""

    def __init__(self, path: Path, index: tantivy.Index) -> None:
        self.path = path
        self.index = index
        self.schema = index.schema
        self.writer = index.writer(heap_size=WRITER_HEAP_BYTES, num_threads=1)

    @classmethod
    def open(cls, path: Path) -> KeywordIndex:
        """Open the index at path, creating an empty one if there is none."""
        path.mkdir(parents=True, exist_ok=True)
        return cls(path, tantivy.Index(_schema(), path=str(path), reuse=True))

    @classmethod
    def create_empty(cls, path: Path) -> KeywordIndex:
        """Replace whatever is at path with an empty index (used to rebuild a damaged one)."""
        shutil.rmtree(path, ignore_errors=True)
        return cls.open(path)

    def add(self, docs: Iterable[KeywordDoc]) -> None:
        """Stage documents; replaces any earlier document with the same id so replays are idempotent."""
        for d in docs:
            self.writer.delete_documents_by_term("id", d.event_id)
            doc = tantivy.Document()
            doc.add_text("id", d.event_id)
            doc.add_text("text", d.text)
            doc.add_text("kind", d.kind)
            for name, value in d.filterable.items():
                doc.add_text("tag", property_tag(name, value))
            self.writer.add_document(doc)

    def delete(self, event_ids: Iterable[str]) -> None:
        """Stage deletions by id."""
        for e in event_ids:
            self.writer.delete_documents_by_term("id", e)

    def commit(self) -> None:
        """Make staged changes durable and visible to the next search."""
        self.writer.commit()
        self.index.reload()

    def search(
        self,
        text: str,
        *,
        limit: int,
        kind: str | None = None,
        filters: dict[str, FilterValue] | None = None,
    ) -> list[tuple[str, float]]:
        """(event id, BM25 score) best first, kind and filters applied inside the search."""
        words = query_terms(text)
        if not words or limit <= 0:
            return []
        text_query, _errors = self.index.parse_query_lenient(" ".join(words), ["text"])
        clauses = [(tantivy.Occur.Must, text_query)]
        if kind is not None:
            clauses.append(
                (tantivy.Occur.Must, tantivy.Query.term_query(self.schema, "kind", kind))
            )
        for name, value in (filters or {}).items():
            tag = tantivy.Query.term_query(self.schema, "tag", property_tag(name, value))
            clauses.append((tantivy.Occur.Must, tag))
        query = tantivy.Query.boolean_query(clauses)
        searcher = self.index.searcher()
        hits = searcher.search(query, limit).hits
        return [(searcher.doc(addr)["id"][0], float(score)) for score, addr in hits]

    def doc_count(self) -> int:
        """Number of live documents."""
        return int(self.index.searcher().num_docs)

    def close(self) -> None:
        """Release the writer (and its lock on the directory)."""
        self.writer.wait_merging_threads()

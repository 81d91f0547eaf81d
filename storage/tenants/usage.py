"""What a tenant uses: its events, their bytes, its files on disk by part, its vectors; read from
counters and file sizes, never by a scan of its events."""

from __future__ import annotations

from pathlib import Path

import msgspec

from storage import files
from storage.index.vecfile import VectorFileError, live_path, read_live
from storage.log import layout
from storage.log.appender import vector_bytes
from storage.log.eventlog import read_only, record_bytes
from storage.log.layout import space_name
from storage.log.reader import LogReader

METRIC = "cosine"  # the vector index's space (storage/index/vectors.py)


def quota_figures(r: LogReader) -> tuple[int, int]:
    """What a quota counts of a log: its live events, and their bytes with the vectors the
    server owes the events that await theirs (storage/log/appender.py counts them so)."""
    owed = r.unembedded_count() * vector_bytes(r.meta_int(layout.DIM) or 0)
    return r.event_count(), (r.meta_int(layout.LIVE_BYTES) or 0) + owed


class EventCounts(msgspec.Struct, frozen=True, kw_only=True):
    """Live events, and events deleted whose bytes await the next purge."""

    live: int
    deleted: int


class Bytes(msgspec.Struct, frozen=True, kw_only=True):
    """The live events' records as the log stores them (what max_bytes counts), and the files
    on disk by part (the log's LMDB environment, the keyword index, the vector graph, the
    read records: storage/readlog/)."""

    live: int
    log: int
    keyword: int
    vectors: int
    total: int
    reads: int = 0


class VectorCounts(msgspec.Struct, frozen=True, kw_only=True):
    """Vectors in the index (the HNSW graph, or below its threshold the exact rows that stand
    for it), acknowledged ones still in the exact tail on their way into the graph, and events
    that await the vector the server makes for them."""

    graph: int
    pending: int
    unembedded: int = 0


class VectorSpace(msgspec.Struct, frozen=True, kw_only=True):
    """The tenant's embedding dimension, its model (the server's, or the first a client named),
    who makes its vectors ("server", "client", or "none" while nobody has), the metric."""

    dim: int | None
    model: str | None
    made_by: str = "none"
    metric: str = METRIC


class TenantUsage(msgspec.Struct, frozen=True, kw_only=True):
    """One tenant's figures: whether it is open in this server (null: read by another process,
    which cannot tell), its events, bytes, vectors, vector space, last write (µs since the
    epoch, null if none since this was kept), and `memory`: the bytes it holds in memory while
    open as the tenant manager's budget counts them (storage/tenants/footprint.py: from its
    counters when open, from its vector file's size when closed: what opening it would take),
    null where nobody measured it (a process that only reads the files)."""

    open: bool | None
    events: EventCounts
    bytes: Bytes
    vectors: VectorCounts
    vector_space: VectorSpace
    last_write: int | None
    memory: int | None = None


EMPTY_COUNTS = EventCounts(live=0, deleted=0)


def disk_bytes(root: Path, live: int) -> Bytes:
    """The sizes of a tenant's files by part, and `live`."""
    log = files.tree_bytes(root / files.LOG)
    keyword = files.tree_bytes(root / files.KEYWORD)
    vectors = files.tree_bytes(root / files.VECTORS) + files.tree_bytes(root / files.VECTORS_LIVE)
    reads = files.tree_bytes(root / files.READS)
    return Bytes(
        live=live,
        log=log,
        keyword=keyword,
        vectors=vectors,
        total=log + keyword + vectors + reads,
        reads=reads,
    )


def live_bytes(r: LogReader) -> int:
    """The bytes of the live records: the log's counter (a log of schema 1 opened read-only has
    none yet, and is counted)."""
    kept = r.meta_int(layout.LIVE_BYTES)
    return kept if kept is not None else record_bytes(r)


def usage_of(
    r: LogReader,
    root: Path,
    *,
    is_open: bool | None,
    graph: int,
    pending: int,
    dim: int | None,
    memory: int | None = None,
) -> TenantUsage:
    """A tenant's figures from one snapshot of its log and the vector and memory counts given."""
    size = live_bytes(r)
    return TenantUsage(
        open=is_open,
        events=EventCounts(live=r.event_count(), deleted=r.tombstone_count()),
        bytes=disk_bytes(root, size),
        vectors=VectorCounts(graph=graph, pending=pending, unembedded=r.unembedded_count()),
        vector_space=VectorSpace(
            dim=dim, model=r.meta_str(layout.MODEL), made_by=space_name(r.space())
        ),
        last_write=r.meta_int(layout.LAST_WRITE),
        memory=memory,
    )


def closed_usage(root: Path, *, is_open: bool | None = False) -> TenantUsage:
    """The figures of a tenant from its files alone: the log read in one read-only snapshot,
    the graph's vectors from the saved file's live labels; the vectors the log holds past the
    saved file's watermark are the pending ones, which the next open replays (a server saves
    its graph when it closes a tenant). No tenant directory: an empty tenant.

    The server calls it for a tenant it has not open and keeps closed meanwhile; another
    process (the CLI) may call it while a server has the tenant open (LMDB readers in several
    processes are safe), with is_open=None: it cannot tell.
    """
    try:
        with read_only(root / files.LOG) as r:
            saved = r.meta_int(layout.VECTOR_SEQ) or 0
            pending = sum(
                1
                for _seq, op, event_id in r.ops_after(saved)
                if op in (layout.OP_APPEND, layout.OP_EMBED) and _has_vector(r, event_id)
            )
            return usage_of(
                r,
                root,
                is_open=is_open,
                graph=_saved_vectors(root / files.VECTORS),
                pending=pending,
                dim=r.meta_int(layout.DIM),
            )
    except FileNotFoundError:
        return TenantUsage(
            open=is_open,
            events=EMPTY_COUNTS,
            bytes=disk_bytes(root, 0),
            vectors=VectorCounts(graph=0, pending=0),
            vector_space=VectorSpace(dim=None, model=None),
            last_write=None,
        )


def _has_vector(r: LogReader, event_id: str) -> bool:
    """Whether the event is live and carries an embedding."""
    ev = r.get(event_id)
    return ev is not None and ev.embedding is not None


def _saved_vectors(path: Path) -> int:
    """The live vectors of a saved graph: its live-label sidecar's length (0 if unreadable:
    the next open rebuilds the graph from the log)."""
    try:
        live = read_live(live_path(path))
    except VectorFileError:
        return 0
    return 0 if live is None else len(live)

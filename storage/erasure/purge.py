"""Purge: rewrite a tenant's files so the bytes of its deleted events leave the disk.

Phase 1 runs beside the tenant's traffic: a logical copy of the log at a snapshot into
`purge.new/`, a keyword index rebuilt from the records on the way, and a copy of the saved
vector file with the purged vectors erased in it (in memory, a delete already replaced its
vector with noise). Phase 2 runs on the tenant's writer thread, so no write interleaves: it
brings the copy and the new keyword index up to the live log, commits by one rename and swaps
the files in. Reads wait only for that swap (the log lock held exclusive while the environment
is reopened). See docs/erasure.md and storage/erasure/swap.py for the on-disk protocol.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol, TypeVar

import lmdb
import msgspec
import numpy as np

from storage import files
from storage.erasure import apart, swap
from storage.erasure.compact import rewrite, sync_delta
from storage.erasure.swap import StepHook, no_step
from storage.fsync import fsync_file, fsync_tree
from storage.index.keyword import (
    KeywordDoc,
    KeywordIndex,
    document,
    indexed,
    keyword_doc,
    open_tantivy,
)
from storage.index.vecfile import (
    VectorFileError,
    count_labels,
    erase_labels,
    live_path,
    read_live,
    write_live,
)
from storage.index.vectors import VectorIndex
from storage.log import layout
from storage.log.eventlog import EventLog
from storage.log.reader import LogReader
from storage.model import FilterValue

log = logging.getLogger("memspine.purge")
T = TypeVar("T")

REBUILD_HEAP_BYTES = 64_000_000
REBUILD_THREADS = 1  # two were slower on 2 cores: documents are made in Python meanwhile


class PurgeStats(msgspec.Struct, frozen=True, kw_only=True):
    """What one purge did and what it cost; ids and numbers only."""

    purged: int  # deleted events whose bytes left the disk
    seconds: float = 0.0  # the whole purge
    writes_paused: float = 0.0  # the final step on the writer thread (appends queue meanwhile)
    reads_paused: float = 0.0  # the swap under the log lock (every read waits meanwhile)
    pending: int = 0  # events deleted during the purge, left for the next one


class NoRoomToPurge(OSError):
    """The disk lacks the free space a purge needs for one more copy of the tenant's files."""

    def __init__(self, needed: int, free: int) -> None:
        super().__init__(
            errno.ENOSPC, f"a purge needs about {needed} bytes of free disk, {free} are free"
        )
        self.needed = needed
        self.free = free


class Purgeable(Protocol):
    """What a purge reads and changes of a tenant (storage/tenants/tenant.py's Tenant)."""

    tenant_id: str
    root: Path
    dim: int
    log: EventLog
    keyword: KeywordIndex
    keyword_seq: int
    vectors: VectorIndex
    ledger_days: float  # erasure ledger entries older than this go with the purge

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run fn on the tenant's writer thread, between group commits."""
        ...

    def catch_up(self) -> None:
        """Apply every log operation past each index's watermark."""
        ...

    def save_vectors(self) -> None:
        """Persist the vector index and record the seq it covers."""
        ...

    def swap_keyword(self, index: KeywordIndex) -> None:
        """Put a new keyword index in place of the current one."""
        ...


class PurgeGate:
    """One tenant's purges: one at a time, and a caller that asked while one ran shares the
    next one to finish (it began after the caller asked, so it covers the caller's deletes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._covered_from = float("-inf")  # when the last finished purge took its snapshot

    def run(self, tenant: Purgeable, step: StepHook = no_step) -> PurgeStats:
        """Purge every event of the tenant deleted before this call."""
        asked = time.monotonic()
        with self._lock:
            if self._covered_from > asked:
                return PurgeStats(purged=0)  # a purge that began after we asked has just finished
            began = time.monotonic()
            stats = _purge(tenant, step)
            self._covered_from = began
        _log_stats(tenant.tenant_id, stats)
        return stats


def _log_stats(tenant_id: str, stats: PurgeStats) -> None:
    """One line for a purge that erased something."""
    if stats.purged:
        log.info(
            "tenant %s: purged %d deleted events in %.2f s (writes paused %.3f s, reads %.3f s)",
            tenant_id,
            stats.purged,
            stats.seconds,
            stats.writes_paused,
            stats.reads_paused,
        )


def _purge(tenant: Purgeable, step: StepHook) -> PurgeStats:
    """Both phases, the swap and the removal of the old generation."""
    started = time.perf_counter()
    root = tenant.root
    swap.remove(root / swap.STAGING)  # a stage left by a purge that failed in this process
    copy: EventLog | None = None
    keyword: KeywordIndex | None = None
    building: _KeywordBuilder | _KeywordBuilt | None = None
    try:
        snapshot = _copy_log(tenant, step)
        if snapshot is None:
            tenant.call(lambda: _forget_marker_if_clean(tenant)).result()
            return PurgeStats(purged=0)
        since, doomed, building = snapshot
        on_writer = lambda: tenant.call(tenant.save_vectors).result()  # noqa: E731
        vectors = _stage_vectors(tenant, root / swap.STAGING, set(doomed.values()), on_writer)
        step("vectors")
        keyword, building = building.finish(), None
        step("indexed")
        copy = EventLog.open(root / swap.STAGING / files.LOG, embedding_dim=tenant.dim)
        stage = (copy, keyword)
        final = tenant.call(lambda: _final(tenant, *stage, since, doomed, vectors, step))
        stats: PurgeStats = final.result()
    except BaseException:
        if building is not None:
            building.abandon()
        _abandon(copy, keyword, root)
        raise
    swap.discard_old(root)
    step("cleaned")
    return msgspec.structs.replace(stats, seconds=time.perf_counter() - started)


def _copy_log(
    tenant: Purgeable, step: StepHook
) -> tuple[int, dict[str, int], _KeywordBuilder | _KeywordBuilt] | None:
    """Copy the log at a snapshot into the stage, feeding a new keyword index on the way; the
    snapshot's last op, its tombstones (id -> vector label) and the index being built, or None
    when nothing awaits a purge. A large log is copied by a child process (apart.py)."""
    tenant.log.grow_if_over_half()  # the copy holds a reader for seconds
    keyword: _KeywordBuilder | None = None
    staging = tenant.root / swap.STAGING
    try:
        with tenant.log.reader() as r:
            doomed = _doomed(r)
            if not doomed:
                return None
            _check_room(tenant, r)
            away = apart.worth_it(r)
            if not away:
                since = r.last_seq()
                staging.mkdir()
                step("stage")
                keyword = _KeywordBuilder(staging / files.KEYWORD)
                taps = {"records": keyword.add}
                rewrite(r, staging / files.LOG, tenant.log.map_size(), taps)
        if away:
            staging.mkdir()
            step("stage")
            # The child's own snapshot (no earlier than the one above) is the one copied.
            got = apart.run(
                "copy",
                log=str(tenant.log.path),
                dest=str(staging),
                map_size=tenant.log.map_size(),
            )
            step("copied")
            return got["since"], got["doomed"], _KeywordBuilt(staging / files.KEYWORD)
        step("copied")
    except BaseException:
        if keyword is not None:
            keyword.abandon()
        # A child that died mid-copy leaves its reader's slot in the log's lock file, which
        # would keep the pages of its snapshot from reuse until the log is next opened.
        with contextlib.suppress(Exception), tenant.log.environment() as env:
            env.reader_check()
        raise
    assert keyword is not None
    return since, doomed, keyword


def copy_apart(log: str, dest: str, map_size: int) -> dict[str, Any]:
    """In a child process (apart.py): what _copy_log does on the thread for a small log, the
    keyword index committed; the snapshot's last op and its tombstones."""
    with apart.reading(Path(log)) as r:
        since, doomed = r.last_seq(), _doomed(r)
        keyword = _KeywordBuilder(Path(dest) / files.KEYWORD)
        try:
            rewrite(r, Path(dest) / files.LOG, map_size, {"records": keyword.add})
            keyword.commit()
        except BaseException:
            keyword.abandon()
            raise
    return {"since": since, "doomed": doomed}


def _doomed(r: LogReader) -> dict[str, int]:
    """The snapshot's tombstones: deleted id -> its vector label."""
    return {e: t.seq for e in r.tombstone_ids() if (t := r.tombstone(e)) is not None}


def _check_room(tenant: Purgeable, r: LogReader) -> None:
    """Refuse before writing anything when the disk cannot hold the new generation: a purge that
    filled it would fail half-way and make every other write on it fail meanwhile."""
    pages, psize = r.pages()
    needed = (pages + _LMDB_SPARE_PAGES) * psize + files.tree_bytes(tenant.root / files.KEYWORD)
    with contextlib.suppress(FileNotFoundError):
        needed += tenant.vectors.path.stat().st_size  # the copy made if it holds a purged vector
    free = shutil.disk_usage(tenant.root).free
    if free < needed:
        raise NoRoomToPurge(needed, free)


def check_room(tenant: Purgeable) -> None:
    """NoRoomToPurge when the disk cannot hold a purge of the tenant now (asked before an
    erasure deletes anything, so that it is not left half-done)."""
    with tenant.log.reader() as r:
        _check_room(tenant, r)


_LMDB_SPARE_PAGES = 64  # meta and root pages and the free list of the new environment


class _Indexed(msgspec.Struct):
    """The fields of a stored event the keyword index needs; decoding skips the rest (the
    embedding's floats would cost more than the indexing)."""

    event_id: str
    seq: int
    kind: str
    text: str | None = None
    properties_raw: bytes | None = None
    filterable: dict[str, FilterValue] = {}
    subjects: list[str] = []


_decode_indexed = msgspec.msgpack.Decoder(_Indexed).decode


class _KeywordBuilder:
    """A new keyword index fed the live records of the copy while it is made.

    It has a writer of its own (more memory than the tenant's, and no delete per document as
    KeywordIndex.add needs for replays) and makes the documents KeywordIndex.add makes; Tantivy
    indexes on its own thread while the copy goes on.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        KeywordIndex.open(path).close()  # an empty index with the keyword schema
        self.writer = open_tantivy(path).writer(
            heap_size=REBUILD_HEAP_BYTES, num_threads=REBUILD_THREADS
        )

    def add(self, raw: bytes) -> None:
        """Index one stored record."""
        ev = _decode_indexed(raw)
        if indexed(ev.text, ev.properties_raw):
            doc = KeywordDoc(
                ev.event_id,
                ev.kind,
                ev.text or "",
                ev.filterable,
                ev.seq,
                ev.subjects,
                ev.properties_raw,
            )
            self.writer.add_document(document(doc))  # a new index: its documents carry the seq

    def commit(self) -> None:
        """Commit every document added and let the writer go."""
        self.writer.commit()
        self.writer.wait_merging_threads()

    def finish(self) -> KeywordIndex:
        """Commit and hand the index over as a KeywordIndex."""
        self.commit()
        return KeywordIndex.open(self.path)

    def abandon(self) -> None:
        """Release the writer (its lock) without committing; a failure here changes nothing."""
        with contextlib.suppress(Exception):
            self.writer.rollback()
            self.writer.wait_merging_threads()


class _KeywordBuilt:
    """The keyword index a child process built and committed (copy_apart)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def finish(self) -> KeywordIndex:
        """Hand the index over as a KeywordIndex."""
        return KeywordIndex.open(self.path)

    def abandon(self) -> None:
        """Nothing to release: the child's writer is gone with it."""


def _final(
    tenant: Purgeable,
    copy: EventLog,
    keyword: KeywordIndex,
    since: int,
    doomed: dict[str, int],
    vectors: _VectorStage,
    step: StepHook,
) -> PurgeStats:
    """On the writer thread: catch the copy up, commit and swap."""
    paused = time.perf_counter()
    staging = tenant.root / swap.STAGING
    if _signature(tenant.vectors.path) != vectors.signature:
        # Saved since it was staged: the log's watermark now describes the new file; stage that.
        for name in (files.VECTORS, files.VECTORS_LIVE):
            swap.remove(staging / name)
        _stage_vectors(tenant, staging, set(doomed.values()), tenant.save_vectors)
    purged, pending = _catch_up_copy(tenant, copy, keyword, since, doomed)
    step("synced")
    copy.close()
    fsync_tree(staging)
    step("fsynced")
    swap.commit(tenant.root)
    step("committed")
    reads_paused = _swap_in(tenant, step)
    if not pending:
        swap.clear_pending(tenant.root)
    return PurgeStats(
        purged=len(purged),
        writes_paused=time.perf_counter() - paused,
        reads_paused=reads_paused,
        pending=pending,
    )


def _catch_up_copy(
    tenant: Purgeable,
    copy: EventLog,
    keyword: KeywordIndex,
    since: int,
    doomed: dict[str, int],
) -> tuple[list[str], int]:
    """Bring the copy and its keyword index up to the live log, and drop the purged tombstones.

    Returns the ids purged and how many tombstones remain (deleted while the purge ran).
    """
    tenant.catch_up()  # a no-op unless a batch failed half-way: the projections must be current
    # In memory the deletes replaced the doomed vectors already; this catches one the background
    # inserter put back into the graph meanwhile (on this thread no delete interleaves).
    tenant.vectors.delete(sorted(doomed.values()))
    with tenant.log.reader() as live:
        upto = live.last_seq()
        changed = copy.write(lambda txn: sync_delta(live, copy.view(txn), since))
        _catch_up_keyword(keyword, live, since)
    # An id deleted, then written and deleted again since the snapshot keeps its new tombstone.
    purged = [e for e in doomed if e not in changed]

    ledger_since = time.time_ns() // 1000 - int(tenant.ledger_days * 86_400 * 1_000_000)

    def seal(txn: lmdb.Transaction) -> int:
        copy.clear_tombstones(txn, purged)
        copy.prune_erased(txn, ledger_since)
        copy.put_meta_int(txn, layout.KEYWORD_SEQ, upto)
        return copy.view(txn).tombstone_count()

    pending = copy.write(seal)
    keyword.commit()
    keyword.close()
    return purged, pending


def _catch_up_keyword(keyword: KeywordIndex, live: LogReader, since: int) -> None:
    """Apply to the rebuilt keyword index the appends and deletes made since the snapshot."""
    docs: list[KeywordDoc] = []
    gone: list[str] = []
    for _seq, op, event_id in live.ops_after(since):
        if op == b"D":
            gone.append(event_id)
            continue
        ev = live.get_light(event_id)
        if ev is not None and indexed(ev.text, ev.properties_raw):
            docs.append(keyword_doc(ev))
    keyword.add(docs)
    keyword.delete(gone)


class _VectorStage(msgspec.Struct, frozen=True):
    """Which saved vector file the stage answers for (the log's watermark describes it)."""

    signature: tuple[int, int, int] | None  # inode, mtime, size; None: there was none


def _signature(path: Path) -> tuple[int, int, int] | None:
    """What tells one saved file from the next; None if there is none."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _stage_vectors(
    tenant: Purgeable, dest: Path, doomed_labels: set[int], save: Callable[[], object]
) -> _VectorStage:
    """Put in dest the tenant's saved vector file with the doomed vectors erased, if it has any.

    In memory a delete already replaced its vector with noise. The saved file is copied (no GIL
    held) and the doomed records in the copy overwritten and marked; a file holding none of them
    is left as it is. A file this code cannot read is replaced by `save`, which saves the
    in-memory index on the writer thread (where the log's watermark is kept in step).
    """
    vectors = tenant.vectors
    source = vectors.path
    signature = _signature(source)
    if signature is None:
        return _VectorStage(signature=None)  # never saved: no vector of this tenant is on disk
    target, sidecar = dest / source.name, live_path(source)
    try:
        if not count_labels(source, doomed_labels, vectors.dim):
            return _VectorStage(signature=signature)  # the file holds none: it stays
        shutil.copyfile(source, target)
        erase_labels(target, doomed_labels, vectors.dim)
        keep = _live_without(sidecar, doomed_labels)
    except VectorFileError as exc:
        # Either can only be saved anew: left alone, every later purge would fail on it too.
        log.warning("tenant %s: %s; saving the vector index anew", tenant.tenant_id, exc)
        target.unlink(missing_ok=True)
        save()
        return _VectorStage(signature=_signature(source))
    if keep is not None:
        with open(dest / sidecar.name, "wb") as fh:
            write_live(fh, keep)
        fsync_file(dest / sidecar.name)
    fsync_file(target)
    return _VectorStage(signature=signature)


def _live_without(sidecar: Path, doomed_labels: set[int]) -> np.ndarray | None:
    """The saved live labels less the doomed ones; None if there is no sidecar."""
    live = read_live(sidecar)
    if live is None:
        return None
    keep: np.ndarray = live[~np.isin(live, np.fromiter(doomed_labels, dtype=np.uint64))]
    return keep


def _swap_in(tenant: Purgeable, step: StepHook) -> float:
    """Move the committed files into place and reopen the log and keyword index on them."""
    tenant.keyword.close()  # release its writer's lock; searches on it still work until the swap
    started = time.perf_counter()
    root = tenant.root
    # Reads wait for the log here, so none sees the new log with the old keyword index.
    with tenant.log.files_replaced():
        try:
            swap.roll_forward(root, step)
        except BaseException:
            _finish_swap(root)
            raise
        finally:
            if (root / files.LOG).is_dir():
                index = KeywordIndex.open(root / files.KEYWORD, committed_seq=tenant.keyword_seq)
                tenant.swap_keyword(index)
    return time.perf_counter() - started


def _finish_swap(root: Path) -> None:
    """The commit stands once made: finish moving the files in if the disk lets us."""
    try:
        swap.roll_forward(root)
    except Exception:
        log.exception("finishing a committed purge failed; the tenant's next open finishes it")


def _abandon(copy: EventLog | None, keyword: KeywordIndex | None, root: Path) -> None:
    """After a failure: delete the stage (before the commit, the old files stay in place) or
    the old generation (after it)."""
    for store in (keyword, copy):
        try:
            if store is not None:
                store.close()
        except Exception:  # closed already by the step that failed later
            pass
    swap.remove(root / swap.STAGING)
    if not (root / swap.READY).exists():
        swap.discard_old(root)


def _forget_marker_if_clean(tenant: Purgeable) -> None:
    """On the writer thread, where no delete can slip between the check and the removal."""
    if not tenant.log.tombstones():
        swap.clear_pending(tenant.root)

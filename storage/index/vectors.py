"""The vector index: an hnswlib (cosine) projection of the log, labelled by each event's seq.

New vectors land in an in-memory tail that searches scan exactly, and the shared background
pool (storage/index/background.py) moves them into the HNSW graph; so an append is acknowledged
without paying for a graph insert, and it is still recallable the moment its response is sent.

A small index has no graph at all: up to EXACT_BELOW vectors it is its tail, searched exactly,
and the graph (hnswlib's fixed tables alone are 2.6 MB) is built in the background only once it
grows past that. A graph, once built, stays while the index is open, however it shrinks.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path
from typing import BinaryIO

import hnswlib
import numpy as np

from storage import failpoints
from storage.fsync import replace_durably
from storage.index.background import Task, shared_pool
from storage.index.flat import (
    Allowed,
    FlatSet,
    as_float32,
    top,
    unit,
    use_one_blas_thread,
)
from storage.index.vecfile import (
    VectorFileError,
    check_links,
    check_saved,
    erase_labels,
    live_path,
    map_vectors,
    peek,
    read_live,
    record_bytes,
    write_flat,
    write_live,
)
from storage.rwlock import RWLock

log = logging.getLogger("memspine.vectors")

INITIAL_CAPACITY = 1024
M = 16
# 100, not 200: about half the insert CPU, which the background inserter takes from the cores
# that serve requests, for a small loss of recall against exact search (bench/RESULTS.md,
# "Appends").
EF_CONSTRUCTION = 100
MIN_EF = 64
INSERT_BATCH = 256
# Up to this many live vectors there is no graph, or the graph is searched exactly from a copy
# of its unit rows (3 MB at 384 dimensions): as fast as the graph, and it never misses.
EXACT_BELOW = 2048
# The tail absorbs bursts faster than the graph takes them; past this many vectors (15 MB at 384
# dimensions, and an exact scan of them in every search) an append waits for the inserter:
# sustained overload is throttled to the insert rate instead of growing memory and search time
# without bound.
MAX_TAIL = 10_000
# What hnswlib 0.8 holds in memory (hnswalg.h), for memory_bytes. A fixed table of 65,536
# std::mutex (label_op_locks_, 40 bytes each) per index, however small.
HNSW_FIXED_BYTES = 65_536 * 40
# Per slot of capacity: its link-list mutex, level, upper-links pointer and visited-list entry.
HNSW_SLOT_BYTES = 40 + 4 + 8 + 2
# Per element beyond its level-0 record: its label_lookup_ node and bucket, and the upper-level
# links that one element in M has.
HNSW_ELEMENT_BYTES = 50
# Per live label: its slot in the live set and its int object, with the share of the load's
# temporaries the allocator keeps (calibrated against RSS growth, bench/RESULTS.md).
LIVE_LABEL_BYTES = 150
# Per vector of an index without a graph, beyond its unit row: its label, live flag and entry in
# the tail's map (a reopened index holds its rows in arrays of their exact size, or mapped from
# its file: then the rows themselves are page cache, not counted).
FLAT_ROW_OVERHEAD = 12 + 100


class VectorIndex:
    """Cosine nearest-neighbour search with deletions, growth, a background insert tail and atomic saves."""

    def __init__(
        self,
        path: Path,
        dim: int,
        index: hnswlib.Index | None = None,
        live: set[int] | None = None,
        small: FlatSet | None = None,
        tail: FlatSet | None = None,
        *,
        saved: bool = False,
    ) -> None:
        self.path = path
        self.dim = dim
        # The graph (None until the index first grows past EXACT_BELOW) and its live labels, in
        # the graph and not deleted; with saved, a graph saved at path, loaded at first use.
        self._index = index
        self._live: set[int] = live if live is not None else set()
        self._deferred = saved
        self._load_lock = threading.Lock()
        self.lock = RWLock()  # shared: search, insert; exclusive: resize, making the graph
        self._small = small  # the graph's rows while it holds at most EXACT_BELOW, else None
        # Labels acknowledged but not yet in the graph; with no graph, every label.
        self._tail = tail if tail is not None else FlatSet(dim)
        self._tail_cond = threading.Condition()
        # Guarded by _tail_cond: the labels the inserter is moving into the graph, and those of
        # them deleted or replaced meanwhile (the graph copy is stale: searches skip it, and the
        # inserter hides it instead of making it live).
        self._moving: set[int] = set()
        self._cancelled: set[int] = set()
        self._mark_lock = threading.Lock()
        # Labels hidden in the graph whose vectors its memory still holds: every save overwrites
        # them with noise in the file it writes (_save_index). Overwriting them in memory is an
        # hnswlib update of each one (about 10 ms apiece: an erasure of 1,000 events spent longer
        # on it than on its purge, bench/RESULTS.md "Erasure by subject").
        self._unerased: set[int] = set()
        self._stopping = False  # closing, or the inserts failed: the tail keeps what is left
        self._task: Task | None = None  # the graph inserts' slot in the pool, once there is a graph
        if index is not None:
            self._task = shared_pool().task(self._drain, f"vectors {path.parent.name}")

    @classmethod
    def open(cls, path: Path, dim: int) -> VectorIndex:
        """Load the index saved at path, or start an empty one; raises ValueError if it is damaged."""
        use_one_blas_thread()  # exact scans are small products: see flat.use_one_blas_thread
        if not path.exists():
            return cls(path, dim)
        flat = _open_flat(path, dim)
        if flat is not None:
            return cls(path, dim, tail=flat)
        # A large graph is loaded at its first use, not here: hnswlib's load copies the whole
        # file and holds the GIL meanwhile (1.5 ms a thousand vectors: 1.5 s at a million), and
        # a tenant opened to read or list events never needs it. What the load checks is
        # checked here, so a damaged file is still rebuilt from the log.
        if check_links(path, dim) > EXACT_BELOW:
            return cls(path, dim, saved=True)
        index, live = _load_graph(path, dim)
        if len(live) <= EXACT_BELOW:  # no sidecar said how many: small after all
            del index
            return cls(path, dim, tail=_rows_of(path, dim, live))
        return cls(path, dim, index, live)

    @property
    def index(self) -> hnswlib.Index | None:
        """The graph (None while there is none), a saved one loaded first if it is not yet."""
        if self._deferred:
            self._load()
        return self._index

    @index.setter
    def index(self, index: hnswlib.Index | None) -> None:
        self._index = index

    @property
    def live(self) -> set[int]:
        """Labels in the graph and not deleted (a saved graph loaded first if it is not yet)."""
        if self._deferred:
            self._load()
        return self._live

    def graph_count(self) -> int:
        """Live vectors in the index: the graph's, or with no graph every exact row; for a saved
        graph not yet loaded, its sidecar's count (0 if unreadable), as a closed tenant's usage
        reads it: counting loads nothing."""
        if not self._deferred:
            with self._tail_cond:  # with no graph, the exact set is the index: all of it counts
                return len(self._live) if self._index is not None else len(self._tail)
        try:
            saved = read_live(live_path(self.path))
        except VectorFileError:
            return 0
        return 0 if saved is None else len(saved)

    def loaded(self) -> bool:
        """Whether no saved graph waits to be loaded (one is loaded at its first use)."""
        return not self._deferred

    def _load(self) -> None:
        """Load the saved graph, once; raises ValueError if it turns out damaged. It stays a
        graph however few labels are live (as a graph does once built)."""
        with self._load_lock:
            if not self._deferred:
                return
            index, live = _load_graph(self.path, self.dim)
            self._index, self._live = index, live
            self._task = shared_pool().task(self._drain, f"vectors {self.path.parent.name}")
            self._deferred = False  # last: readers test it without the lock

    @classmethod
    def create_empty(cls, path: Path, dim: int) -> VectorIndex:
        """A new empty index for path (the file is written on the next save)."""
        path.unlink(missing_ok=True)
        live_path(path).unlink(missing_ok=True)
        return cls.open(path, dim)

    # -- writes ---------------------------------------------------------------

    def add(self, labels: list[int], vectors: list[list[float]]) -> None:
        """Accept vectors: searchable at once (exactly, from the tail), in the graph soon after."""
        if not labels:
            return
        data = np.asarray(vectors, dtype=np.float32)
        with self._tail_cond:
            # Without a graph the tail is the whole index, at most EXACT_BELOW and one batch.
            while len(self._tail) >= MAX_TAIL and self.index is not None and not self._stopping:
                self._tail_cond.wait()
            self._tail.put(labels, data)
            self._cancel_moving(labels)  # a new vector for a label on its way: the old is stale
            self._tail_cond.notify_all()
            grown = self.index is None and len(self._tail) > EXACT_BELOW
        if grown:
            self._make_graph()
        if self._task is not None:
            self._task.wake()

    def _make_graph(self) -> None:
        """Start a graph for an index grown past EXACT_BELOW; the pool fills it from the tail,
        which searches scan exactly until each vector is in the graph."""
        index = hnswlib.Index(space="cosine", dim=self.dim)
        capacity = max(INITIAL_CAPACITY, 2 * len(self._tail))
        index.init_index(max_elements=capacity, M=M, ef_construction=EF_CONSTRUCTION)
        index.set_num_threads(1)
        with self.lock.exclusive():
            self._small = FlatSet(self.dim)
            self.index = index
        self._task = shared_pool().task(self._drain, f"vectors {self.path.parent.name}")

    def _graph(self) -> hnswlib.Index:
        """The graph, where only a graph can be (some label is live, or a save found one)."""
        index = self.index
        assert index is not None
        return index

    def pending(self) -> int:
        """Vectors acknowledged and searchable (exactly, from the tail) but not yet in the graph
        (none while there is no graph: the tail is the index then)."""
        return len(self._tail) if self._index is not None else 0  # deferred: nothing added yet

    def delete(self, labels: list[int]) -> None:
        """Forget labels; a vector already in the graph is marked deleted, and overwritten with
        noise in every file a save writes from then on."""
        with self._tail_cond:
            for label in labels:
                self._tail.pop(label)
            self._cancel_moving(labels)
        with self.lock.shared():
            for label in labels:
                if label in self.live:
                    self._hide(label)

    def _cancel_moving(self, labels: list[int]) -> None:
        """Note labels the inserter is moving as stale (the caller holds _tail_cond)."""
        moving = self._moving
        if moving:
            self._cancelled.update(label for label in labels if label in moving)

    def _hide(self, label: int) -> None:
        """Hide a label's vector from searches; saves write noise in its place (_unerased)."""
        # A delete and the inserter can both get here for one label (it was deleted while its
        # batch moved into the graph): the second finds it hidden already (hnswlib refuses to
        # mark an element twice).
        with self._mark_lock:
            if label not in self._unerased:
                self._graph().mark_deleted(label)
                self._unerased.add(label)
            self.live.discard(label)
        small = self._small
        if small is not None:
            small.pop(label)

    def _drain(self) -> float | None:
        """A pool step: move one batch of tail vectors into the graph, oldest first; 0.0 while
        more are left (the pool runs other tenants' steps in between), None once none are."""
        with self._tail_cond:
            if not self._tail or self._stopping:
                return None
            labels, data = self._take(self._tail.oldest(INSERT_BATCH))
        try:
            self._insert(labels, data)
            self._settle(labels, data)
        except Exception:  # keep serving from the tail rather than die
            log.exception("vector insert failed; vectors stay in the exact tail")
            with self._tail_cond:
                self._moving.clear()
                self._cancelled.clear()
                self._stopping = True
                self._tail_cond.notify_all()
            return None
        return 0.0 if self._tail else None

    def _take(self, labels: list[int]) -> tuple[list[int], np.ndarray]:
        """Mark labels as moving and copy their rows (the caller holds _tail_cond)."""
        self._moving = set(labels)
        self._cancelled = set()
        return labels, self._tail.rows(labels)

    def _insert(self, labels: list[int], data: np.ndarray) -> None:
        """Insert into the graph, growing it first when full (not yet live: _settle makes them so)."""
        index = self.index
        assert index is not None  # only a graph has inserts
        needed = index.element_count + len(labels)
        if needed > index.get_max_elements():
            with self.lock.exclusive():
                index.resize_index(max(needed, 2 * index.get_max_elements()))
        with self.lock.shared():
            with self._mark_lock:  # a replaced vector: the label's bytes are the new one's now
                self._unerased.difference_update(labels)
            index.add_items(data, np.asarray(labels, dtype=np.uint64), num_threads=1)

    def _settle(self, labels: list[int], data: np.ndarray) -> None:
        """Make inserted labels live and drop them from the tail, in one step against deletes;
        one deleted or replaced while it moved is hidden in the graph instead."""
        # One step under _tail_cond: a delete pops the tail under it too, so it lands either
        # before (the label is cancelled here) or after (it finds the label live and hides it);
        # no search sees a deleted vector live in between.
        with self._tail_cond, self.lock.shared():
            cancelled = self._cancelled
            keep = [i for i, label in enumerate(labels) if label not in cancelled]
            for label in cancelled:
                self._hide(label)  # the tail keeps a replacement, if any
            kept = [labels[i] for i in keep]
            # Searches read the tail without this lock, then the graph: each label is in the
            # graph's exact rows and live before it leaves the tail.
            small = self._small
            if small is not None and len(small) + len(kept) > EXACT_BELOW:
                self._small = None  # large now: the graph answers from here on
            elif small is not None and kept:
                small.put(kept, data[keep])
            self.live.update(kept)
            for label in kept:
                self._tail.pop(label)
            self._moving = set()
            self._cancelled = set()
            self._tail_cond.notify_all()

    def flush(self) -> None:
        """Wait until every accepted vector is in the graph (at once without a graph: the tail
        is the index then)."""
        task = self._task
        if self._deferred or self.index is None or task is None:
            return  # deferred: every add loads the graph first, so nothing waits
        task.wake()
        with self._tail_cond:
            while self._tail and not self._stopping:
                self._tail_cond.wait(timeout=0.5)
        if self._tail:  # the inserts stopped on an error (or close stopped them): insert here
            with self._tail_cond:
                labels, data = self._take(sorted(self._tail.labels()))
            self._insert(labels, data)
            self._settle(labels, data)

    def close(self) -> None:
        """Finish pending inserts and leave the pool."""
        self.flush()
        with self._tail_cond:
            self._stopping = True
            self._tail_cond.notify_all()
        if self._task is not None:
            self._task.cancel()
            self._task = None  # the task's step refers back here: no cycle outlives the close

    # -- reads ----------------------------------------------------------------

    def search(
        self, vector: list[float] | np.ndarray, k: int, allowed: Allowed | None = None
    ) -> list[tuple[int, float]]:
        """(label, cosine similarity) best first among allowed labels; up to k of them."""
        if k <= 0:
            return []
        query = unit(as_float32(vector))
        # The tail before the graph: a vector leaves the tail only once it is in the graph, so
        # searching in this order cannot miss one that moves in between.
        best = dict(self._tail.search(query, k, allowed)) if self._tail else {}
        for label, sim in self._graph_search(query, k, allowed):
            best[label] = max(sim, best.get(label, -2.0))
        ranked = sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))
        return ranked[:k]

    def _graph_search(
        self, query: np.ndarray, k: int, allowed: Allowed | None
    ) -> list[tuple[int, float]]:
        """Search the HNSW graph, or scan it exactly when it is small or the filter starves it."""
        with self.lock.shared():
            live = len(self.live)
            if not live:
                return []
            small = self._small
            if small is not None and live <= EXACT_BELOW:
                members = self.live

                def wanted(label: int) -> bool:
                    return label in members and (allowed is None or allowed(label))

                return small.search(query, k, wanted)
            if k >= live:
                # Everything is asked for. A batch moving from the tail may already be in the
                # graph and not yet counted live; knn_query(k=live) would then return those
                # (found in the tail too) in place of others, and the caller would miss some.
                return self._exact(query, k, allowed)
            # Labels deleted while the inserter moves them are in the graph until it hides them:
            # ask for as many more and leave them out.
            stale = self._cancelled
            fetch = k + len(stale)
            self._graph().set_ef(max(MIN_EF, 2 * fetch))
            try:
                labels, dists = self._graph().knn_query(
                    query[None, :], k=fetch, num_threads=1, filter=allowed
                )
            except RuntimeError:
                # Fewer than k allowed vectors were reachable: fall back to an exact scan.
                return self._exact(query, k, allowed)
        # tolist: Python ints and floats in one call each, not a numpy scalar per element
        found = zip(labels[0].tolist(), dists[0].tolist(), strict=True)
        if stale:
            return [(lb, 1.0 - d) for lb, d in found if lb not in stale][:k]
        return [(lb, 1.0 - d) for lb, d in found]

    def _exact(self, query: np.ndarray, k: int, allowed: Allowed | None) -> list[tuple[int, float]]:
        """Exact cosine over every live, allowed label in the graph."""
        labels = sorted(lb for lb in list(self.live) if allowed is None or allowed(lb))
        rows: list[np.ndarray] = []
        kept: list[int] = []
        for lo in range(0, len(labels), 1024):
            chunk = labels[lo : lo + 1024]
            try:
                rows.append(np.asarray(self._graph().get_items(chunk, return_type="numpy")))
                kept += chunk
            except RuntimeError:  # one was deleted meanwhile: take the rest one by one
                for label in chunk:
                    with contextlib.suppress(RuntimeError):
                        rows.append(
                            np.asarray(self._graph().get_items([label], return_type="numpy"))
                        )
                        kept.append(label)
        if not kept:
            return []
        data = unit(np.concatenate(rows).reshape(-1, self.dim))
        return top(np.asarray(kept, dtype=np.int64), data @ query, k)

    def memory_bytes(self) -> tuple[int, int]:
        """Estimated resident bytes of the graph (with the live set) and of the exact sets."""
        # From counters: no walk, no lock. Level-0 records count per element, not per slot of
        # capacity: hnswlib mallocs the whole block, but only records written to are resident.
        small = self._small
        exact = self._tail.nbytes() + (small.nbytes() if small is not None else 0)
        if self._deferred:  # not loaded yet: counted as what it will hold, for the budget
            return file_memory_bytes(self.path, self.dim), exact
        index = self._index
        if index is None:
            return 0, exact
        record = record_bytes(index.M, self.dim)
        graph = (
            HNSW_FIXED_BYTES
            + index.get_max_elements() * HNSW_SLOT_BYTES
            + index.element_count * (record + HNSW_ELEMENT_BYTES)
            + len(self.live) * LIVE_LABEL_BYTES
        )
        return graph, exact

    def count(self) -> int:
        """Number of live vectors, inserted or still in the tail."""
        with self._tail_cond:
            return len(self.live) + len(self._tail)

    # -- persistence ----------------------------------------------------------

    def save(self) -> None:
        """Insert the tail, then write the live-label list and the index, each by temp file, fsync and rename."""
        if self._deferred:  # the file is what is saved: nothing changed (a change loads it)
            return
        self.flush()
        if self.index is None:  # made only by add, which runs on the caller's thread too
            self._save_flat()
            return
        with self.lock.exclusive():
            replace_durably(live_path(self.path), lambda fh: write_live(fh, self.live))
            replace_durably(self.path, None, save=self._save_index)

    def _save_flat(self) -> None:
        """Save an index without a graph: its tail's rows, in hnswlib's layout without links."""
        with self._tail_cond:
            labels = np.asarray(self._tail.labels(), dtype=np.int64)
            rows = self._tail.rows(labels.tolist()) if len(labels) else np.zeros((0, self.dim))

        def write(fh: BinaryIO) -> None:
            write_flat(fh, labels, rows, M, EF_CONSTRUCTION)
            failpoints.hit("vectors.save")

        replace_durably(live_path(self.path), lambda fh: write_live(fh, labels))
        replace_durably(self.path, write)

    def _save_index(self, name: str) -> None:
        """Hnswlib's save, checked: it does not look at its own writes, and a full disk leaves
        a file cut short that it then refuses to load (the caller holds the lock)."""
        self._graph().save_index(name)
        check_saved(Path(name))
        # Before the file is fsynced and renamed into place: no saved file holds a deleted vector.
        erase_labels(Path(name), self._unerased, self.dim)
        failpoints.hit("vectors.save")


def file_memory_bytes(path: Path, dim: int) -> int:
    """What loading the index saved at path will hold, estimated from its header (the file's
    own dimension, which may not be `dim`, the server's default; that only if it has none)."""
    # Each record, deleted ones too (an upper bound), with its share of memory_bytes' parts.
    try:
        count, record, _vector = peek(path)
    except (OSError, VectorFileError):
        return 0 if not path.exists() else HNSW_FIXED_BYTES + EXACT_BELOW * 4 * dim
    if count <= EXACT_BELOW:  # no graph: the rows stay mapped from the file (vecfile.map_vectors)
        return count * FLAT_ROW_OVERHEAD
    per = record + HNSW_ELEMENT_BYTES + LIVE_LABEL_BYTES + 2 * HNSW_SLOT_BYTES  # capacity: 2x
    return HNSW_FIXED_BYTES + count * per


def _open_flat(path: Path, dim: int) -> FlatSet | None:
    """The rows of a saved index whose sidecar lists at most EXACT_BELOW live labels, read from
    its file with no graph; None when it is larger, or has no readable sidecar to tell."""
    try:
        saved = read_live(live_path(path))
    except VectorFileError:
        return None
    if saved is None or len(saved) > EXACT_BELOW:
        return None
    return _rows_of(path, dim, saved)


def _rows_of(path: Path, dim: int, live: set[int] | np.ndarray) -> FlatSet:
    """The rows of these labels in a saved index (a label not in the file is left out: a
    sidecar newer than its index; the log replays it)."""
    labels, vectors = map_vectors(path, dim)
    if isinstance(live, np.ndarray):  # a sidecar's list: ascending already (write_live)
        wanted = live.astype(np.int64, copy=False)
        same = len(wanted) == len(labels) and np.array_equal(wanted, labels)
    else:
        wanted = np.fromiter(live, dtype=np.int64, count=len(live))
        same = False
    if not same and (
        len(wanted) != len(labels) or not np.array_equal(np.sort(wanted), np.sort(labels))
    ):
        keep = np.isin(labels, wanted)  # deleted records, or a sidecar newer than the file
        labels, vectors = labels[keep], vectors[keep]
    # hnswlib holds one record a label, so labels are distinct; its rows are unit already,
    # and the index's own flat saves are its tail's rows bit for bit. All of them kept: the
    # file's rows stay mapped (page cache), not copied.
    return FlatSet.of(dim, labels, vectors)


def _load_graph(path: Path, dim: int) -> tuple[hnswlib.Index, set[int]]:
    """The graph saved at path and its live labels; raises ValueError if it is damaged."""
    index = hnswlib.Index(space="cosine", dim=dim)
    try:
        index.load_index(str(path), allow_replace_deleted=False)
    except RuntimeError as exc:
        raise ValueError("vector index file is damaged") from exc
    if index.dim != dim:
        raise ValueError("vector index file has another dimension")
    index.set_num_threads(1)
    return index, _load_live(path, index)


def _load_live(path: Path, index: hnswlib.Index) -> set[int]:
    """Live labels from the sidecar, or by probing each label when the sidecar is missing."""
    present = set(index.get_ids_list())
    try:
        saved = read_live(live_path(path))
    except VectorFileError:
        saved = None  # unreadable: probe each label instead
    if saved is not None:
        # A sidecar newer than the index may name labels the index lacks; replay re-adds them.
        return set(saved.tolist()) & present  # tolist: one call, not an int() per label
    live: set[int] = set()
    for label in present:
        try:
            index.get_items([label])
            live.add(int(label))
        except RuntimeError:
            pass  # marked deleted
    return live

"""The vector index: an hnswlib (cosine) projection of the log, labelled by each event's seq.

New vectors land in an in-memory tail that searches scan exactly, and a background thread moves
them into the HNSW graph; so an append is acknowledged without paying for a graph insert, and it
is still recallable the moment its response is sent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

import hnswlib
import numpy as np

from storage import failpoints
from storage.fsync import replace_durably
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
    live_path,
    read_live,
    read_vectors,
    record_bytes,
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
# Up to this many live vectors the graph is searched exactly, from a copy of its unit rows
# (3 MB at 384 dimensions): as fast as the graph, and it never misses.
EXACT_BELOW = 2048
# The tail absorbs bursts faster than the graph takes them; past this many vectors (15 MB at 384
# dimensions, and an exact scan of them in every search) an append waits for the inserter:
# sustained overload is throttled to the insert rate instead of growing memory and search time
# without bound.
MAX_TAIL = 10_000
# Inserting is background work: it runs niced so that, when the cores are busy, the threads that
# answer requests (the event loop, the writer) get the CPU first (Linux sets nice per thread).
INSERT_NICENESS = 10  # added to the process's own
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


class VectorIndex:
    """Cosine nearest-neighbour search with deletions, growth, a background insert tail and atomic saves."""

    def __init__(
        self,
        path: Path,
        dim: int,
        index: hnswlib.Index | None,
        live: set[int],
        small: FlatSet | None,
    ) -> None:
        self.path = path
        self.dim = dim
        # None: the graph saved at path, loaded at first use (see open); then its live labels,
        # those in the graph and not deleted, are in _live.
        self._index = index
        self._live = live
        self._load_lock = threading.Lock()
        self.lock = RWLock()  # shared: search, insert; exclusive: resize
        self._small = small  # the graph's rows while it holds at most EXACT_BELOW, else None
        self._tail = FlatSet(dim)  # labels acknowledged but not yet in the graph
        self._tail_cond = threading.Condition()
        # Guarded by _tail_cond: the labels the inserter is moving into the graph, and those of
        # them deleted or replaced meanwhile (the graph copy is stale: searches skip it, and the
        # inserter hides it instead of making it live).
        self._moving: set[int] = set()
        self._cancelled: set[int] = set()
        self._mark_lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._drain, name="vectors", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, path: Path, dim: int) -> VectorIndex:
        """Load the index saved at path, or start an empty one; raises ValueError if it is damaged."""
        use_one_blas_thread()  # exact scans are small products: see flat.use_one_blas_thread
        if path.exists():
            # A large graph is loaded at its first use, not here: hnswlib's load copies the
            # whole file and holds the GIL meanwhile (1.5 ms a thousand vectors: 1.5 s at a
            # million), and a tenant opened to read or list events never needs it. What the
            # load checks is checked here, so a damaged file is still rebuilt from the log.
            if check_links(path, dim) > EXACT_BELOW:
                return cls(path, dim, None, set(), None)
            index, live, small = _load_saved(path, dim)
            return cls(path, dim, index, live, small)
        index = hnswlib.Index(space="cosine", dim=dim)
        index.init_index(max_elements=INITIAL_CAPACITY, M=M, ef_construction=EF_CONSTRUCTION)
        index.set_num_threads(1)
        return cls(path, dim, index, set(), FlatSet(dim))

    @property
    def index(self) -> hnswlib.Index:
        """The HNSW graph, a saved one loaded first if it is not yet."""
        index = self._index
        return index if index is not None else self._load()

    @property
    def live(self) -> set[int]:
        """Labels in the graph and not deleted (a saved graph loaded first if it is not yet)."""
        if self._index is None:
            self._load()
        return self._live

    def graph_count(self) -> int:
        """Live vectors in the graph; for a saved graph not yet loaded, its sidecar's count
        (0 if unreadable), as a closed tenant's usage reads it: counting loads nothing."""
        if self._index is not None:
            return len(self._live)
        try:
            saved = read_live(live_path(self.path))
        except VectorFileError:
            return 0
        return 0 if saved is None else len(saved)

    def loaded(self) -> bool:
        """Whether the graph is in memory (a saved one is loaded at its first use)."""
        return self._index is not None

    def _load(self) -> hnswlib.Index:
        """Load the saved graph, once; raises ValueError if it turns out damaged."""
        with self._load_lock:
            if self._index is None:
                index, live, small = _load_saved(self.path, self.dim)
                self._live, self._small = live, small
                self._index = index  # last: readers test it without the lock
            return self._index

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
            while len(self._tail) >= MAX_TAIL and not self._stopping:
                self._tail_cond.wait()
            self._tail.put(labels, data)
            self._cancel_moving(labels)  # a new vector for a label on its way: the old is stale
            self._tail_cond.notify_all()

    def pending(self) -> int:
        """Vectors acknowledged and searchable (exactly, from the tail) but not yet in the graph."""
        return len(self._tail)

    def delete(self, labels: list[int]) -> None:
        """Forget labels; a vector already in the graph is overwritten with noise, then marked deleted."""
        with self._tail_cond:
            for label in labels:
                self._tail.pop(label)
            self._cancel_moving(labels)
        with self.lock.shared():
            for label in labels:
                if label in self.live:
                    self._overwrite_and_mark(label)

    def _cancel_moving(self, labels: list[int]) -> None:
        """Note labels the inserter is moving as stale (the caller holds _tail_cond)."""
        moving = self._moving
        if moving:
            self._cancelled.update(label for label in labels if label in moving)

    def _overwrite_and_mark(self, label: int) -> None:
        """Replace the stored vector so its bytes leave the graph, then hide it from searches."""
        noise = np.random.default_rng(label).standard_normal(self.dim).astype(np.float32)
        # A delete and the inserter can both get here for one label (it was deleted while its
        # batch moved into the graph). add_items unmarks a deleted element, so one after the
        # other is harmless; interleaved, the second mark_deleted raises.
        with self._mark_lock:
            self.index.add_items(noise[None, :], np.asarray([label], dtype=np.uint64))
            self.index.mark_deleted(label)
            self.live.discard(label)
        small = self._small
        if small is not None:
            small.pop(label)

    def _drain(self) -> None:
        """Background: move tail vectors into the graph in batches, oldest first."""
        with contextlib.suppress(OSError, AttributeError):  # not Linux: same priority as the rest
            me = threading.get_native_id()
            os.setpriority(
                os.PRIO_PROCESS, me, os.getpriority(os.PRIO_PROCESS, me) + INSERT_NICENESS
            )
        while True:
            with self._tail_cond:
                while not self._tail and not self._stopping:
                    self._tail_cond.wait()
                if not self._tail:
                    return
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
                return

    def _take(self, labels: list[int]) -> tuple[list[int], np.ndarray]:
        """Mark labels as moving and copy their rows (the caller holds _tail_cond)."""
        self._moving = set(labels)
        self._cancelled = set()
        return labels, self._tail.rows(labels)

    def _insert(self, labels: list[int], data: np.ndarray) -> None:
        """Insert into the graph, growing it first when full (not yet live: _settle makes them so)."""
        needed = self.index.element_count + len(labels)
        if needed > self.index.get_max_elements():
            with self.lock.exclusive():
                self.index.resize_index(max(needed, 2 * self.index.get_max_elements()))
        with self.lock.shared():
            self.index.add_items(data, np.asarray(labels, dtype=np.uint64), num_threads=1)

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
                self._overwrite_and_mark(label)  # the tail keeps a replacement, if any
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
        """Wait until every accepted vector is in the graph."""
        with self._tail_cond:
            while self._tail and not self._stopping:
                self._tail_cond.wait(timeout=0.5)
        if self._tail:  # the drainer stopped on an error: insert here
            with self._tail_cond:
                labels, data = self._take(sorted(self._tail.labels()))
            self._insert(labels, data)
            self._settle(labels, data)

    def close(self) -> None:
        """Finish pending inserts and stop the background thread."""
        self.flush()
        with self._tail_cond:
            self._stopping = True
            self._tail_cond.notify_all()
        self._thread.join()

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
            self.index.set_ef(max(MIN_EF, 2 * fetch))
            try:
                labels, dists = self.index.knn_query(
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
                rows.append(np.asarray(self.index.get_items(chunk, return_type="numpy")))
                kept += chunk
            except RuntimeError:  # one was deleted meanwhile: take the rest one by one
                for label in chunk:
                    with contextlib.suppress(RuntimeError):
                        rows.append(np.asarray(self.index.get_items([label], return_type="numpy")))
                        kept.append(label)
        if not kept:
            return []
        data = unit(np.concatenate(rows).reshape(-1, self.dim))
        return top(np.asarray(kept, dtype=np.int64), data @ query, k)

    def memory_bytes(self) -> tuple[int, int]:
        """Estimated resident bytes of the graph (with the live set) and of the exact sets."""
        # From counters: no walk, no lock. Level-0 records count per element, not per slot of
        # capacity: hnswlib mallocs the whole block, but only records written to are resident.
        index = self._index
        if index is None:  # not loaded yet: counted as what it will hold, for the budget
            return file_memory_bytes(self.path, self.dim), self._tail.nbytes()
        record = record_bytes(index.M, self.dim)
        graph = (
            HNSW_FIXED_BYTES
            + index.get_max_elements() * HNSW_SLOT_BYTES
            + index.element_count * (record + HNSW_ELEMENT_BYTES)
            + len(self.live) * LIVE_LABEL_BYTES
        )
        small = self._small
        exact = self._tail.nbytes() + (small.nbytes() if small is not None else 0)
        return graph, exact

    def count(self) -> int:
        """Number of live vectors, inserted or still in the tail."""
        with self._tail_cond:
            return len(self.live) + len(self._tail)

    # -- persistence ----------------------------------------------------------

    def save(self) -> None:
        """Insert the tail, then write the live-label list and the index, each by temp file, fsync and rename."""
        self.flush()
        with self.lock.exclusive():
            replace_durably(live_path(self.path), lambda fh: write_live(fh, self.live))
            replace_durably(self.path, None, save=self._save_index)

    def _save_index(self, name: str) -> None:
        """Hnswlib's save, checked: it does not look at its own writes, and a full disk leaves
        a file cut short that it then refuses to load (the caller holds the lock)."""
        self.index.save_index(name)
        check_saved(Path(name))
        failpoints.hit("vectors.save")


def file_memory_bytes(path: Path, dim: int) -> int:
    """What loading the index saved at path will hold, estimated from the file's size."""
    # As many elements as level-0 records of `dim` fit in the file (an upper bound: the file
    # holds upper links too), each with its share of memory_bytes' parts.
    try:
        size = path.stat().st_size
    except OSError:
        return HNSW_FIXED_BYTES
    record = record_bytes(M, dim)
    count = size // record
    per = record + HNSW_ELEMENT_BYTES + LIVE_LABEL_BYTES + 2 * HNSW_SLOT_BYTES  # capacity: 2x
    if count <= EXACT_BELOW:
        per += 2 * 4 * dim  # the small graph's rows, in an array grown by doubling
    return HNSW_FIXED_BYTES + count * per


def _load_saved(path: Path, dim: int) -> tuple[hnswlib.Index, set[int], FlatSet | None]:
    """The graph saved at path, its live labels, and its rows if it is small; raises ValueError
    if it is damaged."""
    index = hnswlib.Index(space="cosine", dim=dim)
    try:
        index.load_index(str(path), allow_replace_deleted=False)
    except RuntimeError as exc:
        raise ValueError("vector index file is damaged") from exc
    if index.dim != dim:
        raise ValueError("vector index file has another dimension")
    live = _load_live(path, index)
    index.set_num_threads(1)
    return index, live, _small_set(path, dim, live)


def _small_set(path: Path, dim: int, live: set[int]) -> FlatSet | None:
    """The live rows of a saved index that holds at most EXACT_BELOW, read from its file."""
    if len(live) > EXACT_BELOW:
        return None
    labels, vectors = read_vectors(path, dim)
    keep = np.fromiter((int(lb) in live for lb in labels), dtype=bool, count=len(labels))
    small = FlatSet(dim)
    small.put(labels[keep].tolist(), vectors[keep])
    return small


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

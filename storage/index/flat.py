"""Exact cosine search over in-memory vector sets: the vector index's insert tail, and its whole
graph while that is small.

These keep their own unit rows because hnswlib hands vectors back slowly, one call a vector
(bench/RESULTS.md, "Code choices measured"), and `read_vectors` (storage/index/vecfile.py)
takes a saved index's vectors straight from its file for the same reason.
"""

from __future__ import annotations

import array
import ctypes
import sys
import threading
from collections.abc import Callable, Iterable
from itertools import islice

import numpy as np

Allowed = Callable[[int], bool]

_BLAS_SET_THREADS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)
_blas_limited = False


def use_one_blas_thread() -> None:
    """Make numpy's OpenBLAS use one thread (Linux; elsewhere, or for another BLAS, a no-op).

    The products here are small, and OpenBLAS's thread pool spins: on a busy host its threads
    wait for cores the server needs, and a product that takes a fraction of a millisecond on
    one thread takes tens (bench/RESULTS.md, "Recall at 10,000 and 100,000 events" and "Code
    choices measured").
    """
    global _blas_limited
    if _blas_limited:
        return
    _blas_limited = True
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _BLAS_SET_THREADS:
            if hasattr(lib, name):
                getattr(lib, name)(1)
                break


def as_float32(values: list[float] | np.ndarray) -> np.ndarray:
    """One vector as float32; from a list through array.array, which converts in one C loop
    (np.asarray first discovers each element's type)."""
    if isinstance(values, list):
        return np.frombuffer(array.array("f", values), dtype=np.float32)
    return np.asarray(values, dtype=np.float32)


def unit(v: np.ndarray) -> np.ndarray:
    """Rows (or one vector) scaled to length 1; a zero vector stays zero, as hnswlib leaves it."""
    v = np.asarray(v, dtype=np.float32)
    # What np.linalg.norm(v, axis=-1, keepdims=True) computes, bit for bit, without its
    # argument handling; one vector (a query) is divided by a scalar, which is cheaper still.
    if v.ndim == 1:
        norm = np.sqrt(np.add.reduce(v * v))
        return v / norm if norm else v.copy()
    norms = np.sqrt(np.add.reduce(v * v, axis=-1, keepdims=True))
    return np.asarray(v / np.where(norms == 0, 1.0, norms), dtype=np.float32)


def top(
    labels: np.ndarray, sims: np.ndarray, k: int, allowed: Allowed | None = None
) -> list[tuple[int, float]]:
    """Up to k (label, similarity) best first, ties by label; allowed is asked lazily, best first,
    so a filter costs a call per candidate looked at, not per row."""
    n = len(sims)
    window = min(n, max(4 * k, 64))
    while True:
        if window < n:
            threshold = np.partition(sims, n - window)[n - window]
            cand = np.flatnonzero(sims >= threshold)  # ties at the edge all come along
        else:
            cand = np.arange(n)
        order = cand[np.lexsort((labels[cand], -sims[cand]))]
        out: list[tuple[int, float]] = []
        for i in order:
            label = int(labels[i])
            if allowed is None or allowed(label):
                out.append((label, float(sims[i])))
                if len(out) == k:
                    return out
        if len(cand) == n:
            return out
        window = min(n, 4 * window)


class FlatSet:
    """Unit rows by label in one growable array, searched exactly.

    Rows are appended in place (no restacking per change: the insert tail changes with every
    append batch and is searched between them), in arrays grown by a quarter; a removed row is
    zeroed and left dead until dead rows are the majority, then the array is compacted.

    A reopened index's rows may be a read-only view of its saved file, mapped (page cache, not
    the heap: storage/index/vecfile.py's map_vectors): they stay the first rows, read from the
    map, and appends go to the array after them. A mapped row replaced is marked dead there;
    one removed (a delete) moves the live rows into the array and the map goes."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._lock = threading.Lock()
        self._where: dict[int, int] = {}  # label -> row, in the order labels were first put
        self._base = np.zeros((0, dim), dtype=np.float32)  # rows 0..len-1: mapped, read-only
        self._rows = np.zeros((16, dim), dtype=np.float32)  # the rows after those
        self._labels = np.zeros(16, dtype=np.int64)
        self._alive = np.zeros(16, dtype=bool)
        self._used = 0  # rows in use, dead ones included

    @classmethod
    def of(cls, dim: int, labels: np.ndarray, rows: np.ndarray) -> FlatSet:
        """A set holding these unit rows under these distinct labels, as they are (no scaling),
        in arrays of exactly their size: what a saved index reopens with. Read-only float32
        rows (a mapped file) are kept as they are, never copied."""
        flat = cls(dim)
        n = len(labels)
        if n:
            if not rows.flags.writeable and rows.dtype == np.float32 and rows.shape == (n, dim):
                flat._base = rows
                flat._rows = np.zeros((0, dim), dtype=np.float32)
            else:
                flat._rows = np.array(rows, dtype=np.float32, order="C").reshape(n, dim)
            flat._labels = np.array(labels, dtype=np.int64)
            flat._alive = np.ones(n, dtype=bool)
            flat._where = dict(zip(flat._labels.tolist(), range(n), strict=True))
            flat._used = n
        return flat

    def __len__(self) -> int:
        return len(self._where)

    def mapped(self) -> int:
        """How many of the rows are read from a mapped file."""
        return len(self._base)

    def nbytes(self) -> int:
        """Bytes held: the arrays at their capacity and the label map with its keys (mapped rows
        are page cache, not the heap: not counted)."""
        where = self._where
        arrays = self._rows.nbytes + self._labels.nbytes + self._alive.nbytes
        return arrays + sys.getsizeof(where) + 32 * len(where)

    def put(self, labels: Iterable[int], rows: np.ndarray) -> None:
        """Add or replace rows (scaled to unit length here)."""
        scaled_rows = unit(rows.reshape(-1, self.dim))
        with self._lock:
            base = len(self._base)
            for label, row in zip(labels, scaled_rows, strict=True):
                i = self._where.get(int(label))
                if i is not None and i < base:  # a mapped row: dead, and the new one appended
                    self._alive[i] = False
                    i = None
                if i is None:
                    i = self._append_slot(int(label))
                self._rows[i - base] = row

    def _append_slot(self, label: int) -> int:
        """A new row at the end for label, growing the arrays by a quarter (caller holds the lock)."""
        if self._used == len(self._labels):
            # A quarter, not double: a small tenant's rows are most of what it holds open, and
            # one append to a reopened one (its arrays of exact size) would double them.
            grow = max(16, len(self._labels) // 4)
            self._rows = np.concatenate([self._rows, np.zeros((grow, self.dim), np.float32)])
            self._labels = np.concatenate([self._labels, np.zeros(grow, np.int64)])
            self._alive = np.concatenate([self._alive, np.zeros(grow, bool)])
        i = self._used
        self._used += 1
        self._labels[i] = label
        self._alive[i] = True
        self._where[label] = i
        return i

    def _row(self, i: int) -> np.ndarray:
        """Row i, mapped or not (caller holds the lock)."""
        base = len(self._base)
        row: np.ndarray = self._base[i] if i < base else self._rows[i - base]
        return row

    def pop(self, label: int) -> np.ndarray | None:
        """Remove a row and return a copy of it (None if absent); its bytes are zeroed. A mapped
        row's cannot be: the live rows move into the array and the map goes, so no deleted
        vector stays mapped (a purge unlinks the file that held it)."""
        with self._lock:
            i = self._where.pop(label, None)
            if i is None:
                return None
            row: np.ndarray = self._row(i).copy()
            self._alive[i] = False
            if i < len(self._base):
                self._compact(room=max(16, len(self._where) // 4))
            else:
                self._rows[i - len(self._base)] = 0.0
                if self._used > 64 and len(self._where) * 2 < self._used:
                    self._compact()
            return row

    def _compact(self, room: int | None = None) -> None:
        """Keep only live rows, in order, in new arrays with room for as many more (or for
        `room` more); searches may still hold the old ones."""
        keep = np.flatnonzero(self._alive[: self._used])
        size = max(16, len(keep) + (len(keep) if room is None else room))
        rows = np.zeros((size, self.dim), np.float32)
        labels = np.zeros(size, np.int64)
        alive = np.zeros(size, bool)
        rows[: len(keep)] = self._gather(keep)
        labels[: len(keep)] = self._labels[keep]
        alive[: len(keep)] = True
        self._base = np.zeros((0, self.dim), dtype=np.float32)  # the map goes with its last view
        self._rows, self._labels, self._alive, self._used = rows, labels, alive, len(keep)
        self._where = {int(label): i for i, label in enumerate(labels[: len(keep)])}

    def _gather(self, rows: np.ndarray) -> np.ndarray:
        """These rows stacked in a new array, from the map or the array (caller holds the lock)."""
        base = len(self._base)
        if not base:
            picked: np.ndarray = self._rows[rows]
            return picked
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        mapped = rows < base
        out[mapped] = self._base[rows[mapped]]
        out[~mapped] = self._rows[rows[~mapped] - base]
        return out

    def oldest(self, n: int) -> list[int]:
        """Up to n labels, the first put first."""
        with self._lock:
            return list(islice(self._where, n))

    def labels(self) -> list[int]:
        """Every label held."""
        with self._lock:
            return list(self._where)

    def rows(self, labels: list[int]) -> np.ndarray:
        """The unit rows of these labels, stacked."""
        with self._lock:
            where = np.fromiter((self._where[label] for label in labels), np.int64, len(labels))
            return self._gather(where)

    def search(
        self, query: np.ndarray, k: int, allowed: Allowed | None = None
    ) -> list[tuple[int, float]]:
        """Exact top k by cosine similarity to a unit query, among allowed labels."""
        if k <= 0:
            return []
        with self._lock:  # a consistent view; the filter is asked outside, it may read LMDB
            live = np.flatnonzero(self._alive[: self._used])
            if not len(live):
                return []
            labels = self._labels[live]
            base = len(self._base)
            sims = self._rows[: self._used - base] @ query
            if base:
                sims = np.concatenate([self._base @ query, sims])
            sims = sims[live]
        return top(labels, sims, k, allowed)

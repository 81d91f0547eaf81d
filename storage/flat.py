"""Exact cosine search over in-memory vector sets: the vector index's insert tail, and its whole
graph while that is small.

These keep their own unit rows because hnswlib hands vectors back slowly (`get_items` costs about
80 µs a vector, 170 ms for 2,000), and `read_vectors` takes a saved index's vectors straight from
its file for the same reason.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

Allowed = Callable[[int], bool]

# hnswlib's saveIndex header (hnswalg.h, 0.8): offsetLevel0, max_elements, cur_element_count,
# size_data_per_element, label_offset, offsetData (size_t each), maxlevel (int),
# enterpoint_node (uint32), maxM, maxM0, M (size_t), mult (double), ef_construction (size_t);
# then cur_element_count level-0 records of size_data_per_element bytes: links, vector, label.
_HEADER = struct.Struct("<QQQQQQiIQQQdQ")


def unit(v: np.ndarray) -> np.ndarray:
    """Rows (or one vector) scaled to length 1; a zero vector stays zero, as hnswlib leaves it."""
    v = np.asarray(v, dtype=np.float32)
    norms = np.linalg.norm(v, axis=-1, keepdims=True)
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
    """Unit rows by label, searched exactly; the stacked matrix is cached until the next change."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._rows: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        self._stacked: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self._rows)

    def put(self, labels: Iterable[int], rows: np.ndarray) -> None:
        """Add or replace rows (scaled to unit length here)."""
        scaled = unit(rows.reshape(-1, self.dim))
        with self._lock:
            for label, row in zip(labels, scaled, strict=True):
                self._rows[int(label)] = row
            self._stacked = None

    def pop(self, label: int) -> np.ndarray | None:
        """Remove a row and return it (None if absent)."""
        with self._lock:
            row = self._rows.pop(label, None)
            if row is not None:
                self._stacked = None
            return row

    def labels(self) -> list[int]:
        """Every label held."""
        with self._lock:
            return list(self._rows)

    def rows(self, labels: list[int]) -> np.ndarray:
        """The unit rows of these labels, stacked."""
        with self._lock:
            return np.stack([self._rows[label] for label in labels])

    def matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """(labels, unit rows) of everything held, in one array each."""
        with self._lock:
            if self._stacked is None:
                labels = np.fromiter(self._rows, dtype=np.int64, count=len(self._rows))
                rows = (
                    np.stack(list(self._rows.values()))
                    if self._rows
                    else np.zeros((0, self.dim), dtype=np.float32)
                )
                self._stacked = (labels, rows)
            return self._stacked

    def search(
        self, query: np.ndarray, k: int, allowed: Allowed | None = None
    ) -> list[tuple[int, float]]:
        """Exact top k by cosine similarity to a unit query, among allowed labels."""
        labels, rows = self.matrix()
        if not len(labels) or k <= 0:
            return []
        return top(labels, rows @ query, k, allowed)


def read_vectors(path: Path, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(labels, vectors) of every element in a saved hnswlib index (deleted ones included;
    cosine indexes hold unit vectors)."""
    with open(path, "rb") as fh:
        head = fh.read(_HEADER.size)
        if len(head) < _HEADER.size:
            raise ValueError("vector index file is truncated")
        offset0, _cap, count, size, label_at, data_at, *_rest = _HEADER.unpack(head)
        if offset0 != 0 or data_at + 4 * dim > label_at or label_at + 8 > size:
            raise ValueError("vector index file has an unexpected layout")
        raw = np.fromfile(fh, dtype=np.uint8, count=count * size)
    if raw.size != count * size:
        raise ValueError("vector index file is truncated")
    records = raw.reshape(count, size)
    vectors = np.ascontiguousarray(records[:, data_at : data_at + 4 * dim]).view(np.float32)
    labels = np.ascontiguousarray(records[:, label_at : label_at + 8]).view(np.uint64)
    return labels.reshape(-1).astype(np.int64), vectors

"""The vector index: an hnswlib (cosine) projection of the log, labelled by each event's seq."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import hnswlib
import numpy as np

from storage.rwlock import RWLock

INITIAL_CAPACITY = 1024
M = 16
EF_CONSTRUCTION = 200
MIN_EF = 64
# Below this many live vectors an exact scan is as fast as the graph and never misses.
EXACT_BELOW = 2048


class VectorIndex:
    """Cosine nearest-neighbour search with deletions, growth and atomic saves."""

    def __init__(self, path: Path, dim: int, index: hnswlib.Index, live: set[int]) -> None:
        self.path = path
        self.dim = dim
        self.index = index
        self.live = live
        self.lock = RWLock()

    @classmethod
    def open(cls, path: Path, dim: int) -> VectorIndex:
        """Load the index saved at path, or start an empty one; raises ValueError if it is damaged."""
        index = hnswlib.Index(space="cosine", dim=dim)
        if path.exists():
            try:
                index.load_index(str(path), allow_replace_deleted=False)
            except RuntimeError as exc:
                raise ValueError("vector index file is damaged") from exc
            if index.dim != dim:
                raise ValueError("vector index file has another dimension")
            live = _load_live(path, index)
        else:
            index.init_index(max_elements=INITIAL_CAPACITY, M=M, ef_construction=EF_CONSTRUCTION)
            live = set()
        index.set_num_threads(1)
        return cls(path, dim, index, live)

    @classmethod
    def create_empty(cls, path: Path, dim: int) -> VectorIndex:
        """A new empty index for path (the file is written on the next save)."""
        path.unlink(missing_ok=True)
        return cls.open(path, dim)

    def add(self, labels: list[int], vectors: list[list[float]]) -> None:
        """Insert or replace vectors, growing capacity as needed."""
        if not labels:
            return
        data = np.asarray(vectors, dtype=np.float32)
        with self.lock.exclusive():
            needed = self.index.element_count + len(labels)
            if needed > self.index.get_max_elements():
                self.index.resize_index(max(needed, 2 * self.index.get_max_elements()))
            self.index.add_items(data, np.asarray(labels, dtype=np.uint64))
            self.live.update(labels)

    def delete(self, labels: list[int], *, overwrite: bool = True) -> None:
        """Mark labels deleted, first overwriting their vectors so the old bytes leave the graph."""
        with self.lock.exclusive():
            for label in labels:
                if label not in self.live:
                    continue
                if overwrite:
                    noise = np.random.default_rng(label).standard_normal(self.dim)
                    self.index.add_items(noise.astype(np.float32)[None, :], np.asarray([label]))
                self.index.mark_deleted(label)
                self.live.discard(label)

    def search(
        self, vector: list[float], k: int, allowed: Callable[[int], bool] | None = None
    ) -> list[tuple[int, float]]:
        """(label, cosine similarity) best first among allowed labels; up to k of them."""
        query = np.asarray(vector, dtype=np.float32)
        with self.lock.shared():
            if not self.live or k <= 0:
                return []
            if len(self.live) <= EXACT_BELOW:
                return self._exact(query, k, allowed)
            self.index.set_ef(max(MIN_EF, 2 * k))
            try:
                labels, dists = self.index.knn_query(
                    query[None, :], k=min(k, len(self.live)), num_threads=1, filter=allowed
                )
            except RuntimeError:
                # Fewer than k allowed vectors were reachable: fall back to an exact scan.
                return self._exact(query, k, allowed)
        return [(int(lb), 1.0 - float(d)) for lb, d in zip(labels[0], dists[0], strict=True)]

    def _exact(
        self, query: np.ndarray, k: int, allowed: Callable[[int], bool] | None
    ) -> list[tuple[int, float]]:
        """Exact cosine over every live, allowed label."""
        labels = sorted(lb for lb in self.live if allowed is None or allowed(lb))
        if not labels:
            return []
        try:
            data = np.asarray(self.index.get_items(labels, return_type="numpy"), dtype=np.float32)
        except RuntimeError:
            # A label the index lacks (mid-replay after a crash): score the ones it has.
            labels = [lb for lb in labels if _has(self.index, lb)]
            if not labels:
                return []
            data = np.asarray(self.index.get_items(labels, return_type="numpy"), dtype=np.float32)
        norms = np.linalg.norm(data, axis=1) * (np.linalg.norm(query) or 1.0)
        sims = (data @ query) / np.where(norms == 0, 1.0, norms)
        order = np.argsort(-sims, kind="stable")[:k]
        return [(labels[i], float(sims[i])) for i in order]

    def save(self) -> None:
        """Write the live-label list and then the index, each by temp file, fsync and rename."""
        with self.lock.shared():
            live = np.asarray(sorted(self.live), dtype=np.uint64)
            _atomic_write(_live_path(self.path), lambda tmp: np.save(tmp, live))
            _atomic_write(self.path, lambda tmp: self.index.save_index(str(tmp)))

    def count(self) -> int:
        """Number of live vectors."""
        return len(self.live)


def _has(index: hnswlib.Index, label: int) -> bool:
    """Whether the index holds a live vector for label."""
    try:
        index.get_items([label])
    except RuntimeError:
        return False
    return True


def _live_path(path: Path) -> Path:
    """The sidecar listing live labels (hnswlib has no call that lists deleted ones)."""
    return path.with_name(path.name + ".live.npy")


def _load_live(path: Path, index: hnswlib.Index) -> set[int]:
    """Live labels from the sidecar, or by probing each label when the sidecar is missing."""
    sidecar = _live_path(path)
    if sidecar.exists():
        # A sidecar newer than the index may name labels the index lacks; replay re-adds them.
        return {int(x) for x in np.load(sidecar)}
    live: set[int] = set()
    for label in index.get_ids_list():
        try:
            index.get_items([label])
            live.add(int(label))
        except RuntimeError:
            pass  # marked deleted
    return live


def _atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """Write via a temp file in the same directory, fsync it, rename it into place, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    write(str(tmp))
    written = tmp if tmp.exists() else Path(str(tmp) + ".npy")  # np.save appends .npy
    with open(written, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(written, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)

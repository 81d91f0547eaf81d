"""Erasing vectors inside a saved hnswlib index file, in place, without loading the index.

A purge copies the tenant's saved vector file and erases the purged vectors in the copy: cheaper
than saving the whole in-memory index again (hnswlib holds the GIL while it writes, stalling
every request of the process for as long as that takes). The layout read here is hnswlib 0.8's
`saveIndex`: a fixed header, then `cur_element_count` records of `size_data_per_element` bytes,
each holding the level-0 link list (whose third byte carries the deleted mark), the vector and
the label. tests/test_purge.py checks the result against hnswlib itself.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Collection
from pathlib import Path

import numpy as np

# offsetLevel0, max_elements, cur_element_count, size_data_per_element, label_offset,
# offsetData, maxlevel, enterpoint_node, maxM, maxM0, M, mult, ef_construction
HEADER = struct.Struct("<QQQQQQiIQQQdQ")
DELETE_MARK = 0x01


class VectorFileError(ValueError):
    """The file does not have the layout this module knows."""


def count_labels(path: Path, labels: Collection[int], dim: int) -> int:
    """How many of these labels have a record in the saved file (deleted or not)."""
    if not labels:
        return 0
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return len(_records(mm, labels, dim))


def erase_labels(path: Path, labels: Collection[int], dim: int) -> int:
    """Overwrite the vectors saved under these labels with noise and mark them deleted, in place;
    returns how many were found. The caller fsyncs."""
    if not labels:
        return 0
    with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as mm:
        level0, _max, _count, size, _label_at, data_at = HEADER.unpack_from(mm, 0)[:6]
        width = dim * 4
        found = _records(mm, labels, dim)
        rng = np.random.default_rng()
        for i in found:
            base = HEADER.size + i * size
            noise = rng.standard_normal(dim).astype("<f4")
            noise /= np.linalg.norm(noise) or 1.0  # cosine space stores unit vectors
            mm[base + data_at : base + data_at + width] = noise.tobytes()
            mm[base + level0 + 2] |= DELETE_MARK
        mm.flush()
    return len(found)


def _records(mm: mmap.mmap, labels: Collection[int], dim: int) -> list[int]:
    """The record numbers holding these labels, after checking the layout against dim."""
    if len(mm) < HEADER.size:
        raise VectorFileError("vector file shorter than its header")
    level0, _max, count, size, label_at, data_at = HEADER.unpack_from(mm, 0)[:6]
    if not (level0 + 4 <= data_at and data_at + dim * 4 <= label_at and label_at + 8 <= size):
        raise VectorFileError("vector file records do not match the dimension")
    if HEADER.size + count * size > len(mm):
        raise VectorFileError("vector file shorter than its records")
    stored = np.ndarray(
        (count,), dtype="<u8", buffer=mm, offset=HEADER.size + label_at, strides=(size,)
    )
    try:
        return [
            int(i) for i in np.nonzero(np.isin(stored, np.fromiter(labels, dtype=np.uint64)))[0]
        ]
    finally:
        del stored  # the view must go before the map closes

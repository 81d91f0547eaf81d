"""The layout of a saved vector index: hnswlib's index file and the live-label sidecar beside it.

The vector index (storage/index/vectors.py) saves through hnswlib and reads back through this module,
the one reader of the layout. The file is hnswlib 0.8's `saveIndex`: a fixed header, then
`cur_element_count` records of `size_data_per_element` bytes, each holding the level-0 link list
(whose third byte carries the deleted mark), the vector and the label, then each element's
upper-level link list behind a 4-byte length. An index that never held a vector is saved as the
header alone (no record): every reader here takes that as an empty file, not a damaged one.
hnswlib has no call that lists deleted labels, so the live ones are saved beside the file, as a
.npy array of uint64.

A purge copies the saved file and erases the purged vectors in the copy: cheaper than saving the
whole in-memory index again (hnswlib holds the GIL while it writes, stalling every request of
the process for as long as that takes). tests/storage/test_purge.py checks the result against hnswlib.

A small index has no graph in memory (storage/index/vectors.py searches it exactly): it is saved
by `write_flat` in the same layout, its records without links, which hnswlib loads too.
"""

from __future__ import annotations

import bisect
import errno
import io
import math
import mmap
import os
import re
import struct
from collections.abc import Collection
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from storage.files import LIVE_SUFFIX
from storage.index.mapped import map_file

# offsetLevel0, max_elements, cur_element_count, size_data_per_element, label_offset,
# offsetData (size_t each), maxlevel (int), enterpoint_node (uint32), maxM, maxM0, M (size_t),
# mult (double), ef_construction (size_t)
HEADER = struct.Struct("<QQQQQQiIQQQdQ")
DELETE_MARK = 0x01
_LINKS_LENGTH = struct.Struct("<I")  # the byte length of an element's upper-level links


class VectorFileError(ValueError):
    """The file does not have the layout this module knows."""


class Layout(NamedTuple):
    """Where the records of a saved index lie; checked against the file's size and the dimension."""

    records: int  # after the header (0 for an index that never held a vector)
    size: int  # bytes a record
    level0: int  # offset of the level-0 link list in a record
    data_at: int  # offset of the vector
    label_at: int  # offset of the label (uint64)


def layout(head: bytes, file_size: int, dim: int) -> Layout:
    """The layout the header describes, or VectorFileError if the file cannot hold it."""
    if file_size < HEADER.size or len(head) < HEADER.size:
        raise VectorFileError("vector index file is truncated (shorter than its header)")
    level0, _max, count, size, label_at, data_at = HEADER.unpack_from(head, 0)[:6]
    if not (level0 + 4 <= data_at and data_at + dim * 4 == label_at and label_at + 8 <= size):
        raise VectorFileError("vector index file records do not match the dimension")
    if HEADER.size + count * size > file_size:
        raise VectorFileError("vector index file is truncated (shorter than its records)")
    return Layout(records=count, size=size, level0=level0, data_at=data_at, label_at=label_at)


def peek(path: Path) -> tuple[int, int, int]:
    """(records, bytes a record, bytes a vector) from a saved index's header, whatever its
    dimension; OSError if it cannot be read, VectorFileError if it is too short."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # before each cold open: no buffered file
    try:
        head = os.pread(fd, HEADER.size, 0)
    finally:
        os.close(fd)
    if len(head) < HEADER.size:
        raise VectorFileError("vector index file is truncated (shorter than its header)")
    _level0, _max, count, size, label_at, data_at = HEADER.unpack_from(head, 0)[:6]
    return count, size, max(0, label_at - data_at)


def record_bytes(m: int, dim: int) -> int:
    """The bytes of one level-0 record of an index of this M and dimension: 2M links and their
    count, the float32 vector, the label."""
    return (2 * m + 1) * 4 + 4 * dim + 8


def write_flat(fh: BinaryIO, labels: np.ndarray, rows: np.ndarray, m: int, ef: int) -> None:
    """Write unit rows under their labels as hnswlib 0.8's saveIndex would an index of this M
    holding them with no links (every element on level 0, none deleted)."""
    count, dim = rows.shape
    links = (2 * m + 1) * 4  # the level-0 link count, then 2M links
    size = record_bytes(m, dim)
    empty = count == 0
    fh.write(
        HEADER.pack(
            0,  # offsetLevel0
            max(count, 16),  # max_elements (hnswlib cannot allocate none)
            count,
            size,
            links + 4 * dim,  # label offset
            links,  # data offset
            -1 if empty else 0,  # maxlevel
            0xFFFFFFFF if empty else 0,  # enterpoint_node (-1 as uint32 when empty)
            m,
            2 * m,
            m,
            1.0 / math.log(m),
            ef,
        )
    )
    if empty:
        return
    records = np.zeros((count, size), dtype=np.uint8)
    records[:, links : links + 4 * dim] = np.ascontiguousarray(rows, dtype="<f4").view(np.uint8)
    stored = np.ascontiguousarray(labels, dtype="<u8").reshape(count, 1)
    records[:, links + 4 * dim :] = stored.view(np.uint8)
    fh.write(records.tobytes())
    fh.write(bytes(_LINKS_LENGTH.size * count))  # no upper-level links


def live_path(path: Path) -> Path:
    """The live-label sidecar of the index saved at path."""
    return path.with_name(path.name + LIVE_SUFFIX)


def write_live(fh: BinaryIO, labels: Collection[int] | np.ndarray) -> None:
    """Write a live-label list (ascending) to an open file."""
    np.save(fh, np.sort(np.fromiter(labels, dtype=np.uint64, count=len(labels))))


# The header np.save writes for write_live's array (format 1.0): read without numpy's parser,
# which evaluates the header as a Python literal (compile() a call: a fifth of a small tenant's
# vector open).
_LIVE_HEADER = re.compile(
    rb"\A\x93NUMPY\x01\x00(..)\{'descr': '<u8', 'fortran_order': False, 'shape': \((\d+),\), \}"
    rb" *\n",
    re.DOTALL,
)


def read_live(sidecar: Path) -> np.ndarray | None:
    """The labels a sidecar lists; None if there is none, VectorFileError if it is unreadable."""
    try:
        fd = os.open(sidecar, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise VectorFileError(f"live-label list unreadable ({type(exc).__name__})") from exc
    try:
        raw = _read_all(fd)
    except OSError as exc:
        raise VectorFileError(f"live-label list unreadable ({type(exc).__name__})") from exc
    finally:
        os.close(fd)
    head = _LIVE_HEADER.match(raw)
    if head is not None and len(raw) == head.end() + 8 * int(head[2]):
        return np.frombuffer(raw, dtype="<u8", offset=head.end()).copy()
    try:  # any other layout np.save can write: numpy's own reader
        live: np.ndarray = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, EOFError, OSError) as exc:
        raise VectorFileError(f"live-label list unreadable ({type(exc).__name__})") from exc
    if live.ndim != 1 or live.dtype.kind not in "ui":
        raise VectorFileError("live-label list has another shape")
    return live


def check_saved(path: Path) -> None:
    """Raise EIO unless the file is as long as its header says: the level-0 records, then each
    element's upper-level links. hnswlib does not check its own writes, and a full disk leaves
    a file cut short that it then refuses to load."""
    cut = OSError(errno.EIO, "the saved vector index is shorter than its layout (a full disk?)")
    size = path.stat().st_size
    if size < HEADER.size:
        raise cut
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        count, record = HEADER.unpack_from(mm, 0)[2:4]
        pos = HEADER.size + count * record
        for _ in range(count):
            if pos + _LINKS_LENGTH.size > size:
                raise cut
            pos += _LINKS_LENGTH.size + _LINKS_LENGTH.unpack_from(mm, pos)[0]
    if pos != size:
        raise cut


def check_links(path: Path, dim: int) -> int:
    """The element count of the index saved at path, once its header fits the file and the
    dimension and its upper-level link lists walk exactly to the file's end, as hnswlib's load
    checks them (with two seeks an element: most of its time); VectorFileError otherwise.

    Every length is a multiple of 4, so the lists are read as 32-bit words and only the
    non-empty ones (about one element in M) are stepped through: a run of zero words is a run
    of elements without upper levels."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        shape = layout(fh.read(HEADER.size), size, dim)
        start = HEADER.size + shape.records * shape.size
        fh.seek(start)
        words = np.fromfile(fh, dtype="<u4")
    bad = VectorFileError("vector index file is damaged (its link lists do not fit)")
    if (size - start) % 4:
        raise bad
    nonzero = np.flatnonzero(words).tolist()
    at, walked, k, count = 0, 0, 0, shape.records
    while walked < count:
        k = bisect.bisect_left(nonzero, at, k)
        nxt = nonzero[k] if k < len(nonzero) else len(words)
        if walked + (nxt - at) >= count:  # the rest are elements without upper levels
            at += count - walked
            break
        if nxt >= len(words):  # elements left and no words for them
            raise bad
        walked += nxt - at
        length = int(words[nxt])
        if length % 4:
            raise bad
        at = nxt + 1 + length // 4
        walked += 1
    if at != len(words):
        raise bad
    return count


def read_vectors(path: Path, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(labels, vectors) of every record in a saved index (deleted ones included; cosine indexes
    hold unit vectors); both empty for an index saved without a vector."""
    with open(path, "rb") as fh:
        head = fh.read(HEADER.size)
        shape = layout(head, _size(fh.fileno()), dim)
        raw = np.fromfile(fh, dtype=np.uint8, count=shape.records * shape.size)
    if raw.size != shape.records * shape.size:
        raise VectorFileError("vector index file is truncated (shorter than its records)")
    records = raw.reshape(shape.records, shape.size)
    at, width = shape.data_at, 4 * dim
    vectors = np.ascontiguousarray(records[:, at : at + width]).view(np.float32)
    labels = np.ascontiguousarray(records[:, shape.label_at : shape.label_at + 8]).view(np.uint64)
    return labels.reshape(-1).astype(np.int64), vectors.reshape(shape.records, dim)


def map_vectors(path: Path, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """As read_vectors, but the vectors are a read-only view of the file mapped into memory: its
    pages are page cache, shared and reclaimable, not the process's heap, and opening copies
    nothing. The mapping outlives the file's replacement by a save (a rename) and is unmapped
    when the last view of it goes."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # not open(): a buffered file costs syscalls
    try:
        shape = layout(os.pread(fd, HEADER.size, 0), _size(fd), dim)
        if not shape.records:  # mmap cannot map a header alone, and there is nothing to map
            return np.zeros(0, dtype=np.int64), np.zeros((0, dim), dtype=np.float32)
        mm = map_file(fd, HEADER.size + shape.records * shape.size)
    finally:
        os.close(fd)
    vectors = np.ndarray(
        (shape.records, dim),
        dtype="<f4",
        buffer=mm,
        offset=HEADER.size + shape.data_at,
        strides=(shape.size, 4),
    )
    return _labels_view(mm, shape).astype(np.int64), vectors


def count_labels(path: Path, labels: Collection[int], dim: int) -> int:
    """How many of these labels have a record in the saved file (deleted or not)."""
    if not labels:
        return 0
    with open(path, "rb") as fh:
        shape = layout(fh.read(HEADER.size), _size(fh.fileno()), dim)
        if not shape.records:
            return 0
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return len(_records(mm, shape, labels))


def erase_labels(path: Path, labels: Collection[int], dim: int) -> int:
    """Overwrite the vectors saved under these labels with noise and mark them deleted, in place;
    returns how many were found. The caller fsyncs."""
    if not labels:
        return 0
    with open(path, "r+b") as fh:
        shape = layout(fh.read(HEADER.size), _size(fh.fileno()), dim)
        if not shape.records:
            return 0  # a header alone (mmap cannot map a file it would not touch anyway)
        with mmap.mmap(fh.fileno(), 0) as mm:
            found = _records(mm, shape, labels)
            rng = np.random.default_rng()
            width = dim * 4
            for i in found:
                base = HEADER.size + i * shape.size
                noise = rng.standard_normal(dim).astype("<f4")
                noise /= np.linalg.norm(noise) or 1.0  # cosine space stores unit vectors
                at = base + shape.data_at
                mm[at : at + width] = noise.tobytes()
                mm[base + shape.level0 + 2] |= DELETE_MARK
            mm.flush()
    return len(found)


def _read_all(fd: int) -> bytes:
    """The whole of an open (small) file."""
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _size(fd: int) -> int:
    """The size of an open file."""
    return os.fstat(fd).st_size


def _records(mm: mmap.mmap, shape: Layout, labels: Collection[int]) -> list[int]:
    """The record numbers holding these labels (the file holds at least one record)."""
    stored = _labels_view(mm, shape)
    try:
        wanted = np.fromiter(labels, dtype=np.uint64)
        return [int(i) for i in np.nonzero(np.isin(stored, wanted))[0]]
    finally:
        del stored  # the view must go before the map closes


def _labels_view(buffer: Any, shape: Layout) -> np.ndarray:
    """The records' labels as a strided view of the mapped file (no copy)."""
    return np.ndarray(
        (shape.records,),
        dtype="<u8",
        buffer=buffer,
        offset=HEADER.size + shape.label_at,
        strides=(shape.size,),
    )

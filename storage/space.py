"""Recognising a full disk, however the store that failed reports it.

LMDB says ENOSPC only when its write fails outright; a write cut short by the filling disk
comes back as EIO ("Input/output error"), and a failed meta page as MDB_PANIC. Tantivy wraps
the OS error in a ValueError's text ("os error 28"). So a failed commit counts as a full disk
when its errors name ENOSPC or EDQUOT, or when it is an I/O failure and the filesystem holding
the store has almost no space left (os.statvfs, asked at the moment of the failure).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb

from storage.errors import DiskFull

# An I/O failure with less than this much space left for the process is taken for a full disk:
# a commit writes at most a few batches' pages or a segment at a time, and a filesystem this
# small or this full fails the next ones too. Capped at a tenth of a small filesystem.
LOW_SPACE_BYTES = 64 << 20

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_FULL_WORDS = (
    os.strerror(errno.ENOSPC),  # "No space left on device"
    os.strerror(errno.EDQUOT),  # "Disk quota exceeded"
    f"os error {errno.ENOSPC})",  # Tantivy (Rust's io::Error)
    f"os error {errno.EDQUOT})",
)
# Tantivy's writer, killed by an I/O error in one of its threads, says "io::Error most likely".
_IO_WORDS = (os.strerror(errno.EIO), "MDB_PANIC", "An IO error occurred", "I/O error", "io::Error")


def causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and its causes."""
    seen: BaseException | None = exc
    met: set[int] = set()
    while seen is not None and id(seen) not in met:
        met.add(id(seen))
        yield seen
        seen = seen.__cause__ or seen.__context__


def names_full_disk(exc: BaseException) -> bool:
    """Whether the failure says outright that the disk or a quota is full."""
    for e in causes(exc):
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return True
        if isinstance(e, lmdb.DiskError):  # py-lmdb's ENOSPC
            return True
        text = str(e)
        if any(word in text for word in _FULL_WORDS):
            return True
    return False


def is_io_failure(exc: BaseException) -> bool:
    """Whether the failure came from the disk (rather than from a bug in the caller)."""
    for e in causes(exc):
        if isinstance(e, (OSError, lmdb.Error)):
            return True
        text = str(e)
        if any(word in text for word in _IO_WORDS):
            return True
    return False


def low_on_space(path: Path) -> bool:
    """Whether the filesystem holding path has (almost) no space left for this process."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return False
    free = st.f_bavail * st.f_frsize
    total = st.f_blocks * st.f_frsize
    return free < min(LOW_SPACE_BYTES, total // 10)


def disk_full(exc: BaseException, path: Path) -> bool:
    """Whether a failed write to the store at path failed because its disk is full."""
    return names_full_disk(exc) or (is_io_failure(exc) and low_on_space(path))


@contextmanager
def full_disk_as(detail: str, path: Path | None = None) -> Iterator[None]:
    """Re-raise a failure that a full disk caused as DiskFull(detail), other failures as they
    are: with path, an I/O failure on a nearly full filesystem counts too (disk_full)."""
    try:
        yield
    except (OSError, lmdb.Error) as exc:
        if names_full_disk(exc) if path is None else disk_full(exc, path):
            raise DiskFull(detail) from exc
        raise

"""Opening a tenant's two indexes: each with the seq it covers, or rebuilt from the log when it
cannot be read; pressure (a full disk, no file descriptors left) is told from damage and never
costs a rebuild."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from storage import files
from storage.errors import DiskFull
from storage.index.keyword import KeywordIndex
from storage.index.vectors import VectorIndex
from storage.space import disk_full

log = logging.getLogger("memspine.tenant")
CANNOT_OPEN = "the server's disk is full: this tenant cannot be opened until space is freed"


def open_keyword(root: Path, saved_seq: int) -> tuple[KeywordIndex, int]:
    """The keyword index and the seq it has applied (saved_seq: the log's keyword watermark);
    a damaged index is rebuilt from the log."""
    path = root / files.KEYWORD
    try:
        # No meta.json means no index at all (lost or never made): replay the whole log.
        found = (path / "meta.json").exists()
        seq = saved_seq if found else 0
        return KeywordIndex.open(path, committed_seq=seq), seq
    except (ValueError, OSError) as exc:
        raise_if_out_of_fds(exc)
        raise_if_disk_full(exc, path)
        log.warning(
            "tenant keyword index unreadable (%s); rebuilding from the log", type(exc).__name__
        )
        return KeywordIndex.create_empty(path), 0


def open_vectors(root: Path, saved_seq: int, dim: int) -> tuple[VectorIndex, int]:
    """The vector index and the seq of its last save (saved_seq: the log's vector watermark);
    a damaged file is rebuilt from the log."""
    path = root / files.VECTORS
    try:
        index = VectorIndex.open(path, dim)
    except (ValueError, OSError) as exc:
        raise_if_out_of_fds(exc)
        raise_if_disk_full(exc, path)
        log.warning(
            "tenant vector index unreadable (%s); rebuilding from the log", type(exc).__name__
        )
        return VectorIndex.create_empty(path, dim), 0
    return index, saved_seq if path.exists() else 0


def raise_if_disk_full(exc: BaseException, path: Path, detail: str = CANNOT_OPEN) -> None:
    """Re-raise a failure caused by a full disk as DiskFull (an index that failed to open is
    not rebuilt then: the rebuild could not be written either, and the one on disk may be whole)."""
    if not isinstance(exc, DiskFull) and disk_full(exc, path):
        raise DiskFull(detail) from exc


def raise_if_out_of_fds(exc: BaseException) -> None:
    """Re-raise an open failure caused by the process running out of file descriptors:
    that is pressure, not damage, and must never cost a rebuild (let alone deleted files).

    The failure says so itself (an errno, or Tantivy's words), or no descriptor can be opened
    now. The probe alone misjudges when another thread frees a descriptor between the failed
    open and the probe, which a busy process does often enough to rebuild an index for nothing.
    """
    said = _out_of_fds_errno(exc)
    if said is not None:
        raise OSError(said, os.strerror(said)) from exc
    try:
        os.close(os.open(os.devnull, os.O_RDONLY))
    except OSError as probe:
        if probe.errno in (errno.EMFILE, errno.ENFILE):
            raise probe from exc


def _out_of_fds_errno(exc: BaseException) -> int | None:
    """EMFILE or ENFILE if the failure or one of its causes says the process or the system is
    out of file descriptors; None otherwise."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in (errno.EMFILE, errno.ENFILE):
            return cause.errno
        if "Too many open files" in str(cause) or "TooManyOpenFiles" in str(cause):
            return errno.EMFILE
        cause = cause.__cause__ or cause.__context__
    return None

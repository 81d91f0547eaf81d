"""The read-log writer's round journal: a round's records of every tenant in one write and one
fdatasync, so a round costs one sync however many tenants were read.

The writer appends each tenant's records to its read log without syncing it, then every
entry of the round to this file, synced: from then on they survive a crash. Every few seconds
(and before a tenant's log is closed, cut or carried away) the logs written since are synced
and the journal is emptied. At the writer's start, the journal's entries are written again
where they belong: an entry names the log by its path, inode and header (a log replaced since,
by retention, a restore or an erased and recreated tenant, is left alone) and the offset its
bytes start at, so writing it again is idempotent. One process writes it (the data directory's
lock, storage/datalock.py).

    entry   length (u32) | crc32 of the rest (u32) | inode (u64) | offset (u64)
            | header (HEADER_BYTES) | path length (u16) | path (UTF-8) | records' bytes
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from storage.fsync import fdatasync_fd
from storage.readlog.format import HEADER_BYTES

log = logging.getLogger("storage.readlog")

JOURNAL = ".reads-journal"  # in the data directory: a dot name is never a tenant's
_HEAD = struct.Struct(">II")
_FIXED = struct.Struct(f">QQ{HEADER_BYTES}sH")


class Entry(NamedTuple):
    """One tenant's records of a round: its log (path, inode, header), where they start, their
    bytes."""

    path: str
    inode: int
    header: bytes
    offset: int
    data: bytes


def encode(e: Entry) -> bytes:
    """An entry's bytes."""
    raw_path = e.path.encode("utf-8")
    rest = _FIXED.pack(e.inode, e.offset, e.header, len(raw_path)) + raw_path + e.data
    return _HEAD.pack(len(rest), zlib.crc32(rest)) + rest


def entries(buf: bytes) -> Iterator[Entry]:
    """The whole entries of a journal's bytes, up to the first cut short or damaged (a round
    whose write a crash interrupted, never acknowledged)."""
    pos = 0
    while pos + _HEAD.size <= len(buf):
        n, crc = _HEAD.unpack_from(buf, pos)
        rest = buf[pos + _HEAD.size : pos + _HEAD.size + n]
        if len(rest) < n or n < _FIXED.size or zlib.crc32(rest) != crc:
            return
        inode, offset, header, plen = _FIXED.unpack_from(rest)
        at = _FIXED.size + plen
        yield Entry(rest[_FIXED.size : at].decode("utf-8"), inode, header, offset, rest[at:])
        pos += _HEAD.size + n


class Journal:
    """The open journal of a data directory."""

    def __init__(self, path: Path) -> None:
        """Write again what the journal holds (a crash's leftovers), then empty it."""
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        replay(os.pread(self._fd, os.fstat(self._fd).st_size, 0))
        self.reset()

    def commit(self, round_entries: list[Entry]) -> None:
        """Append a round's entries and make them durable; on failure the journal is as it was."""
        data = b"".join(encode(e) for e in round_entries)
        size = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, data)
            while written < len(data):
                written += os.write(self._fd, data[written:])
            fdatasync_fd(self._fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, size)
            raise

    def reset(self) -> None:
        """Empty it, once every log it covers is synced (a crash before the truncation is
        durable replays entries already in place: the same bytes at the same offsets)."""
        os.ftruncate(self._fd, 0)

    def close(self) -> None:
        """Close it (emptied by the caller first, when every log is synced)."""
        os.close(self._fd)


def replay(buf: bytes) -> int:
    """Write every entry again into its log if that log is still the one named; the entries
    written."""
    done = 0
    for e in entries(buf):
        try:
            fd = os.open(e.path, os.O_RDWR)
        except OSError:  # erased since (or its directory with it)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            st = os.fstat(fd)
            same = st.st_ino == e.inode and os.pread(fd, HEADER_BYTES, 0) == e.header
            if same and st.st_size >= e.offset:
                os.pwrite(fd, e.data, e.offset)
                fdatasync_fd(fd)
                done += 1
        except OSError as exc:
            log.error("read log %s: a journal entry not written again: %s", e.path, exc)
        finally:
            os.close(fd)
    return done

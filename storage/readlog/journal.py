"""The read-log writer's round journal: a round's records of every tenant in one write and one
fdatasync, so a round costs one sync however many tenants were read.

The writer appends each tenant's records to its read log without syncing it, then every
entry of the round to this file, synced: from then on they survive a crash. Every few seconds
a checkpoint moves on to a new file of its directory and, off the writer's thread, syncs the logs written
since, then removes the file ended (a log is also synced before it is closed, cut or carried
away). At the writer's start, the journal's entries are written again
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

from storage import failpoints
from storage.fsync import fdatasync_fd
from storage.readlog.format import HEADER_BYTES

log = logging.getLogger("storage.readlog")

JOURNAL = ".reads-journal"  # its directory in the data directory: a dot name is never a tenant
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
    """The data directory's journal: a directory of numbered files, appended to one at a
    time; a checkpoint moves on to the next and removes the last once the logs it covers are
    synced (storage/readlog/writer.py), so rounds never wait for those syncs. Made at the
    first round that writes records, removed when the writer stops."""

    def __init__(self, where: Path) -> None:
        """Write again what the files left from before hold (oldest first), then remove them."""
        self.where = where
        left = sorted(_numbered(where).items())
        for _n, path in left:
            replay(path.read_bytes())
        for _n, path in left:
            path.unlink(missing_ok=True)
        self._n = left[-1][0] + 1 if left else 0
        self._fd: int | None = None
        with contextlib.suppress(OSError):
            where.rmdir()

    def _path(self, n: int) -> Path:
        return self.where / str(n)

    def commit(self, round_entries: list[Entry]) -> None:
        """Append a round's entries and make them durable; on failure the journal is as it was."""
        if self._fd is None:
            self.where.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self._path(self._n), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        data = b"".join(encode(e) for e in round_entries)
        size = os.fstat(self._fd).st_size
        try:
            failpoints.hit("reads.journal")
            written = os.write(self._fd, data)
            while written < len(data):
                written += os.write(self._fd, data[written:])
            fdatasync_fd(self._fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, size)
            raise

    def rotate(self) -> Path | None:
        """Go on in a new file (made by the next commit); the one ended, to `drop` once the
        logs it covers are synced (its entries are written again at the next start until
        then), or None if nothing was written since."""
        if self._fd is None:
            return None
        os.close(self._fd)
        self._fd = None
        self._n += 1
        return self._path(self._n - 1)

    @staticmethod
    def drop(ended: Path) -> None:
        """Remove a file `rotate` ended (a crash before the removal is durable replays entries
        already in place: the same bytes at the same offsets)."""
        ended.unlink(missing_ok=True)

    def close(self) -> None:
        """Remove the journal (every log it covers synced by the caller; files a failed
        checkpoint kept stay, to be written again at the next start)."""
        ended = self.rotate()
        if ended is not None:
            ended.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.where.rmdir()


def _numbered(where: Path) -> dict[int, Path]:
    """The journal's files by number (none if it has no directory)."""
    try:
        return {int(p.name): p for p in where.iterdir() if p.name.isdigit()}
    except FileNotFoundError:
        return {}


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

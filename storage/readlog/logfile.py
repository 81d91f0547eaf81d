"""A tenant's read log on disk: opened for appending (its tail recovered), read page by page,
and cut by retention. The bytes are storage/readlog/format.py's."""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

from storage import failpoints
from storage.files import READS, READS_AWAITED
from storage.fsync import fdatasync_fd, fsync_dir, replace_durably
from storage.ids import id_bytes
from storage.readlog.format import (
    HEADER_BYTES,
    LINK_BYTES,
    ZERO_HASH,
    Header,
    Read,
    ReadLogCorrupt,
    body_ts,
    chain,
    decode_body,
    decode_header,
    encode_body,
    encode_header,
    frame,
    frames,
    read_varint,
)


class Mark(NamedTuple):
    """A point of a tenant's chain: the seq of a record and the chain value after it."""

    seq: int
    hash: bytes


def reads_path(root: Path) -> Path:
    """The read log of the tenant whose directory is `root`."""
    return Path(root) / READS


def await_carried(root: Path) -> None:
    """Note that the tenant's read log from the node it is moving from is still to come."""
    path = Path(root) / READS_AWAITED
    path.touch()
    fsync_dir(path.parent)


def awaits_carried(root: Path) -> bool:
    """Whether a move's hand-over of the tenant's read log is still to come here."""
    return (Path(root) / READS_AWAITED).exists()


def carried_in(root: Path) -> None:
    """The hand-over is done (or there was nothing to hand): its note goes."""
    (Path(root) / READS_AWAITED).unlink(missing_ok=True)


def read_bytes(root: Path) -> int:
    """The read log's size on disk (0 if the tenant has none)."""
    try:
        return reads_path(root).stat().st_size
    except FileNotFoundError:
        return 0


def first_ts(root: Path) -> int | None:
    """The time of a tenant's oldest read record (None: none), read from the file's start."""
    try:
        with open(reads_path(root), "rb") as fh:
            buf = fh.read(HEADER_BYTES + 16)  # the header and the first record's length and ts
    except FileNotFoundError:
        return None
    try:
        header = decode_header(buf)
        _n, at = read_varint(buf, HEADER_BYTES)
        return body_ts(buf[at:], header.base_ts)
    except ReadLogCorrupt:
        return None  # no whole first record yet


class Tail(NamedTuple):
    """Where a file's records end: the last seq, chain value and ts, and the byte after them."""

    seq: int
    hash: bytes
    ts: int
    end: int


def walk(buf: bytes | memoryview, header: Header) -> Tail:
    """Follow every whole record from the header on: where they end and the chain after them."""
    start = Tail(header.base_seq, header.base_hash, header.base_ts, HEADER_BYTES)
    return _follow(buf, HEADER_BYTES, start)


def _follow(buf: bytes | memoryview, pos: int, start: Tail) -> Tail:
    """Go on from `start` over the whole records of buf from pos (the file's byte start.end)."""
    seq, value, ts, end = start.seq, start.hash, start.ts, pos
    for f in frames(buf, pos, seq):
        value = chain(value, f.body)
        ts = body_ts(f.body, ts)
        seq, end = f.seq, f.end
    return Tail(seq, value, ts, start.end + end - pos)


# Beside the log, the tail as the writer last left it (not synced: a hint that spares reading
# the whole log again when a tenant's first record after a restart is written; checked against
# the log's inode, size and the next record's link, else the log is walked from its start).
SAVED_SUFFIX = ".tail"
_SAVED = struct.Struct(">8sQQ32sqQ")  # magic, inode, seq, chain value, ts, end
SAVED_MAGIC = b"MSRTAIL1"


def _saved_path(path: Path) -> Path:
    return path.with_name(path.name + SAVED_SUFFIX)


def _recover(fd: int, path: Path, size: int) -> Tail:
    """The tail of the open log: from the saved hint and what follows it, or from the start."""
    inode = os.fstat(fd).st_ino
    try:
        raw = _saved_path(path).read_bytes()
        magic, saved_inode, seq, value, ts, end = _SAVED.unpack(raw)
    except (OSError, struct.error):
        magic = b""
    if magic == SAVED_MAGIC and saved_inode == inode and HEADER_BYTES <= end <= size:
        rest = os.pread(fd, size - end, end)
        first = next(frames(rest, 0, seq), None)
        if first is None or first.body[:LINK_BYTES] == value[:LINK_BYTES]:
            return _follow(rest, 0, Tail(seq, value, ts, end))
    buf = os.pread(fd, size, 0)
    return walk(buf, decode_header(buf))


class Written(NamedTuple):
    """An append's bytes, the file offset they start at and the chain's tail before them."""

    offset: int
    data: bytes
    before: Mark
    before_ts: int


class Appender:
    """One tenant's read log, appended to by the writer thread: its chain's tail in memory, the
    file opened for each group of records and closed after.

    Each append holds an flock on the file: an operator's command beside the server (a CLI
    export, memspine_admin/readaudit.py) appends its record through its own Appender, and the
    other one, finding the file grown past its tail, follows the chain over those records first.
    """

    def __init__(self, root: Path, first_ts: int) -> None:
        """Open (creating it with an empty chain if missing) and cut off an interrupted tail.

        FileNotFoundError if the tenant's directory is gone (the tenant was erased).
        """
        self.path = reads_path(root)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # another process's append ends first
            size = os.fstat(fd).st_size
            if size < HEADER_BYTES:  # new, or a crash before its header was whole
                os.ftruncate(fd, 0)
                os.write(fd, encode_header(Header(0, ZERO_HASH, first_ts)))
                fdatasync_fd(fd)
                fsync_dir(self.path.parent)
                size = HEADER_BYTES
            tail = _recover(fd, self.path, size)
            if tail.end < size:  # a write cut short by a crash: never acknowledged
                os.ftruncate(fd, tail.end)
            self.inode = os.fstat(fd).st_ino
            self.header = os.pread(fd, HEADER_BYTES, 0)  # names this file in a journal entry
        finally:
            # No descriptor is kept between commits: a read log open for every tenant read in
            # the last minute would hold descriptors beyond the open-tenant cap that the fd
            # limit is divided by (tests/e2e/test_process_limits.py).
            os.close(fd)
        self.seq, self.hash, self.ts, self.size = tail
        self.synced = tail.end  # bytes made durable (those after: in the round journal)

    def current(self) -> bool:
        """True while the path still names this file (not replaced by retention, restore or
        an erased and recreated tenant)."""
        try:
            return os.stat(self.path).st_ino == self.inode
        except FileNotFoundError:
            return False

    def append(self, reads: list[Read], *, sync: bool = True) -> Written:
        """Write the records and, with sync, make them durable (without it the caller does:
        the writer's round journal, storage/readlog/journal.py, then `sync` in time); on
        failure the file is as it was. Where they went and their bytes."""
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by the close
            st = os.fstat(fd)
            if st.st_ino != self.inode:  # replaced since the writer checked
                raise FileNotFoundError(f"{self.path.name} was replaced")
            if st.st_size != self.size:  # another process appended: chain on after its records
                self._catch_up(fd, st.st_size)
            seq, value, ts = self.seq, self.hash, self.ts
            parts = []
            for r in reads:
                body = encode_body(r, value, ts)
                parts.append(frame(body))
                value = chain(value, body)
                seq, ts = seq + 1, r.ts
            data = b"".join(parts)
            failpoints.hit("reads.append")
            written = os.write(fd, data)
            while written < len(data):
                written += os.write(fd, data[written:])
            if sync:
                fdatasync_fd(fd)
        except BaseException:
            with contextlib.suppress(OSError):  # leave no half record behind
                if os.fstat(fd).st_ino == self.inode:
                    os.ftruncate(fd, self.size)
            raise
        finally:
            os.close(fd)
        done = Written(self.size, data, Mark(self.seq, self.hash), self.ts)
        self.seq, self.hash, self.ts, self.size = seq, value, ts, self.size + len(data)
        if sync:
            self.synced = self.size
            self._save()
        return done

    def sync_to(self, size: int) -> None:
        """Make the bytes up to `size` durable, if they are not (another thread may call it:
        the writer's checkpoint, while the writer appends); nothing if the file is gone or
        replaced (synced by whoever closed it)."""
        if size <= self.synced:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            if os.fstat(fd).st_ino == self.inode:
                failpoints.hit("reads.sync")
                fdatasync_fd(fd)
        finally:
            os.close(fd)
        self.synced = max(self.synced, size)

    def take_back(self, w: Written) -> bool:
        """Undo the last append, never made durable (its round's sync failed): its bytes cut
        off the file, the tail as before it, so the same records can be appended again with
        the same links. False if that cannot be done (another process appended after them, or
        the file was replaced): they stay where they are."""
        if self.size != w.offset + len(w.data) or self.synced > w.offset:
            return False
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            st = os.fstat(fd)
            if st.st_ino != self.inode or st.st_size != self.size:
                return False
            os.ftruncate(fd, w.offset)
        finally:
            os.close(fd)
        self.seq, self.hash, self.ts, self.size = w.before.seq, w.before.hash, w.before_ts, w.offset
        return True

    def sync(self) -> None:
        """Make everything written durable, and leave the tail beside the log (the writer's
        thread only)."""
        if self.size > self.synced:
            self.sync_to(self.size)
            self._save()

    def _catch_up(self, fd: int, size: int) -> None:
        """Follow the records another process appended after this tail (a record it left cut
        short, killed mid-write, is cut off: the lock is held, nobody is writing it)."""
        if size < self.size:
            raise FileNotFoundError(f"{self.path.name} shrank under its writer")
        rest = os.pread(fd, size - self.size, self.size)
        tail = _follow(rest, 0, Tail(self.seq, self.hash, self.ts, self.size))
        if tail.end < size:
            os.ftruncate(fd, tail.end)
        self.seq, self.hash, self.ts, self.size = tail

    def _save(self) -> None:
        """Leave the tail beside the log for the next open (a hint: a failure costs nothing)."""
        saved = _SAVED.pack(SAVED_MAGIC, self.inode, self.seq, self.hash, self.ts, self.size)
        with contextlib.suppress(OSError):
            fd = os.open(_saved_path(self.path), os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.pwrite(fd, saved, 0)
            finally:
                os.close(fd)

    def mark(self) -> Mark:
        """The chain's head now."""
        return Mark(self.seq, self.hash)

    def close(self) -> None:
        """Make it durable and forget the file (no descriptor is held between appends)."""
        self.sync()


def append_beside(root: Path, reads: list[Read]) -> Mark | None:
    """Append records from another process than the server's (an operator's command run
    beside it), after whatever the server wrote, synced; the chain's head after them, or None
    if the tenant's directory is gone."""
    for _ in range(3):  # replaced meanwhile (a retention cut): open the new file
        if not Path(root).is_dir():
            return None
        f = Appender(root, reads[0].ts)
        try:
            f.append(reads)
        except FileNotFoundError:
            continue
        return f.mark()
    raise FileNotFoundError(f"{reads_path(root)} kept being replaced")


def whole_bytes(root: Path) -> bytes | None:
    """A tenant's read log up to its last whole record (an append under way is left out);
    None if it has none."""
    try:
        buf = reads_path(root).read_bytes()
    except FileNotFoundError:
        return None
    return buf[: walk(buf, decode_header(buf)).end]


def take_carried(root: Path, carried: bytes) -> Mark:
    """Put a read log carried from another node (a moved tenant's, `whole_bytes` there) in
    place of this tenant's, and append after it, chained anew, the records this node made
    meanwhile (none when they are in the carried log already: a hand-over tried again); the
    chain's head. Only the writer thread calls it (storage/readlog/writer.py's carry)."""
    header = decode_header(carried)
    tail = walk(carried, header)
    carried = carried[: tail.end]
    path = reads_path(root)
    try:
        mine = path.read_bytes()
    except FileNotFoundError:
        mine = b""
    if mine[: len(carried)] == carried:  # taken before: only what came after it is this node's
        own = [f.read for f in records(root, after=tail.seq)]
    elif carried[: len(mine)] == mine:  # all of this node's records came from there
        own = []
    else:
        own = [f.read for f in records(root)]
    _saved_path(path).unlink(missing_ok=True)

    def write(fh: BinaryIO) -> None:
        fh.write(carried)

    replace_durably(path, write)
    f = Appender(root, header.base_ts)
    if own:
        f.append(own)
    return f.mark()


def copy_whole(root: Path, dest_root: Path) -> bool:
    """Copy a tenant's read log into dest_root, up to its last whole record (an append under
    way is left out); False if it has none. For backups: copied after the control plane, the
    copy holds every record the copied head names."""
    try:
        buf = reads_path(root).read_bytes()
    except FileNotFoundError:
        return False
    end = walk(buf, decode_header(buf)).end
    dest_root.mkdir(parents=True, exist_ok=True)
    reads_path(dest_root).write_bytes(buf[:end])
    return True


class Found(NamedTuple):
    """A record read back: its seq and what it says."""

    seq: int
    read: Read


def records(root: Path, after: int = 0, naming: str | None = None) -> Iterator[Found]:
    """Every whole record of a tenant's read log with seq > after, oldest first (none if it
    has no log); with `naming` (an event id), only records whose bytes hold that id (one
    in a thousand may hold the 16 bytes elsewhere: the caller checks the ids decoded). Reads
    one consistent file: a retention cut meanwhile replaces it whole."""
    try:
        with open(reads_path(root), "rb") as fh:
            buf = fh.read()
    except FileNotFoundError:
        return
    header = decode_header(buf)
    ts = header.base_ts
    # Searching the raw bytes skips decoding records that cannot name the event: an event
    # id's reads over a million records took 3.4 s of CPU instead of 23 (bench/RESULTS.md).
    needle = id_bytes(naming) if naming is not None else None
    for f in frames(buf, HEADER_BYTES, header.base_seq):
        if f.seq <= after or (needle is not None and needle not in f.body):
            ts = body_ts(f.body, ts)
            continue
        read = decode_body(f.body, ts)
        ts = read.ts
        yield Found(f.seq, read)


def reads_of_events(root: Path, event_ids: list[str]) -> list[Found]:
    """The records of a tenant's read log that name any of these events, oldest first (for an
    access export: who read a data subject's events)."""
    wanted = {id_bytes(e) for e in event_ids}
    if not wanted:
        return []
    found = []
    for f in records(root):
        if any(id_bytes(e) in wanted for e in f.read.event_ids):
            found.append(f)
    return found


def cut(root: Path, before_ts: int, publish: Callable[[Mark], None]) -> int:
    """Drop the records older than before_ts from the front of the chain (stopping at the first
    that is not), publishing the new base with `publish` before the file is replaced; the
    number dropped. Only the writer thread calls it (it holds no handle on the file meanwhile).
    """
    path = reads_path(root)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:  # held until the new file is in place: no other process's append falls in between
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _cut_locked(path, os.pread(fd, os.fstat(fd).st_size, 0), before_ts, publish)
    finally:
        os.close(fd)


def _cut_locked(path: Path, buf: bytes, before_ts: int, publish: Callable[[Mark], None]) -> int:
    header = decode_header(buf)
    seq, value, ts, start = header.base_seq, header.base_hash, header.base_ts, HEADER_BYTES
    for f in frames(buf, HEADER_BYTES, header.base_seq):
        t = body_ts(f.body, ts)
        if t >= before_ts:
            break
        value, ts, seq, start = chain(value, f.body), t, f.seq, f.end
    dropped = seq - header.base_seq
    if not dropped:
        return 0
    # The records kept are re-based on the new header: their first ts delta is relative to
    # the last dropped one's, which the new header keeps as its base ts.
    publish(Mark(seq, value))
    kept = memoryview(buf)[start : walk(buf, header).end]
    new_header = encode_header(Header(seq, value, ts))

    def write(fh: BinaryIO) -> None:
        fh.write(new_header)
        fh.write(kept)

    _saved_path(path).unlink(missing_ok=True)  # its inode number may come back with a new file
    replace_durably(path, write)
    return dropped

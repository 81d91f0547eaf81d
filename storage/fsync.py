"""Making file changes durable: fsync of a file, of a directory (its renames and removals), of
a tree, the replace-by-rename every saved file goes through, and the unnamed-file publish of an
operator's output."""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

TMP_SUFFIX = ".tmp"  # a file being written beside the one it will replace


def fsync_file(path: Path) -> None:
    """Make a file's content durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make renames and removals inside a directory durable."""
    fsync_file(path)  # the same call: a directory opens read-only like a file


def fsync_tree(path: Path) -> None:
    """Fsync every file and directory under path, deepest first, then path itself."""
    for dirpath, _dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            fsync_file(Path(dirpath, name))
        fsync_dir(Path(dirpath))


def replace_durably(
    path: Path,
    write: Callable[[BinaryIO], object] | None = None,
    *,
    save: Callable[[str], object] | None = None,
) -> None:
    """Write a new version of path through a temp file beside it (to a handle, or by a saver
    that takes a file name), fsync it, rename it over path and fsync the directory: a crash
    leaves the old version or the new one, never a mix."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        if save is not None:
            save(str(tmp))
        else:
            assert write is not None
            with open(tmp, "wb") as fh:
                write(fh)
        fsync_file(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)  # on a full disk a partial copy holds the space it needs
        raise
    os.replace(tmp, path)
    fsync_dir(path.parent)


def publish_durably(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write a new version of path (an operator's output file) so that a process killed while
    writing it leaves no file at all: the bytes go to an unnamed file in path's directory
    (O_TMPFILE), fsynced, linked under a hidden name and renamed over path. Where the
    filesystem has no O_TMPFILE, through a temp file beside it as replace_durably does."""
    tmpfile = getattr(os, "O_TMPFILE", 0)
    try:
        fd = os.open(path.parent, tmpfile | os.O_WRONLY, 0o600) if tmpfile else -1
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
        fd = -1
    if fd < 0:
        replace_durably(path, write)
        return
    hidden = path.with_name(f".{path.name}.{secrets.token_hex(4)}{TMP_SUFFIX}")
    with os.fdopen(fd, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
        # With a dir fd CPython calls linkat(AT_SYMLINK_FOLLOW); without, link(), which would
        # link /proc's symlink itself (EXDEV).
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.link(f"/proc/self/fd/{fh.fileno()}", hidden.name, dst_dir_fd=parent)
        finally:
            os.close(parent)
    try:
        os.replace(hidden, path)
    except BaseException:
        hidden.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)

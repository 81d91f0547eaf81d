"""Making file changes durable: fsync of a file, of a directory (its renames and removals), of
a tree, and the replace-by-rename every saved file goes through."""

from __future__ import annotations

import os
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


def fdatasync_fd(fd: int) -> None:
    """Make the data written through an open descriptor durable (its size with it)."""
    os.fdatasync(fd)


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

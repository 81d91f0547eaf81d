"""How a purge replaces a tenant's files: a staged generation, one rename to commit, roll-forward.

Inside a tenant directory a purge writes the new generation of every store into `purge.new/`.
Renaming that to `purge.ready/` is the commit: from then on the new files win. Rolling forward
moves each old store into `purge.old/` and the new one into its place, then removes the empty
`purge.ready/`; the old generation is deleted last. `recover` runs before a tenant opens: it
finishes a committed swap and deletes an uncommitted stage and any old generation, so a crash
at any point leaves either the old files or the new ones in place, never a mix.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from storage.files import STALE, STORES
from storage.fsync import fsync_dir

STAGING = "purge.new"  # being written; discarded if found on open
READY = "purge.ready"  # committed; rolled forward if found on open
OLD = "purge.old"  # the replaced generation, deleted after the swap
PENDING = "purge.pending"  # marker: this tenant may hold deleted events not yet purged

StepHook = Callable[
    [str], None
]  # told the name of each stage a purge reaches (tests kill it there)


def no_step(_name: str) -> None:
    """The default progress hook: nothing."""


def remove(path: Path) -> bool:
    """Delete a file or a directory tree if it exists; True if something was deleted."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
        return True
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def commit(root: Path) -> None:
    """Make the staged generation the tenant's files: one atomic rename, made durable."""
    os.rename(root / STAGING, root / READY)
    fsync_dir(root)


def roll_forward(root: Path, step: StepHook = no_step) -> None:
    """Move each committed store into place (old ones aside); safe to repeat after a crash."""
    ready, old = root / READY, root / OLD
    old.mkdir(exist_ok=True)
    for name in STORES:
        new = ready / name
        if not new.exists():
            continue  # moved already, or this generation has no such store
        current = root / name
        if current.exists():
            remove(old / name)
            os.rename(current, old / name)
        os.rename(new, current)
        step(f"swap:{name}")
    fsync_dir(root)
    remove(ready)  # empty now; without it a restart no longer rolls forward
    fsync_dir(root)
    step("swap:done")


def discard_old(root: Path) -> None:
    """Delete the replaced generation so its bytes leave the data directory."""
    if remove(root / OLD):
        fsync_dir(root)


def recover(root: Path) -> frozenset[str] | None:
    """Before a tenant opens: finish a committed swap, drop an uncommitted stage and old files;
    returns the names in root then (None: no directory), from one listing where nothing was
    left to recover (a cold open costs a stat and an unlink a name otherwise)."""
    try:
        names = set(os.listdir(root))
    except (FileNotFoundError, NotADirectoryError):
        return None
    if READY in names and (root / READY).is_dir():
        roll_forward(root)
        names = set(os.listdir(root))
    dropped = False
    for name in (STAGING, OLD, *STALE):
        if name in names:
            dropped = remove(root / name) or dropped
            names.discard(name)
    if dropped:
        fsync_dir(root)
    return frozenset(names)


def mark_pending(root: Path) -> None:
    """Note durably that this tenant has deletions to purge (found by the purger even if closed)."""
    marker = root / PENDING
    if marker.exists():
        return
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(fd)
    fsync_dir(root)


def clear_pending(root: Path) -> None:
    """Forget the marker once the tenant has no deletion left to purge."""
    if remove(root / PENDING):
        fsync_dir(root)


def pending_tenants(data_dir: Path) -> list[str]:
    """Names of tenant directories carrying the pending-purge marker."""
    try:
        entries = sorted(os.scandir(data_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    return [e.name for e in entries if e.is_dir() and os.path.exists(os.path.join(e.path, PENDING))]

"""A tenant directory's life on disk: which directories of a data directory are tenants, and
how one is erased. The server erases through `Engine.erase_copy` (memspine/engine.py), which
closes the tenant first; the CLI calls `erase_tenant_dir` with no server running."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from storage import files
from storage.erasure import swap
from storage.errors import InvalidRequest
from storage.fsync import fsync_dir


def is_tenant_id(value: object) -> bool:
    """True if `value` is a canonical lowercase UUIDv4 string (so never "_control" or a path)."""
    if not isinstance(value, str) or len(value) != 36:
        return False
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        return False
    return parsed.version == 4 and str(parsed) == value


def tenant_dirs(data_dir: Path) -> list[str]:
    """The tenant directories of a data directory: those holding a log (or the committed
    generation of a purge's swap); hidden, `_` and other entries are not tenants."""
    found = []
    for entry in sorted(os.scandir(data_dir), key=lambda e: e.name):
        if entry.name[0] in "._" or not entry.is_dir(follow_symlinks=False):
            continue
        root = Path(entry.path)
        if (root / files.LOG).is_dir() or (root / swap.READY / files.LOG).is_dir():
            found.append(entry.name)
    return found


def erase_tenant_dir(data_dir: Path, tenant_id: str) -> bool:
    """Remove `data_dir/<tenant_id>`; never follows a symlink out of data_dir. True if removed.

    The tenant must be closed (the server: `Engine.erase_copy`); the CLI relies on revoked keys
    keeping it closed.
    """
    if not is_tenant_id(tenant_id):
        raise InvalidRequest("not a tenant id")
    root = Path(data_dir)
    target = root / tenant_id
    if not os.path.lexists(target):
        return False
    if target.is_symlink() or not target.is_dir():
        target.unlink()  # a link is removed, never what it points to
    else:
        # Rename first, so a crash mid-way leaves no half-erased directory under the tenant's name.
        doomed = root / f".erasing-{tenant_id}-{uuid.uuid4().hex[:8]}"
        os.rename(target, doomed)
        fsync_dir(root)
        shutil.rmtree(doomed)  # fd-based on Linux: symlinks inside are unlinked, not followed
    fsync_dir(root)
    return True

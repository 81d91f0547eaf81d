"""The erasure receipts a backup carries and a restore puts back (storage/transfer/backup.py).

A backup holds, beside the tenants' logs, `_receipts/` as the data directory has it
(storage/receipts.py): the signing key (so the restored server signs with the same key and
`memspine-admin receipt verify` trusts the old receipts), the record of copies made, and each
backed-up tenant's signed receipts, byte for byte. A restore copies back only regular files
reached through real directories, under names a receipt store makes: a crafted backup cannot
bring in a link, a path outside the target, or a file of a tenant it does not restore.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from storage.receipts import COPIES, DIR, KEY_FILE

SHARED = (KEY_FILE, COPIES)  # the data directory's own files in _receipts/
RECEIPT_SUFFIX = ".json"


def carry(data_dir: Path, dest: Path, tenant_ids: Iterable[str]) -> int:
    """Copy data_dir's receipt files of these tenants (and the shared ones) into dest; how
    many receipts were carried."""
    return _copy(data_dir / DIR, dest / DIR, tenant_ids)


def put_back(src: Path, data_dir: Path, tenant_ids: Iterable[str]) -> int:
    """Copy a backup's receipt files of these tenants (and the shared ones) into the data
    directory being built; how many receipts were put back."""
    return _copy(src / DIR, data_dir / DIR, tenant_ids)


def _copy(source: Path, dest: Path, tenant_ids: Iterable[str]) -> int:
    """The receipt files under source that are plain, into dest (each 0600, dirs 0700)."""
    if not _real_dir(source):
        return 0
    for name in SHARED:
        _copy_file(source / name, dest / name, dest)
    carried = 0
    for tenant_id in tenant_ids:
        folder = source / tenant_id
        if not _real_dir(folder):
            continue
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if _receipt_name(entry.name):
                carried += _copy_file(Path(entry.path), dest / tenant_id / entry.name, dest)
    return carried


def _copy_file(source: Path, dest: Path, top: Path) -> bool:
    """Copy one regular file (never a link) into dest, making its directories; False if
    source is no regular file."""
    try:
        if not stat.S_ISREG(source.lstat().st_mode):
            return False
    except OSError:
        return False
    for folder in (top, dest.parent):
        folder.mkdir(mode=0o700, exist_ok=True)
    shutil.copyfile(source, dest, follow_symlinks=False)
    os.chmod(dest, 0o600)
    return True


def _real_dir(path: Path) -> bool:
    """Whether path is a directory itself, not a link to one."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def _receipt_name(name: str) -> bool:
    """Whether a file name is one storage/receipts.py stores: 32 hex digits and .json."""
    stem, suffix = name[: -len(RECEIPT_SUFFIX)], name[-len(RECEIPT_SUFFIX) :]
    return (
        suffix == RECEIPT_SUFFIX and len(stem) == 32 and all(c in "0123456789abcdef" for c in stem)
    )

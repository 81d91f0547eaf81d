"""The receipts a backup carries and a restore puts back (storage/transfer/backup.py), and
those a tenant move hands from its source node to its target (memspine/routes/move.py).

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
from functools import partial
from pathlib import Path
from typing import BinaryIO

from storage.fsync import replace_durably
from storage.receipts import COPIES, DIR, KEY_FILE, verify

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


def of_tenant(data_dir: Path, tenant_id: str) -> list[tuple[str, bytes]]:
    """A tenant's receipt files as (receipt id, bytes), in id order (a move's source)."""
    folder = data_dir / DIR / tenant_id
    if not _real_dir(folder):
        return []
    found = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if _receipt_name(entry.name) and entry.is_file(follow_symlinks=False):
            found.append((entry.name[: -len(RECEIPT_SUFFIX)], Path(entry.path).read_bytes()))
    return found


def take(data_dir: Path, tenant_id: str, bodies: Iterable[tuple[str, bytes]]) -> int:
    """Keep the receipts a move's source handed over (a move's target), each byte for byte,
    only if it is a signed receipt of this tenant under its own id and not held here already;
    how many were new."""
    folder = data_dir / DIR / tenant_id
    taken = 0
    for receipt_id, body in bodies:
        receipt = verify(body)
        if receipt is None or receipt.tenant_id != tenant_id or receipt.receipt_id != receipt_id:
            continue
        path = folder / f"{receipt_id}{RECEIPT_SUFFIX}"
        if not _receipt_name(path.name) or path.exists():
            continue
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        replace_durably(path, partial(_write, body))
        taken += 1
    return taken


def _write(body: bytes, out: BinaryIO) -> None:
    out.write(body)

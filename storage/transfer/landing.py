"""Where an import is written, so that a refused or interrupted one leaves the tenant as it was.

A tenant without a directory is imported into `DATA_DIR/.importing-<tenant id>-<random>/`,
closed (its indexes saved), made durable and renamed into place: until that rename the tenant
does not exist, after it the whole import does. A server may serve the data directory
meanwhile; it sees the tenant on its next request.

A tenant that has a directory (an empty one, or a merge) is written through the purge's
generations (storage/erasure/swap.py): its log is copied into `purge.new/`, the import goes
into the copy, and one rename commits it; the next open of the tenant finishes or discards a
swap a crash interrupted. Nothing else may have the tenant open meanwhile: the caller holds
the data directory (no server serving it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO

from storage import files
from storage.erasure import swap
from storage.erasure.compact import rewrite
from storage.errors import Conflict, InvalidRequest, QuotaExceeded
from storage.fsync import fsync_dir, fsync_tree
from storage.log.eventlog import INITIAL_MAP_SIZE, EventLog
from storage.model import Quota
from storage.tenants.tenant import Tenant
from storage.tenants.usage import quota_figures
from storage.transfer import ledger
from storage.transfer.format import Reader
from storage.transfer.load import Drop, ImportStats, Progress, lines_of, load, read_header

STAGING_PREFIX = ".importing-"
LOCK = ".lock"  # flock-ed inside a staging directory while its import runs


def import_tenant(
    data_dir: Path,
    tenant_id: str,
    stream: IO[bytes],
    *,
    merge: bool = False,
    progress: Progress | None = None,
    erased: Mapping[str, int] | None = None,
    drop: Drop | None = None,
    quota: Quota | None = None,
) -> ImportStats:
    """Import an export into DATA_DIR/<tenant_id>: all of it, or (refused, interrupted) nothing.

    A tenant holding live events is refused (Conflict) unless `merge`: then events whose ids
    it holds already are kept as they are and the others added. An event the erasure ledger
    of any tenant of data_dir (or `erased`) names is dropped (ImportStats.erased_dropped);
    events `drop` refuses (past their retention window) are not written. What the tenant
    holds after the import is held to `quota` as appends are (QuotaExceeded, nothing lands).
    """
    root = data_dir / tenant_id
    reader = Reader()
    lines = lines_of(stream)
    header = read_header(lines, reader)
    gone = ledger.every_id(ledger.of_path(data_dir)) | dict(erased or {})
    if not root.exists():
        return _into_new(
            data_dir, tenant_id, header.embedding_dim, lines, reader, progress, gone, drop, quota
        )
    return _into_existing(
        root,
        tenant_id,
        lines,
        reader,
        merge=merge,
        progress=progress,
        erased=gone,
        drop=drop,
        quota=quota,
    )


def within(log: EventLog, quota: Quota | None) -> None:
    """QuotaExceeded if what the log holds (its live events, their bytes and the vectors the
    server owes the events awaiting theirs) is past `quota`'s max_events or max_bytes."""
    if quota is None:
        return
    with log.reader() as r:
        events, size = quota_figures(r)
    refused = Quota(max_events=quota.max_events, max_bytes=quota.max_bytes).refusal(events, size)
    if refused is not None:
        raise QuotaExceeded(
            f"the import would pass the tenant's quota: {refused.detail}; nothing was imported",
            limit=refused.limit,
        )


def _into_new(
    data_dir: Path,
    tenant_id: str,
    dim: int,
    lines: Iterator[bytes],
    reader: Reader,
    progress: Progress | None,
    erased: Mapping[str, int],
    drop: Drop | None = None,
    quota: Quota | None = None,
) -> ImportStats:
    """Build the tenant beside the others and rename it into place."""
    data_dir.mkdir(parents=True, exist_ok=True)
    sweep_stale(data_dir, tenant_id)
    staging = data_dir / f"{STAGING_PREFIX}{tenant_id}-{secrets.token_hex(4)}"
    staging.mkdir()
    try:
        with held(staging):
            stats = build(
                staging, tenant_id, dim, lines, reader, progress, erased, drop=drop, quota=quota
            )
            fsync_tree(staging)
            _rename_into_place(staging, data_dir / tenant_id)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return stats


def build(
    root: Path,
    tenant_id: str,
    dim: int,
    lines: Iterator[bytes],
    reader: Reader,
    progress: Progress | None = None,
    erased: Mapping[str, int] | None = None,
    carried: Mapping[str, int] | None = None,
    *,
    drop: Drop | None = None,
    quota: Quota | None = None,
) -> ImportStats:
    """Make a new tenant at root from the rest of an export (its header read by `reader`):
    the log written in batches, both indexes projected from it, all saved and closed; the
    events the erasure ledger `erased` names are dropped, and the new log keeps `carried`
    as its own ledger (a restore's: what the backup's log kept, and what was applied); events
    `drop` refuses (past their retention window) are not written; what it holds is held to
    `quota` after each batch."""
    tenant = Tenant.open(tenant_id, root, embedding_dim=dim)
    try:
        stats = load(
            tenant,
            lines,
            reader,
            progress=progress,
            erased=erased,
            drop=drop,
            check=lambda: within(tenant.log, quota),
        )
    finally:
        tenant.close()
    ledger.carry(root, {**stats.ledger, **(carried or {})})  # the file's, then the caller's
    return stats


def _rename_into_place(staging: Path, root: Path) -> None:
    """The commit of a new tenant: one rename, refused if the tenant appeared meanwhile."""
    if root.exists():
        raise Conflict(f"tenant {root.name} was written while the import ran; nothing was imported")
    try:
        os.rename(staging, root)  # onto an empty directory made meanwhile too: still atomic
    except OSError as exc:  # not empty: written meanwhile
        raise Conflict(
            f"tenant {root.name} was written while the import ran; nothing was imported"
        ) from exc
    fsync_dir(root.parent)
    (root / LOCK).unlink()  # moved in with the rest; held until the caller lets go


def _into_existing(
    root: Path,
    tenant_id: str,
    lines: Iterator[bytes],
    reader: Reader,
    *,
    merge: bool,
    progress: Progress | None,
    erased: Mapping[str, int],
    drop: Drop | None = None,
    quota: Quota | None = None,
) -> ImportStats:
    """Import into a copy of the tenant's log in purge.new/, then swap it in as a purge does
    (the copy keeps the tenant's erasure ledger)."""
    swap.recover(root)
    log = EventLog.open(root / files.LOG)
    try:
        with log.reader() as r:
            live, last, own = r.count(), r.last_seq(), ledger.of_log(r)
        if live and not merge:
            raise Conflict(
                f"tenant {tenant_id} holds {live} events; import only into an empty tenant, "
                "or merge into this one (--merge)"
            )
        staging = root / swap.STAGING
        swap.remove(staging)
        staging.mkdir()
        if merge:
            with log.reader() as r:
                rewrite(r, staging / files.LOG, max(log.map_size(), INITIAL_MAP_SIZE))
    finally:
        log.close()
    assert reader.header is not None
    try:
        tenant = Tenant.open(tenant_id, staging, embedding_dim=reader.header.embedding_dim)
        try:
            stats = load(
                tenant,
                lines,
                reader,
                keep_before=last if merge else None,
                progress=progress,
                erased=erased,
                drop=drop,
                check=lambda: within(tenant.log, quota),
            )
        finally:
            tenant.close()
        # a new log (unless a merge copied the tenant's): its ledger goes on, with the file's
        ledger.carry(staging, {**stats.ledger, **({} if merge else own)})
        (staging / swap.PENDING).unlink(missing_ok=True)  # the tenant's own marker stays
        fsync_tree(staging)
        swap.commit(root)
    except BaseException:
        swap.remove(staging)
        raise
    swap.roll_forward(root)
    swap.discard_old(root)
    return stats


def sweep_stale(data_dir: Path, tenant_id: str) -> None:
    """Remove the staging directories of this tenant's imports that ended without finishing
    (killed): their lock is free. One still held belongs to an import under way."""
    prefix = f"{STAGING_PREFIX}{tenant_id}-"
    for entry in os.scandir(data_dir):
        if entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(BlockingIOError), held(Path(entry.path), create=False):
                shutil.rmtree(entry.path, ignore_errors=True)


@contextlib.contextmanager
def held(staging: Path, *, create: bool = True) -> Iterator[None]:
    """Hold the staging directory's lock (BlockingIOError if another process does)."""
    path = staging / LOCK
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError:  # a stage killed before its lock was made: nobody holds it
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def check_target(data_dir: Path, tenant_id: str) -> None:
    """InvalidRequest unless tenant_id can name a directory of data_dir (the caller validated
    its form; this refuses what would leave the directory)."""
    if "/" in tenant_id or tenant_id in (".", "..") or tenant_id.startswith((".", "_")):
        raise InvalidRequest("not a tenant id")

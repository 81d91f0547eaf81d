"""Hot backup of a whole data directory, and restore into a new one.

A backup is a directory:

    DEST/BACKUP.json               what it holds (format, version, when, each tenant's count)
    DEST/tenants/<id>/events/      each tenant's log: a logical copy of one read transaction
    DEST/<name>/                   each other LMDB environment asked for (the control database)
    DEST/_receipts/                the erasure receipts of those tenants, the signing key and
                                   the record of copies (storage/transfer/receipt_files.py)

It is taken from another process than the server's, while the server serves: each log is read
in one LMDB read transaction (a slot in its lock file, never a lock the server's writer waits
for) and copied record by record into a fresh environment (storage/erasure/compact.py), so
the copy holds live records only: no free page, no deleted event's bytes, no index. Tenants are
copied one after another, each consistent in itself. The whole is built under a hidden name
beside DEST and renamed into place once durable: a backup killed half-way leaves no DEST.

A restore rebuilds a data directory from a backup: every tenant is imported from its log's
records through the import path (storage/transfer/load.py), so its keyword and vector indexes
are built from the log and memory stays bounded by a batch; the other environments are copied
as they are. It is built under a hidden name beside the target and renamed into place once
durable: a restore killed half-way leaves the target absent (or as empty as it was).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import lmdb
import msgspec

from storage import files
from storage.erasure import swap
from storage.erasure.compact import rewrite
from storage.errors import Conflict, InvalidRequest, NotFound
from storage.fsync import fsync_dir, fsync_tree
from storage.log.eventlog import INITIAL_MAP_SIZE, snapshot
from storage.model import Quota
from storage.readlog.logfile import copy_whole
from storage.receipts import DIR as RECEIPTS
from storage.space import full_disk_as
from storage.tenants.directory import tenant_dirs
from storage.transfer import ledger, receipt_files
from storage.transfer.export import export_lines, log_snapshot
from storage.transfer.format import Reader
from storage.transfer.landing import LOCK, build, held
from storage.transfer.ledger import Ledger
from storage.transfer.load import Drop, ImportStats, read_header

FORMAT = "memspine-backup"
FORMAT_VERSION = 1
MANIFEST = "BACKUP.json"
TENANTS = "tenants"
PARTIAL = ".partial-"  # DEST's hidden stage: .<DEST name>.partial-<random>
RESTORING = ".restoring-"

Progress = Callable[[str, int], None]  # told the tenant id and how many of its events are done


class TenantEntry(msgspec.Struct, frozen=True):
    """One tenant of a backup."""

    tenant_id: str
    events: int


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """BACKUP.json."""

    format: str
    version: int
    taken_at: int  # microseconds since the epoch, when the first snapshot was taken
    tenants: list[TenantEntry]
    environments: list[str] = []


class BackupStats(msgspec.Struct, frozen=True, kw_only=True):
    """What a backup or a restore did."""

    path: str
    taken_at: int
    tenants: int
    events: int
    environments: list[str]
    seconds: float
    erased_dropped: int = 0  # events a restore dropped as erasure ledgers name them
    retention_dropped: int = 0  # a restore's events past their retention window, not written
    receipts: int = 0  # signed erasure receipts carried (a backup) or put back (a restore)


def backup(
    data_dir: Path,
    dest: Path,
    *,
    environments: Sequence[tuple[str, int]] = (),
    progress: Progress | None = None,
) -> BackupStats:
    """Copy every tenant's log of data_dir, and each (name, map size) LMDB environment under
    it that exists, into the new directory dest; all of it, or (killed, failed) no dest."""
    started = time.monotonic()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise Conflict(f"{dest} exists and is not empty: a backup goes into a new directory")
    if not data_dir.is_dir():
        raise InvalidRequest(f"{data_dir} is not a data directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _stage(dest, PARTIAL) as stage, _full_disk_said(dest, "backup"):
        taken_at = time.time_ns() // 1000
        entries = []
        for tenant_id in tenant_dirs(data_dir):
            try:
                with log_snapshot(data_dir / tenant_id) as r:
                    size = _file_size(data_dir / tenant_id)
                    dest_log = stage / TENANTS / tenant_id / files.LOG
                    rewrite(r, dest_log, max(INITIAL_MAP_SIZE, 2 * size))
                    entries.append(TenantEntry(tenant_id, r.count()))
            except NotFound:  # erased since the directory was listed: not in the backup
                continue
            if progress is not None:
                progress(tenant_id, entries[-1].events)
        copied = [n for n, size in environments if _copy_env(data_dir / n, stage / n, size)]
        for entry in entries:  # after the control plane: they hold every record its heads name
            copy_whole(data_dir / entry.tenant_id, stage / TENANTS / entry.tenant_id)
        receipts = receipt_files.carry(data_dir, stage, [e.tenant_id for e in entries])
        manifest = Manifest(
            format=FORMAT,
            version=FORMAT_VERSION,
            taken_at=taken_at,
            tenants=entries,
            environments=copied,
        )
        (stage / MANIFEST).write_bytes(msgspec.json.format(msgspec.json.encode(manifest)) + b"\n")
        fsync_tree(stage)
        _into_place(stage, dest)
    return BackupStats(
        path=str(dest),
        taken_at=taken_at,
        tenants=len(entries),
        events=sum(e.events for e in entries),
        environments=copied,
        seconds=time.monotonic() - started,
        receipts=receipts,
    )


def _file_size(root: Path) -> int:
    """The size of a tenant's log file (a bound on what a copy of it needs)."""
    for path in (root / swap.READY / files.LOG, root / files.LOG):
        with contextlib.suppress(OSError):
            return (path / "data.mdb").stat().st_size
    return 0


def _copy_env(source: Path, dest: Path, map_size: int) -> bool:
    """A compacted copy of an LMDB environment from one read transaction; False if none."""
    if not (source / "data.mdb").is_file():
        return False
    env = lmdb.open(str(source), readonly=True, create=False, map_size=map_size, lock=True)
    try:
        dest.mkdir(mode=0o700)
        env.copy(str(dest), compact=True)
    finally:
        env.close()
    return True


def read_manifest(src: Path) -> Manifest:
    """A backup's manifest, checked; InvalidRequest for anything that is not a backup we read."""
    try:
        raw = (src / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise InvalidRequest(f"{src} is not a memspine backup (it has no {MANIFEST})") from None
    try:
        manifest = msgspec.json.decode(raw, type=Manifest)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidRequest(f"{src / MANIFEST} is damaged: {exc}") from None
    if manifest.format != FORMAT:
        raise InvalidRequest(f"{src} is not a memspine backup (format {manifest.format!r})")
    if manifest.version != FORMAT_VERSION:
        raise InvalidRequest(
            f"{src} is a backup of format version {manifest.version}; this version of "
            f"memspine reads version {FORMAT_VERSION}"
        )
    tenants = {entry.tenant_id for entry in manifest.tenants}
    for entry in manifest.tenants:
        if not _plain_name(entry.tenant_id, hidden="._"):
            raise InvalidRequest(f"{src / MANIFEST} names a tenant {entry.tenant_id!r}")
        if not _plain_file(src, (TENANTS, entry.tenant_id, files.LOG, "data.mdb")):
            raise InvalidRequest(
                f"{src} lacks the log of tenant {entry.tenant_id} as a plain file inside its "
                "tenant's directory (a link or a missing file is refused)"
            )
    for name in manifest.environments:
        if not _plain_name(name, hidden=".") or name in {TENANTS, RECEIPTS, *tenants}:
            raise InvalidRequest(f"{src / MANIFEST} names an environment {name!r}")
        if not _plain_file(src, (name, "data.mdb")):
            raise InvalidRequest(
                f"{src} lacks environment {name} as a plain file inside its directory "
                "(a link or a missing file is refused)"
            )
    return manifest


def _plain_name(name: str, *, hidden: str) -> bool:
    """Whether a manifest's name is one directory entry: not empty, no separator, not starting
    with a character of `hidden` (which holds ".": no `.` or `..`)."""
    return bool(name) and name[0] not in hidden and not any(c in name for c in "/\\\0")


def _plain_file(src: Path, parts: tuple[str, ...]) -> bool:
    """Whether src/parts... is a regular file reached through real directories only: no
    component a symbolic link (a crafted backup must not copy a file from outside itself, or
    another tenant's log under a new id, into the restored directory)."""
    path = src
    for i, part in enumerate(parts):
        path = path / part
        try:
            st = path.lstat()
        except OSError:
            return False
        last = i == len(parts) - 1
        if not (stat.S_ISREG(st.st_mode) if last else stat.S_ISDIR(st.st_mode)):
            return False
    return True


def restore(
    src: Path,
    data_dir: Path,
    *,
    default_dim: int = 384,
    progress: Progress | None = None,
    erased: Mapping[str, Ledger] | None = None,
    drop: Callable[[str], Drop | None] | None = None,
    quota_of: Callable[[Path, str], Quota | None] | None = None,
) -> BackupStats:
    """Rebuild data_dir (absent or empty) from the backup at src, indexes from the logs; all
    of it, or (refused, killed, failed) nothing. Every event an erasure ledger names (the
    backup's own, or one of `erased`, tenant id -> ledger) is dropped before the data
    directory exists, and each restored log keeps its tenant's ledgers. `drop(tenant_id)` says
    which of a tenant's events not to write (past their retention window); each tenant is held
    to quota_of(the data directory being built, with its environments, its id) as an import
    is."""
    started = time.monotonic()
    manifest = read_manifest(src)
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise Conflict(f"{data_dir} is not empty: restore into a new data directory")
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    events = dropped = expired = 0
    applied = dict(erased or {})
    every = ledger.every_id(applied)
    with _stage(data_dir, RESTORING) as stage, _full_disk_said(data_dir, "restore"):
        for name in manifest.environments:  # first: the control plane holds the quotas
            _copy_files(src / name, stage / name)
        receipts = receipt_files.put_back(src, stage, [e.tenant_id for e in manifest.tenants])
        for entry in manifest.tenants:
            mine = applied.get(entry.tenant_id, {})
            its_drop = None if drop is None else drop(entry.tenant_id)
            quota = None if quota_of is None else quota_of(stage, entry.tenant_id)
            stats = _restore_tenant(
                src, stage, entry, default_dim, progress, every, mine, its_drop, quota
            )
            events += stats.events
            dropped += stats.erased_dropped
            expired += stats.retention_dropped
        fsync_tree(stage)
        _into_place(stage, data_dir)
    return BackupStats(
        path=str(data_dir),
        taken_at=manifest.taken_at,
        tenants=len(manifest.tenants),
        events=events,
        environments=list(manifest.environments),
        seconds=time.monotonic() - started,
        erased_dropped=dropped,
        retention_dropped=expired,
        receipts=receipts,
    )


def _restore_tenant(
    src: Path,
    stage: Path,
    entry: TenantEntry,
    default_dim: int,
    progress: Progress | None,
    every: Mapping[str, int],
    mine: Mapping[str, int],
    drop: Drop | None = None,
    quota: Quota | None = None,
) -> ImportStats:
    """Import one tenant of a backup from its log's records, less the events the ledgers name
    (its own, `every` tenant's) and those `drop` refuses, held to `quota`; what the import
    did."""
    log = src / TENANTS / entry.tenant_id / files.LOG
    # Nobody writes a backup: no lock file, so a backup on read-only media restores too.
    with snapshot(log, lock=False) as r:
        lines = export_lines(r, entry.tenant_id, default_dim=default_dim)
        reader = Reader()
        header = read_header(lines, reader)
        told = None if progress is None else (lambda n: progress(entry.tenant_id, n))
        root = stage / entry.tenant_id
        own = ledger.of_log(r)
        gone = {**every, **own}
        kept = {**own, **mine}
        dim = header.embedding_dim
        stats = build(
            root, entry.tenant_id, dim, lines, reader, told, gone, kept, drop=drop, quota=quota
        )
    copy_whole(src / TENANTS / entry.tenant_id, root)  # who read what goes with the events
    if stats.events + stats.erased_dropped + stats.retention_dropped != entry.events:
        raise InvalidRequest(
            f"tenant {entry.tenant_id}: the backup's manifest counts {entry.events} events, "
            f"its log holds {stats.events}"
        )
    return stats


def _copy_files(source: Path, dest: Path) -> None:
    """Copy an environment's data file (its lock file is made on first open)."""
    dest.mkdir(mode=0o700)
    shutil.copyfile(source / "data.mdb", dest / "data.mdb")
    os.chmod(dest / "data.mdb", 0o600)


@contextlib.contextmanager
def _full_disk_said(target: Path, what: str) -> Iterator[None]:
    """A write that failed for a full disk (an OSError, an LMDB error) as DiskFull naming the
    target: the operator reads the cause in one line, not a traceback."""
    detail = (
        f"the disk holding {target} is full: the {what} could not be written and nothing "
        f"was left there; free space and run it again"
    )
    with full_disk_as(detail, target.parent):
        yield


@contextlib.contextmanager
def _stage(target: Path, kind: str) -> Iterator[Path]:
    """A hidden, locked directory beside target to build it in; removed unless renamed into
    place. Stages of the same target left by a killed run (their lock free) are removed first."""
    prefix = f".{target.name}{kind}"
    for entry in os.scandir(target.parent):
        if entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(BlockingIOError), held(Path(entry.path), create=False):
                shutil.rmtree(entry.path, ignore_errors=True)
    stage = target.parent / f"{prefix}{secrets.token_hex(4)}"
    stage.mkdir(mode=0o700)  # a backup holds every tenant's memory
    try:
        with held(stage):
            yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # gone already once renamed into place


def _into_place(stage: Path, target: Path) -> None:
    """The commit: one rename of the stage onto the target's name (an empty directory there is
    replaced), made durable; the stage's lock file goes once it is in place."""
    try:
        os.rename(stage, target)
    except OSError as exc:
        raise Conflict(f"{target} was written meanwhile; nothing was changed") from exc
    fsync_dir(target.parent)
    (target / LOCK).unlink(missing_ok=True)
    fsync_dir(target)

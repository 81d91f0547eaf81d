"""memspine-admin's commands on tenants' data: export, import, backup, restore, reembed, tenant adopt.

They work on the data directory directly (storage/transfer/), like the other commands; what
each may do while the server serves the directory is said in docs/operations.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from memspine_admin.command import actor, control_url, local_tenants
from memspine_admin.command import emit as _emit
from memspine_admin.control import CONTROL_DIR, MAP_SIZE
from memspine_admin.plane import ControlPlane, control_exists, open_control
from memspine_admin.quotas import quota_for
from memspine_admin.records import LOCAL_TENANT, UUID, check_tenant_id, now_us
from storage.datalock import DataDirBusy, hold
from storage.errors import Conflict, InvalidRequest, MemspineError, NotFound
from storage.fsync import fsync_dir, publish_durably
from storage.tenants.directory import is_tenant_id

# storage.transfer (the stores: Tantivy, hnswlib, LMDB) is imported by the commands that use
# it, so that every other command of the CLI starts without it.

DAY_US = 86_400 * 1_000_000
DEFAULT_MAX_AGE_DAYS = 30
LOCAL_ID = (
    "in local mode a tenant id is 1 to 64 characters from A-Z, a-z, 0-9, '_' and '-', "
    "starting with a letter or a digit, or a UUID"
)


class Progress:
    """A progress bar on stderr when it is a terminal (rich, which Litestar brings), else
    nothing: scripts and --json read only the result."""

    def __init__(self, args: argparse.Namespace, what: str, total: int | None) -> None:
        self._bar: Any = None
        self._task: Any = None
        if args.json or not sys.stderr.isatty():
            return
        try:
            from rich.progress import Progress as Bar
        except ImportError:  # no bar without rich; the command is the same
            return
        self._bar = Bar(transient=True, console=None)
        self._bar.start()
        self._task = self._bar.add_task(what, total=total)

    def update(self, done: int, total: int | None = None) -> None:
        """How far along it is."""
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total)

    def close(self) -> None:
        """Take the bar off the terminal."""
        if self._bar is not None:
            self._bar.stop()


@contextlib.contextmanager
def progress(args: argparse.Namespace, what: str, total: int | None = None) -> Iterator[Progress]:
    """A progress bar for the length of the block."""
    bar = Progress(args, what, total)
    try:
        yield bar
    finally:
        bar.close()


def _url() -> str | None:
    return control_url()


def _plane(data_dir: Path) -> ControlPlane:
    return open_control(data_dir, _url(), actor=actor())


def _controlled(data_dir: Path) -> bool:
    """Whether issued keys are in force for this data directory (tenant ids are UUIDv4s)."""
    return control_exists(data_dir, _url())


def tenant_dir(data_dir: Path, value: str) -> str:
    """The directory name of a tenant id given on the command line: a UUIDv4 once issued keys
    are in force, a local-mode id (memspine/auth.py) before; InvalidRequest otherwise."""
    if _controlled(data_dir):
        return check_tenant_id(value)
    if UUID.match(value):
        return value.lower()
    if not LOCAL_TENANT.match(value):
        raise InvalidRequest(LOCAL_ID)
    return value


NICE = 10


def beside_the_server() -> None:
    """Take a lower CPU priority for a command that runs while the server serves (export,
    backup): on a busy machine the server's requests get the cores first."""
    with contextlib.suppress(OSError):
        os.nice(NICE)


@contextlib.contextmanager
def unserved(data_dir: Path, why: str) -> Iterator[None]:
    """Hold the data directory as the server would, so that none starts meanwhile; Conflict
    naming the holder when a server (or the embedded MCP bridge) serves it."""
    try:
        lock = hold(data_dir, "memspine-admin")
    except DataDirBusy as busy:
        raise Conflict(f"{busy.who()} serves {data_dir}: {why}") from None
    try:
        yield
    finally:
        lock.close()


PURPOSE_HELP = "why the events are read: kept in the tenant's read records (docs/audit.md)"


def cli_purpose(value: str | None) -> str | None:
    """A --purpose, checked as the Memspine-Purpose header is (at most 200 bytes, no control
    characters)."""
    from storage.readlog import check_purpose_text

    return None if not value else check_purpose_text(value)


def record_cli(
    data_dir: Path, tenant_id: str, command: str, event_ids: list[str], purpose: str | None
) -> None:
    """Record that this command read these events of the tenant (memspine_admin/readaudit.py):
    the OS user as the key id, the chain's head to the control plane when there is one."""
    from memspine_admin.readaudit import record_cli_read

    def control() -> ControlPlane | None:
        return _plane(data_dir) if _controlled(data_dir) else None

    record_cli_read(
        data_dir, tenant_id, command, event_ids, who=actor(), purpose=purpose, control=control
    )


def cmd_export(args: argparse.Namespace) -> int:
    """Write a tenant's export (NDJSON, docs/api.md) from one snapshot; safe while the server runs."""
    from storage.transfer.export import dir_export

    beside_the_server()
    tenant_id = tenant_dir(args.data_dir, args.tenant_id)
    root = args.data_dir / tenant_id
    size = events = 0
    purpose = cli_purpose(args.purpose)

    def write(out: IO[bytes]) -> None:
        nonlocal size, events
        exported: list[str] = []
        with (
            dir_export(root, tenant_id, exported=exported) as lines,
            progress(args, "exporting") as bar,
        ):
            for line in lines:
                out.write(line)
                size += len(line)
                if line.startswith(b'{"type":"event"'):
                    events += 1
                    if events % 1000 == 0:
                        bar.update(events)
        out.flush()  # the record follows the lines (stdout) or precedes the file's name (--out)
        record_cli(args.data_dir, tenant_id, "export", exported, purpose)

    from storage.receipts import record_copy

    if args.out is None:
        write(sys.stdout.buffer)
        sys.stdout.buffer.flush()
        record_copy(args.data_dir, "export", tenant_id)  # for erasure receipts
        return 0
    # Through an unnamed file beside it: a killed export leaves no file, whole or partial.
    try:
        publish_durably(Path(args.out), write)
    except OSError as exc:
        if exc.filename is None:  # a write to the out file: its name, not the data directory's
            exc.filename = str(args.out)
        raise
    record_copy(args.data_dir, "export", tenant_id, str(args.out))
    payload = {"tenant_id": tenant_id, "events": events, "bytes": size, "out": str(args.out)}
    _emit(args, payload, f"exported {events} events of tenant {tenant_id} to {args.out}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Import an export into a tenant: all of it or, refused or interrupted, nothing."""
    from storage.transfer.landing import import_tenant

    tenant_id = tenant_dir(args.data_dir, args.tenant_id)
    root = args.data_dir / tenant_id
    drop = _past_window(args.data_dir, tenant_id)
    stream: IO[bytes] = open(args.input, "rb") if args.input else sys.stdin.buffer  # noqa: SIM115
    try:
        with progress(args, "importing") as bar:
            if root.exists():
                # Into a tenant that has a directory: no server may hold it open meanwhile.
                why = f"stop it to import into tenant {tenant_id}, which has a directory there"
                with unserved(args.data_dir, why):
                    stats = import_tenant(
                        args.data_dir,
                        tenant_id,
                        stream,
                        merge=args.merge,
                        progress=bar.update,
                        drop=drop,
                        quota=quota_for(args.data_dir, tenant_id),
                    )
            else:
                quota = quota_for(args.data_dir, tenant_id)
                stats = import_tenant(
                    args.data_dir, tenant_id, stream, progress=bar.update, drop=drop, quota=quota
                )
    finally:
        if args.input:
            stream.close()
    payload: dict[str, Any] = {"tenant_id": tenant_id, "from_tenant": stats.tenant_id}
    payload |= {"events": stats.events, "skipped": stats.skipped, "lines": stats.lines}
    payload["erased_dropped"] = stats.erased_dropped
    payload["retention_dropped"] = stats.retention_dropped
    human = f"imported {stats.events} events into tenant {tenant_id}"
    if stats.skipped:
        human += f" ({stats.skipped} held already, kept as they were)"
    if stats.retention_dropped:
        human += f"; dropped {stats.retention_dropped} past their retention window"
    human += f"\nerased_dropped: {stats.erased_dropped}"
    registered = _registered(args.data_dir, tenant_id)
    payload["registered"] = registered
    if registered is False:
        human += f"\nno tenant record has this id yet: memspine-admin tenant create NAME --id {tenant_id}"
    _emit(args, payload, human)
    return 0


def cmd_reembed(args: argparse.Namespace) -> int:
    """Make a server-space tenant's vectors again with the embedder MEMSPINE_EMBEDDER names."""
    from storage.embedders.settings import embedder_from_env
    from storage.tenants.reembed import reembed

    tenant_id = tenant_dir(args.data_dir, args.tenant_id)
    root = args.data_dir / tenant_id
    if not (root / "events").is_dir():
        raise NotFound("no tenant with that id in this data directory")
    try:
        embedder = embedder_from_env(os.environ)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    if embedder is None:
        raise InvalidRequest("MEMSPINE_EMBEDDER is none: set the embedder to re-embed with")
    why = f"stop it to re-embed tenant {tenant_id}"
    try:
        with unserved(args.data_dir, why), progress(args, "re-embedding") as bar:
            stats = reembed(root, embedder, progress=bar.update)
    finally:
        embedder.close()
    payload = {"tenant_id": tenant_id, **msgspec.structs.asdict(stats)}
    human = (
        f"re-embedded {stats.events} events of tenant {tenant_id} with {stats.model} "
        f"({stats.dim} dimensions; before: {stats.previous_model}, {stats.previous_dim})"
    )
    _emit(args, payload, human)
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    """Open every tenant once, while no server runs, to bring its files to this version's format."""
    # As each tenant's first open would: a log migration rewrites every record (seconds at
    # 100,000 events), which a client's first request would otherwise wait for.
    from storage.tenants.directory import tenant_dirs
    from storage.tenants.manager import TenantManager

    ids = tenant_dirs(args.data_dir)
    started = time.perf_counter()
    manager = TenantManager(args.data_dir, max_open=1)
    try:
        why = "stop it to upgrade its tenants"
        with unserved(args.data_dir, why), progress(args, "upgrading", len(ids)) as bar:
            for done, tenant_id in enumerate(ids, 1):
                with manager.use(tenant_id, create=False):
                    pass
                bar.update(done, len(ids))
    finally:
        manager.close_all()
    secs = round(time.perf_counter() - started, 3)
    _emit(args, {"tenants": len(ids), "seconds": secs}, f"{len(ids)} tenants upgraded in {secs} s")
    return 0


def _past_window(data_dir: Path, tenant_id: str) -> Callable[[Any], bool]:
    """Whether an imported event is past its retention window now and no legal hold keeps it:
    the tenant's own windows and holds (if the control plane has a record of it), else
    MEMSPINE_RETENTION_DAYS of this shell."""
    from memspine_admin.retention_cmds import server_default
    from storage.read.retention import Policy, holds_blocking

    own, holds = None, []
    if _controlled(data_dir):
        with _plane(data_dir) as db:
            record = db.get_tenant(tenant_id)
            own = None if record is None else record.retention
            holds = db.list_holds(tenant_id)
    policy, now = Policy.of(own, server_default()), now_us()
    return lambda e: policy.is_due(e.kind, e.ts, now) and holds_blocking(holds, e) is None


def _restore_drops(src: Path) -> Callable[[str], Callable[[Any], bool] | None]:
    """Which events of each tenant a restore drops: those past their window now (the tenant's
    windows as the backup's control database or MEMSPINE_CONTROL_URL holds them, else
    MEMSPINE_RETENTION_DAYS of this shell) that no legal hold keeps."""
    from memspine_admin.control import retention_in_copy
    from memspine_admin.retention_cmds import server_default
    from storage.read.retention import Policy, holds_blocking

    url = os.environ.get("MEMSPINE_CONTROL_URL", "").strip() or None
    plans: dict[str, tuple[dict[str, int] | None, list[Any]]] = {}
    if url is not None:
        with open_control(src, url) as db:
            plans = {
                t.tenant_id: (t.retention, db.list_holds(t.tenant_id)) for t in db.list_tenants()
            }
    elif (src / CONTROL_DIR / "data.mdb").is_file():
        plans = retention_in_copy(src / CONTROL_DIR)
    default, now = server_default(), now_us()

    def drop(tenant_id: str) -> Callable[[Any], bool] | None:
        own, holds = plans.get(tenant_id, (None, []))
        policy = Policy.of(own, default)
        if not policy.windows:
            return None
        return lambda e: policy.is_due(e.kind, e.ts, now) and holds_blocking(holds, e) is None

    return drop


def _registered(data_dir: Path, tenant_id: str) -> bool | None:
    """Whether the control plane has a record of the tenant; None in local mode."""
    if not _controlled(data_dir):
        return None
    with _plane(data_dir) as db:
        return db.get_tenant(tenant_id) is not None


def cmd_backup(args: argparse.Namespace) -> int:
    """Copy every tenant's log and the control database into the new directory DEST, hot."""
    from storage.transfer.backup import backup

    beside_the_server()
    dest = Path(args.dest)
    with progress(args, "backing up") as bar:
        done = 0

        def told(_tenant_id: str, _events: int) -> None:
            nonlocal done
            done += 1
            bar.update(done)

        stats = backup(args.data_dir, dest, environments=[(CONTROL_DIR, MAP_SIZE)], progress=told)
    from storage.receipts import record_copy

    record_copy(args.data_dir, "backup", None, str(dest.resolve()))  # for erasure receipts
    human = (
        f"backed up {stats.tenants} tenants ({stats.events} events)"
        + (" and the control database" if CONTROL_DIR in stats.environments else "")
        + f" to {dest} in {stats.seconds:.1f} s"
    )
    if stats.receipts:
        human += f", with {stats.receipts} erasure receipts"
    if _url() is not None:
        human += "\nthe control plane is in PostgreSQL: back it up there (pg_dump)"
    _emit(args, stats, human)
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    """Rebuild a new data directory from a backup, every index from the logs."""
    from storage.transfer.backup import read_manifest, restore

    src = Path(args.src)
    manifest = read_manifest(src)
    age_days = (time.time_ns() // 1000 - manifest.taken_at) / DAY_US
    if age_days > args.max_age_days:
        raise Conflict(
            f"the backup is {age_days:.0f} days old, older than --max-age-days "
            f"{args.max_age_days}: events erased since it was taken would come back "
            "(docs/operations.md, Backups and erasure); pass a larger --max-age-days to "
            "restore it anyway, then erase them again"
        )
    total = sum(t.events for t in manifest.tenants)
    with progress(args, "restoring", total) as bar:
        before = 0
        seen: dict[str, int] = {}

        def told(tenant_id: str, events: int) -> None:
            nonlocal before
            if tenant_id not in seen:
                before = sum(seen.values())
            seen[tenant_id] = events
            bar.update(before + events)

        erased = _ledgers_for_restore(src, args.data_dir, manifest.taken_at, args.ledger_from)
        # Each log records its dimension; each tenant is held to its quota in the restored
        # control plane (environments are copied first), as the server would hold it.
        stats = restore(
            src,
            args.data_dir,
            progress=told,
            erased=erased,
            drop=_restore_drops(src),
            quota_of=quota_for,
        )
    human = (
        f"restored {stats.tenants} tenants ({stats.events} events)"
        + (" and the control database" if CONTROL_DIR in stats.environments else "")
        + f" into {args.data_dir} in {stats.seconds:.1f} s"
    )
    if stats.receipts:
        human += f", with {stats.receipts} erasure receipts"
    if stats.retention_dropped:
        human += f"; dropped {stats.retention_dropped} events past their retention window"
    human += f"\nerased_dropped: {stats.erased_dropped}"
    _emit(args, stats, human)
    return 0


def _ledgers_for_restore(
    src: Path, target: Path, taken_at: int, extra: list[str]
) -> dict[str, dict[str, int]]:
    """The erasure ledgers a restore applies (docs/erasure.md): MEMSPINE_DATA_DIR's when it is
    another directory that exists, every newer backup's beside src, and each --ledger-from."""
    from storage.transfer import ledger
    from storage.transfer.backup import MANIFEST, read_manifest

    paths = [Path(p) for p in extra]
    live = os.environ.get("MEMSPINE_DATA_DIR")
    if live and Path(live).is_dir() and Path(live).resolve() != target.resolve():
        paths.append(Path(live))
    for sibling in sorted(src.resolve().parent.iterdir()):
        if sibling.resolve() != src.resolve() and (sibling / MANIFEST).is_file():
            with contextlib.suppress(MemspineError):
                if read_manifest(sibling).taken_at > taken_at:
                    paths.append(sibling)
    for path in paths:
        if not path.exists():
            raise NotFound(f"--ledger-from {path}: no such data directory or backup")
    return ledger.merged(ledger.of_path(p) for p in paths)


def cmd_tenant_adopt(args: argparse.Namespace) -> int:
    """Register a local-mode tenant directory (as init lists them) as a tenant named NAME."""
    data_dir: Path = args.data_dir
    with _plane(data_dir) as db:
        known = {t.tenant_id for t in db.list_tenants()}
        if args.dirname in known:
            raise Conflict(f"{args.dirname} is a tenant already")
        if args.dirname not in local_tenants(data_dir, known):
            raise NotFound(f"no local-mode tenant directory {args.dirname!r} in {data_dir}")
        dropped = _apply_ledgers(data_dir, args.dirname)
        if is_tenant_id(args.dirname):  # its name is a tenant id already: nothing moves
            tenant = db.create_tenant(args.name, actor=actor(), tenant_id=args.dirname)
            renamed = False
        else:
            why = f"stop it to adopt {args.dirname}, whose directory is renamed to its tenant id"
            with unserved(data_dir, why):
                tenant = _adopt_renamed(db, data_dir, args.dirname, args.name, actor())
            renamed = True
    payload = {"tenant_id": tenant.tenant_id, "name": tenant.name, "dirname": args.dirname}
    payload["erased_dropped"] = dropped
    human = f"adopted {args.dirname} as tenant {tenant.tenant_id} ({tenant.name})"
    human += f"\nerased_dropped: {dropped}"
    if renamed:
        human += f"; its directory is now {data_dir / tenant.tenant_id}"
    human += f"\nissue it a key: memspine-admin key create {tenant.tenant_id} NAME"
    _emit(args, payload, human)
    return 0


def _apply_ledgers(data_dir: Path, dirname: str) -> int:
    """Erase from a directory being adopted the events any erasure ledger of the data directory
    names (a copy brought in from elsewhere may hold them), before any key can read it."""
    from storage.transfer import ledger
    from storage.transfer.export import log_snapshot

    every = ledger.every_id(ledger.of_path(data_dir))
    with log_snapshot(data_dir / dirname) as r:
        if not any(r.exists(e) for e in every):
            return 0
    why = f"stop it to adopt {dirname}: events erased elsewhere must leave it first"
    with unserved(data_dir, why):
        return ledger.apply(data_dir / dirname, dirname, every)


def _adopt_renamed(db: Any, data_dir: Path, dirname: str, name: str, who: str) -> Any:
    """Rename the directory to a new tenant id, then record the tenant. The rename comes
    first: killed between the two, the directory is an unregistered one under its new id,
    which init lists and adopt takes (a record without its directory would be an empty tenant)."""
    import uuid

    tenant_id = str(uuid.uuid4())
    os.rename(data_dir / dirname, data_dir / tenant_id)
    fsync_dir(data_dir)
    try:
        return db.create_tenant(name, actor=who, tenant_id=tenant_id)
    except MemspineError:
        os.rename(data_dir / tenant_id, data_dir / dirname)  # a name in use: as it was
        fsync_dir(data_dir)
        raise


def add_commands(
    sub: Any, tenant_sub: Any, command: Callable[..., argparse.ArgumentParser]
) -> None:
    """The data commands, in the parser of memspine_admin/cli.py."""
    p = command(sub, "export", cmd_export)
    p.add_argument("tenant_id")
    p.add_argument("--out", default=None, help="write to this file (default: stdout)")
    p.add_argument("--purpose", default=None, help=PURPOSE_HELP)
    p = command(sub, "import", cmd_import)
    p.add_argument("tenant_id")
    p.add_argument("--in", dest="input", default=None, help="read this file (default: stdin)")
    p.add_argument(
        "--merge", action="store_true", help="into a tenant holding events: add what it lacks"
    )
    p = command(sub, "backup", cmd_backup)
    p.add_argument("dest", help="a new (or empty) directory")
    p = command(sub, "restore", cmd_restore)
    p.add_argument("src", help="a backup made by memspine-admin backup")
    p.add_argument(
        "--max-age-days",
        type=float,
        default=DEFAULT_MAX_AGE_DAYS,
        help=f"refuse an older backup (default {DEFAULT_MAX_AGE_DAYS}; docs/operations.md)",
    )
    p.add_argument(
        "--ledger-from",
        action="append",
        default=[],
        help="also apply the erasure ledger of this data directory or backup (repeatable)",
    )
    p = command(sub, "reembed", cmd_reembed)
    p.add_argument("tenant_id")
    command(sub, "upgrade", cmd_upgrade)
    p = command(tenant_sub, "adopt", cmd_tenant_adopt)
    p.add_argument("dirname", help="a local-mode tenant's directory, as init lists them")
    p.add_argument("name")

"""memspine-admin: create the control database and manage tenants, keys and the audit log;
move tenants' data (memspine_admin/data.py)."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec

from memspine_admin import data, foreign, keys, retention_cmds, subjects
from memspine_admin.command import (
    EXIT_ABORTED,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_PENDING,
    EXIT_USAGE,
    actor,
    control_url,
    local_tenants,
)
from memspine_admin.command import emit as _emit
from memspine_admin.command import open_plane as _open
from memspine_admin.command import when as _when
from memspine_admin.plane import init_control
from memspine_admin.readaudit import verify_reads
from memspine_admin.records import LIMITS, KeyCounts, TenantRecord, now_us
from storage.errors import Conflict, DiskFull, MemspineError, NotFound
from storage.space import names_full_disk
from storage.tenants.directory import erase_tenant_dir
from storage.tenants.usage import TenantUsage, closed_usage


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)


def _confirm(args: argparse.Namespace, question: str) -> bool:
    """Ask on stdin unless --yes; anything but y/yes (or end of input) means no."""
    if args.yes:
        return True
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


ADOPT = "memspine-admin tenant adopt DIRNAME NAME"


def has_command(*path: str) -> bool:
    """Whether this version of the CLI has the command `memspine-admin PATH...`."""
    parser = build_parser()
    for name in path:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or name not in sub.choices:
            return False
        parser = sub.choices[name]
    return True


def _adopt_hint() -> str:
    """How to adopt a local tenant: the command if this version has it, else that it is coming."""
    if has_command("tenant", "adopt"):
        return f"adopt each that should stay reachable: {ADOPT}"
    return f"adopting them comes in a later version ({ADOPT}); until then they stay unreachable"


def cmd_init(args: argparse.Namespace) -> int:
    """Create the control database."""
    created = init_control(args.data_dir, control_url(), actor=actor())
    with _open(args) as db:
        path = db.where()
        generation = db.generation()
        stranded = local_tenants(args.data_dir, {t.tenant_id for t in db.list_tenants()})
    human = (
        f"created control database at {path}"
        if created
        else f"control database already exists at {path}"
    )
    if created:
        human += "\nfrom now on the server accepts only issued keys"
    if stranded:
        count = f"{len(stranded)} local-mode tenant" + ("" if len(stranded) == 1 else "s")
        human += (
            f"\nfound {count} that issued keys cannot reach: {', '.join(stranded)} "
            f"(their files stay as they are in {args.data_dir})\n{_adopt_hint()}"
        )
    payload = {
        "created": created,
        "path": str(path),
        "generation": generation,
        "local_tenants": stranded,
    }
    _emit(args, payload, human)
    return EXIT_OK


def cmd_tenant_create(args: argparse.Namespace) -> int:
    """Create a tenant (--id: with this UUIDv4, as a tenant moved here keeps its id; in a
    cluster: on --node, else on the least-loaded node)."""
    with _open(args) as db:
        if args.node is None:
            tenant = db.create_tenant(args.name, actor=actor(), tenant_id=args.id)
        else:
            from memspine_admin.control_pg import PgControl

            if not isinstance(db, PgControl):
                return _usage("--node needs MEMSPINE_CONTROL_URL (a cluster's control plane)")
            tenant = db.create_tenant(args.name, actor=actor(), tenant_id=args.id, node=args.node)
    where = "" if tenant.node is None else f" on node {tenant.node}"
    _emit(args, tenant, f"created tenant {tenant.tenant_id} ({tenant.name}){where}")
    return EXIT_OK


def cmd_tenant_list(args: argparse.Namespace) -> int:
    """List tenants."""
    with _open(args) as db:
        tenants = db.list_tenants()
    header = ["TENANT ID", "NAME", "CREATED"]
    rows = [[t.tenant_id, t.name, _when(t.created_at)] for t in tenants]
    if any(t.node is not None for t in tenants):
        header.append("NODE")
        for row, t in zip(rows, tenants, strict=True):
            row.append(t.node or "-")
    _emit(args, tenants, _table(rows, header) if rows else "no tenants")
    return EXIT_OK


def cmd_tenant_delete(args: argparse.Namespace) -> int:
    """Delete a tenant: revoke its keys, then erase its directory."""
    with _open(args) as db:
        tenant = db.get_tenant(args.tenant_id)
        if tenant is None:
            raise NotFound("no tenant with that id")
        if tenant.node is not None and not (args.data_dir / tenant.tenant_id).exists():
            # Its files are on another machine: deleting here would leave them unerased.
            raise Conflict(
                f"tenant {tenant.tenant_id} is held by node {tenant.node}, not in "
                f"{args.data_dir}: delete it through the admin route "
                f"(DELETE /v1/admin/tenants/{tenant.tenant_id} via the proxy), which reaches "
                "that node and erases its directory"
            )
        active = [k for k in db.list_keys(tenant.tenant_id) if k.revoked_at is None]
        question = (
            f"delete tenant {tenant.tenant_id} ({tenant.name}), revoke its "
            f"{len(active)} active key(s) and erase {args.data_dir / tenant.tenant_id}?"
        )
        if not _confirm(args, question):
            sys.stderr.write("aborted\n")
            return EXIT_ABORTED
        revoked = db.delete_tenant(tenant.tenant_id, actor=actor())
    erased = erase_tenant_dir(args.data_dir, tenant.tenant_id)
    payload = {"tenant_id": tenant.tenant_id, "revoked_keys": revoked, "erased": erased}
    human = f"deleted tenant {tenant.tenant_id}; revoked {len(revoked)} key(s)"
    human += "; erased its directory" if erased else "; it had no directory"
    _emit(args, payload, human)
    return EXIT_OK


KEEP = object()  # a limit not given to `tenant limits`: it stays as it is
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _limit_arg(value: str) -> int | None:
    """--max-events/--max-bytes: a whole number (K, M, G or T: powers of 1024), or none to
    remove the tenant's own limit."""
    text = value.strip().lower()
    if text == "none":
        return None
    text = text.removesuffix("ib").removesuffix("b")
    scale = _UNITS.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in _UNITS else text
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected a whole number such as 100000 or 512M, or none, got {value!r}"
        )
    return int(digits) * scale


def _own(value: int | None) -> str:
    return "none of its own (the server's default applies)" if value is None else str(value)


def _show(tenant: TenantRecord, keys: KeyCounts, usage: TenantUsage | None, data_dir: Path) -> str:
    """The text of `tenant show`: the record, its limits, its keys, and its figures when its files
    are here."""
    lines = [
        f"tenant {tenant.tenant_id} ({tenant.name}), created {_when(tenant.created_at)}",
        f"max_events: {_own(tenant.max_events)}",
        f"max_bytes: {_own(tenant.max_bytes)}",
        f"max_memory: {_own(tenant.max_memory)}",
        f"keys: {keys.active} active, {keys.revoked} revoked, {keys.expired} expired",
    ]
    if tenant.node is not None:
        lines.insert(1, f"node: {tenant.node}")
    if usage is None:
        lines.append(
            f"no files in {data_dir}: the tenant has stored nothing here (in a cluster, "
            f"GET /v1/admin/tenants/{tenant.tenant_id} through the proxy asks its node)"
        )
        return "\n".join(lines)
    e, b, v, space = usage.events, usage.bytes, usage.vectors, usage.vector_space
    lines += [
        f"events: {e.live} live, {e.deleted} deleted awaiting purge",
        f"bytes: {b.live} of live events; on disk {b.total} (log {b.log}, keyword {b.keyword}, "
        f"vectors {b.vectors}, read records {b.reads})",
        f"vectors: {v.graph} in the saved graph, {v.pending} not yet in it",
        f"vector space: {space.dim} dimensions, {space.metric}, model {space.model or 'none named'}",
        f"last write: {_when(usage.last_write)}",
        "read from the files (a running server's GET /v1/admin/tenants/{id} gives its live view)",
    ]
    return "\n".join(lines)


def cmd_tenant_show(args: argparse.Namespace) -> int:
    """Show a tenant: its record, its limits and what it uses (from its files)."""
    with _open(args) as db:
        tenant = db.get_tenant(args.tenant_id)
        if tenant is None:
            raise NotFound("no tenant with that id")
        keys = KeyCounts.of(db.list_keys(tenant.tenant_id), now_us())
        holds = db.list_holds(tenant.tenant_id)
    root = args.data_dir / tenant.tenant_id
    usage = closed_usage(root, is_open=None) if root.is_dir() else None
    # Its own limits always (null: none), which the record leaves out when unset.
    payload = {**msgspec.to_builtins(tenant), **{name: getattr(tenant, name) for name in LIMITS}}
    view = retention_cmds.view_from_files(args.data_dir, tenant)
    payload |= {"keys": keys, "usage": usage, "retention": tenant.retention}
    payload |= {"retention_state": view, "holds": holds}
    human = [_show(tenant, keys, usage, args.data_dir)]
    human += retention_cmds.show_lines(tenant, holds, view)
    _emit(args, payload, "\n".join(human))
    return EXIT_OK


def cmd_tenant_limits(args: argparse.Namespace) -> int:
    """Set or remove a tenant's own max_events, max_bytes and max_memory."""
    changes = {name: getattr(args, name) for name in LIMITS if getattr(args, name) is not KEEP}
    if not changes:
        return _usage(
            "tenant limits: give --max-events, --max-bytes and/or --max-memory (a number, or none)"
        )
    with _open(args) as db:
        tenant = db.set_tenant_limits(args.tenant_id, changes, actor=actor())
    own = ", ".join(f"{name} {_own(getattr(tenant, name))}" for name in LIMITS)
    human = f"tenant {tenant.tenant_id}: {own}"
    _emit(args, tenant, human)
    return EXIT_OK


def cmd_key_create(args: argparse.Namespace) -> int:
    """Issue a key; the only time its plaintext is shown."""
    scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
    with _open(args) as db:
        issued = db.create_key(
            args.tenant_id,
            args.name,
            scopes,
            args.ttl_secs,
            actor=actor(),
            requests_per_minute=args.requests_per_minute,
            require_purpose=args.require_purpose,
        )
    rate = issued.requests_per_minute
    human = (
        f"api key: {issued.api_key}\n"
        f"key id {issued.key_id} for tenant {issued.tenant_id}, scopes "
        f"{','.join(issued.scopes)}, expires {_when(issued.expires_at)}, "
        f"{'the default rate' if rate is None else f'{rate} requests a minute'}\n"
        "store the api key now: it cannot be shown again"
    )
    _emit(args, issued, human)
    return EXIT_OK


def cmd_key_list(args: argparse.Namespace) -> int:
    """List keys, without secrets or hashes."""
    with _open(args) as db:
        infos = db.list_keys(args.tenant)
    now = now_us()
    rows = [
        [
            keys.key_prefix(k.key_id),
            k.tenant_id,
            k.name,
            ",".join(k.scopes),
            k.status(now),
            _when(k.expires_at),
            "default" if k.requests_per_minute is None else str(k.requests_per_minute),
        ]
        for k in infos
    ]
    header = ["KEY", "TENANT ID", "NAME", "SCOPES", "STATUS", "EXPIRES", "PER MINUTE"]
    _emit(args, infos, _table(rows, header) if rows else "no keys")
    return EXIT_OK


def cmd_key_revoke(args: argparse.Namespace) -> int:
    """Revoke a key."""
    key_id = keys.key_id_from(args.key_id)
    with _open(args) as db:
        info = db.get_key(key_id)
        if info is None:
            raise NotFound("no key with that id")
        question = f"revoke key {keys.key_prefix(key_id)} ({info.name}) of tenant {info.tenant_id}?"
        if info.revoked_at is None and not _confirm(args, question):
            sys.stderr.write("aborted\n")
            return EXIT_ABORTED
        info = db.revoke_key(key_id, actor=actor())
    _emit(args, info, f"revoked key {info.key_id} at {_when(info.revoked_at)}")
    return EXIT_OK


def cmd_audit(args: argparse.Namespace) -> int:
    """Show the admin audit log, oldest first."""
    with _open(args) as db:
        entries, cursor = db.audit(args.after, args.limit, tenant_id=args.tenant)
    rows = [
        [
            str(e.seq),
            _when(e.ts),
            e.actor,
            e.action,
            e.tenant_id or "-",
            e.key_id or "-",
            msgspec.json.encode(e.detail).decode(),
        ]
        for e in entries
    ]
    human = _table(rows, ["SEQ", "WHEN", "ACTOR", "ACTION", "TENANT", "KEY", "DETAIL"])
    if cursor is not None:
        human += f"\nmore: --after {cursor}"
    _emit(args, {"entries": entries, "next_cursor": cursor}, human if rows else "no entries")
    return EXIT_OK


def cmd_audit_verify(args: argparse.Namespace) -> int:
    """Check a tenant's read chain against the marks the control plane keeps: exit 0 intact,
    1 broken (naming the first bad record)."""
    with _open(args) as db:
        verdict = verify_reads(args.data_dir, db, args.tenant_id)
    out = verdict._asdict()
    said = "intact: " if verdict.ok else "MOVE IN PROGRESS: " if verdict.pending else "BROKEN: "
    _emit(args, out, f"tenant {args.tenant_id}: {said}{verdict.detail}")
    if verdict.pending:
        return EXIT_PENDING
    return EXIT_OK if verdict.ok else EXIT_ERROR


def cmd_tenant_move(args: argparse.Namespace) -> int:
    """Move a tenant to another node while it serves (a cluster; docs/scaling.md)."""
    from memspine_admin.control_pg import PgControl
    from memspine_admin.move import Mover

    url = control_url()
    admin_key = os.environ.get("MEMSPINE_ADMIN_KEY", "").strip()
    if url is None or not admin_key:
        return _usage("tenant move needs MEMSPINE_CONTROL_URL and MEMSPINE_ADMIN_KEY (a cluster)")
    if args.to is None and not args.abort:
        return _usage("tenant move needs --to NODE (or --abort)")

    def say(line: str) -> None:
        sys.stderr.write(f"memspine-admin: {line}\n")

    with PgControl.open(url, actor=actor()) as db:
        mover = Mover(db, admin_key, say=None if args.json else say)
        if args.abort:
            mover.abort(args.tenant_id)
            _emit(args, {"tenant_id": args.tenant_id, "aborted": True}, "move given up")
            return EXIT_OK
        report = mover.move(args.tenant_id, args.to)
    human = (
        f"moved tenant {report.tenant_id} from {report.source} to {report.target}: "
        f"{report.events} events in {report.rounds} rounds, writes held {report.held_secs:.3f} s"
        + ("; the old copy is erased" if report.erased else "")
    )
    _emit(args, report, human)
    return EXIT_OK


def cmd_proxy_sync(args: argparse.Namespace) -> int:
    """Keep an HAProxy routes map current from the PostgreSQL control plane (runs until stopped)."""
    import logging
    import signal
    import threading

    from memspine_admin.proxysync import ProxySync, Runtime, wait_for_runtime

    url = control_url()
    if url is None:
        return _usage("proxy-sync needs MEMSPINE_CONTROL_URL (the cluster's control plane)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    runtime = Runtime(args.runtime)
    wait_for_runtime(runtime, timeout=30)
    sync = ProxySync(url, runtime, args.map, args.name)
    try:
        if args.once:
            generation = sync.sync_once()
            _emit(args, {"generation": generation}, f"routes applied at generation {generation}")
            return EXIT_OK
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        sync.run(stop)
    finally:
        sync.close()
    return EXIT_OK


def _common() -> argparse.ArgumentParser:
    # SUPPRESS defaults let --data-dir/--json go before or after the subcommand.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        type=Path,
        default=argparse.SUPPRESS,
        help="data directory (default: $MEMSPINE_DATA_DIR or ./data)",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print JSON for scripts instead of text",
    )
    return common


def _version() -> str:
    """The installed distribution's version, as `memspine-server --version` prints it (the
    package memspine is the server's, which this one does not import)."""
    try:
        return metadata.version("memspine")
    except metadata.PackageNotFoundError:  # running from a source tree without an install
        return "0.0.0"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    common = _common()
    parser = argparse.ArgumentParser(
        prog="memspine-admin",
        parents=[common],
        description="Manage memspine tenants, API keys, audit, and tenants' data.",
    )
    parser.add_argument("--version", action="version", version=f"memspine-admin {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(
        group: Any, name: str, func: Callable[[argparse.Namespace], int], **kw: Any
    ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = group.add_parser(
            name, parents=[common], help=func.__doc__, **kw
        )
        p.set_defaults(func=func)
        return p

    command(sub, "init", cmd_init)
    tenant = sub.add_parser("tenant", help="create, list, delete or adopt tenants")
    tsub = tenant.add_subparsers(dest="tenant_command", required=True)
    p = command(tsub, "create", cmd_tenant_create)
    p.add_argument("name")
    p.add_argument("--id", default=None, help="the tenant id to give it (a UUIDv4)")
    p.add_argument("--node", default=None, help="the node to hold it (a cluster's node name)")
    command(tsub, "list", cmd_tenant_list)
    p = command(tsub, "move", cmd_tenant_move)
    p.add_argument("tenant_id")
    p.add_argument("--to", default=None, help="the node to move it to")
    p.add_argument("--abort", action="store_true", help="give up a move that stopped midway")
    p = command(tsub, "delete", cmd_tenant_delete)
    p.add_argument("tenant_id")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    command(tsub, "show", cmd_tenant_show).add_argument("tenant_id")
    p = command(tsub, "limits", cmd_tenant_limits)
    p.add_argument("tenant_id")
    for name in LIMITS:
        p.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=_limit_arg,
            default=KEEP,
            help="a whole number (100000, 512M), or none for the server's default "
            "(unchanged if not given)",
        )

    key = sub.add_parser("key", help="create, list or revoke API keys")
    ksub = key.add_subparsers(dest="key_command", required=True)
    p = command(ksub, "create", cmd_key_create)
    p.add_argument("tenant_id")
    p.add_argument("name")
    p.add_argument(
        "--scopes",
        default="read,write",
        help="comma-separated: read, write, audit (default read,write)",
    )
    p.add_argument("--ttl-secs", type=int, default=None, help="expire after this many seconds")
    p.add_argument(
        "--requests-per-minute",
        type=int,
        default=None,
        help="this key's rate (default: the server's MEMSPINE_DEFAULT_REQUESTS_PER_MINUTE)",
    )
    p.add_argument(
        "--require-purpose",
        action="store_true",
        help="refuse this key's reads that give no Memspine-Purpose (docs/audit.md)",
    )
    command(ksub, "list", cmd_key_list).add_argument("--tenant", default=None)
    p = command(ksub, "revoke", cmd_key_revoke)
    p.add_argument("key_id", help="the key's id, bare or as key list shows it (smk_live_<id>)")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")

    p = command(sub, "proxy-sync", cmd_proxy_sync)
    p.add_argument("--runtime", required=True, help="HAProxy runtime API: socket path or host:port")
    p.add_argument("--map", type=Path, required=True, help="the routes map file HAProxy loads")
    p.add_argument("--name", default=socket.gethostname(), help="this proxy's name (default: host)")
    p.add_argument("--once", action="store_true", help="apply the routes once and exit")

    data.add_commands(sub, tsub, command)
    subjects.add_commands(sub, command)
    foreign.add_commands(sub, command)
    retention_cmds.add_commands(tsub, command)

    p = command(sub, "audit", cmd_audit)
    p.add_argument("--after", type=int, default=None, help="show entries after this seq")
    p.add_argument("--limit", type=int, default=100, help="at most this many (max 1000)")
    p.add_argument("--tenant", default=None, help="only entries about this tenant")
    asub = p.add_subparsers(dest="audit_command", required=False)
    command(asub, "verify", cmd_audit_verify).add_argument("tenant_id")
    return parser


def _data_dir_problem(path: Path) -> str | None:
    """Why path cannot be a data directory (a file, or under one), None if it can."""
    if path.exists():
        return None if path.is_dir() else f"{str(path)!r} exists and is not a directory"
    probe = path.parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"{str(path)!r} cannot be created: {str(probe)!r} is not a directory"
    return None


def _usage(message: str) -> int:
    """A data directory the CLI cannot use: one sentence, exit 2, as for a bad command line."""
    sys.stderr.write(f"memspine-admin: {message}\n")
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `memspine-admin` console script."""
    args = build_parser().parse_args(argv)
    source = "--data-dir"
    if "data_dir" not in args:
        source = (
            "MEMSPINE_DATA_DIR" if os.environ.get("MEMSPINE_DATA_DIR") else "the default ./data"
        )
        args.data_dir = Path(os.environ.get("MEMSPINE_DATA_DIR") or "./data")
    args.json = getattr(args, "json", False)
    problem = _data_dir_problem(args.data_dir)
    if problem is not None:
        return _usage(f"{source}: {problem}")
    try:
        return int(args.func(args))
    except OSError as exc:  # unreadable, unwritable, a file where a directory should be
        where = exc.filename if exc.filename is not None else args.data_dir
        if names_full_disk(exc):  # the cause, and the file it was written to: one line
            full = f"the disk holding {str(where)!r} is full ({exc.strerror or exc}); free space"
            return _failed(args, DiskFull(f"{full} and run the command again"))
        if exc.filename is not None and not Path(exc.filename).is_relative_to(args.data_dir):
            return _usage(f"cannot use {str(where)!r}: {exc.strerror or exc}")
        return _usage(f"{source}: cannot use {str(where)!r}: {exc.strerror or exc}")
    except MemspineError as exc:
        return _failed(args, exc)


def _failed(args: argparse.Namespace, exc: MemspineError) -> int:
    """A refused command: its error on one line of stderr (JSON with --json), exit 1."""
    if args.json:
        error = {"error": exc.code, "detail": exc.detail}
        sys.stderr.write(msgspec.json.encode(error).decode() + "\n")
    else:
        sys.stderr.write(f"memspine-admin: {exc.detail}\n")
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())

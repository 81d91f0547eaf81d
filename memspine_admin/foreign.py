"""memspine-admin import-from: another memory server's file into a tenant (docs/migrate.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memspine_admin.command import emit
from memspine_admin.data import _past_window, _registered, progress, tenant_dir, unserved
from storage.errors import InvalidRequest

# storage.transfer.foreign (and with it the stores) is imported by the command that uses it.


def cmd_import_from(args: argparse.Namespace) -> int:
    """Import AutoMem, Mem0 or Zep/Graphiti data into a tenant, history and all (docs/migrate.md)."""
    try:
        raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    except OSError as exc:
        raise InvalidRequest(f"cannot read {args.file}: {exc.strerror or exc}") from None
    if args.per_user:
        return _per_user(args, raw)
    payload = _import(args, tenant_dir(args.data_dir, args.tenant), raw, args.user)
    emit(args, payload, human(payload))
    return 0


def _per_user(args: argparse.Namespace, raw: bytes) -> int:
    """A Mem0 file into one tenant per user_id, TENANT-<user_id> (memories without one into
    TENANT); every tenant id is checked before the first import."""
    from storage.transfer.foreign import convert

    if args.source != "mem0" or args.user is not None:
        raise InvalidRequest("--per-user is for mem0 files, without --user")
    if args.subjects:
        raise InvalidRequest("--subjects puts every user into one tenant: not with --per-user")
    users = convert("mem0", raw, name=_name(args)).report.users
    tenants: dict[str, str] = {}
    for user in users:
        try:
            tenants[user] = tenant_dir(
                args.data_dir, f"{args.tenant}-{user}" if user else args.tenant
            )
        except InvalidRequest as exc:
            raise InvalidRequest(
                f"user_id {user[:64]!r} cannot name a tenant: {exc.detail}"
            ) from None
    payloads = [_import(args, tenant, raw, user) for user, tenant in tenants.items()]
    emit(args, {"tenants": payloads}, "\n\n".join(map(human, payloads)))
    return 0


def _name(args: argparse.Namespace) -> str:
    return "stdin" if args.file == "-" else Path(args.file).name


def _import(
    args: argparse.Namespace, tenant_id: str, raw: bytes, user: str | None
) -> dict[str, Any]:
    """Convert, report, and unless a dry run import into one tenant: the report as a payload."""
    from storage.transfer.foreign import convert, land, present

    conv = convert(
        args.source,
        raw,
        name=_name(args),
        embedding_model=args.embedding_model,
        user=user,
        subjects=args.subjects,
    )
    dim, held = present(args.data_dir, tenant_id, conv)
    report = conv.report
    payload: dict[str, Any] = {
        "source": args.source,
        "tenant_id": tenant_id,
        "dry_run": args.dry_run,
        "read": report.read,
        "created": report.created,
        "events": len(conv.records),
        "held": held,
        "mapping": report.mapping,
        "dropped": report.dropped,
        "notes": report.notes,
        "embedding_model": report.embedding_model,
    }
    if args.dry_run:
        return payload
    drop = _past_window(args.data_dir, tenant_id)  # as memspine-admin import drops
    with progress(args, "importing", len(conv.records)) as bar:
        if (args.data_dir / tenant_id).exists():
            why = f"stop it to import into tenant {tenant_id}, which has a directory there"
            with unserved(args.data_dir, why):
                stats = land(
                    args.data_dir, tenant_id, conv, dim=dim, progress=bar.update, drop=drop
                )
        else:
            stats = land(args.data_dir, tenant_id, conv, dim=dim, progress=bar.update, drop=drop)
    payload["imported"] = stats.events
    payload["skipped"] = stats.skipped
    payload["retention_dropped"] = stats.retention_dropped
    payload["registered"] = _registered(args.data_dir, tenant_id)
    return payload


def human(p: dict[str, Any]) -> str:
    """The report for people: counts in, counts out, what maps where, what is not carried."""

    def counts(d: dict[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in d.items()) or "nothing"

    out = [
        f"{p['source']} file -> tenant {p['tenant_id']}"
        + (" (dry run: nothing written)" if p["dry_run"] else "")
    ]
    out.append(f"read: {counts(p['read'])}")
    verb = "would create" if p["dry_run"] else "created"
    new = p["imported"] if "imported" in p else p["events"] - p["held"]
    out.append(
        f"{verb}: {new} events of {p['events']} ({counts(p['created'])}); "
        f"{p['held'] if 'skipped' not in p else p['skipped']} held already"
    )
    if p.get("retention_dropped"):
        out.append(f"dropped {p['retention_dropped']} past their retention window")
    if p["embedding_model"]:
        out.append(f"embeddings kept, model {p['embedding_model']}")
    out.append("maps:")
    out.extend(f"  {line}" for line in p["mapping"])
    out.append("not carried:" if p["dropped"] else "not carried: nothing")
    out.extend(f"  {what}: {n}" for what, n in p["dropped"].items())
    out.extend(f"note: {n}" for n in p["notes"])
    if p.get("registered") is False:
        out.append(
            f"no tenant record has this id yet: memspine-admin tenant create NAME --id {p['tenant_id']}"
        )
    return "\n".join(out)


def add_commands(sub: Any, command: Callable[..., argparse.ArgumentParser]) -> None:
    """The import-from command, in the parser of memspine_admin/cli.py."""
    p = command(sub, "import-from", cmd_import_from)
    p.add_argument("source", choices=("automem", "mem0", "zep"))
    p.add_argument("file", help="the other server's file (- for stdin; gzip is unwrapped)")
    p.add_argument("--tenant", required=True, help="the tenant to import into")
    p.add_argument(
        "--dry-run", action="store_true", help="print what would be created and lost; write nothing"
    )
    p.add_argument(
        "--embedding-model",
        default=None,
        help="the model that made the file's vectors (automem, zep); without it they are not kept",
    )
    p.add_argument("--user", default=None, help="mem0: only this user_id's memories")
    p.add_argument(
        "--per-user",
        action="store_true",
        help="mem0: one tenant per user_id, named TENANT-<user_id>",
    )
    p.add_argument(
        "--subjects",
        action="store_true",
        help="mem0: each memory's user_id becomes the data subject of its events (one tenant)",
    )

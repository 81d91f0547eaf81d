"""memspine-admin's data-subject commands: `subject erase`, `subject export` and `receipt verify`
(docs/admin.md, docs/erasure.md). Erasure runs the server's own code (memspine/subjects.py) on
the data directory while no server holds it; the export reads a snapshot beside a live server."""

from __future__ import annotations

import argparse
import base64
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import msgspec

from memspine_admin.command import emit as _emit
from memspine_admin.data import (
    PURPOSE_HELP,
    _controlled,
    _plane,
    beside_the_server,
    cli_purpose,
    record_cli,
    tenant_dir,
    unserved,
)
from storage.errors import InvalidRequest


def cmd_subject_erase(args: argparse.Namespace) -> int:
    """Erase everything about SUBJECT in TENANT (with --dry-run: list what would go)."""
    import anyio

    from memspine.config import load_settings
    from memspine.engine import Engine, EngineHooks
    from memspine.subjects import Asker, EraseIn, dry_run, erase, to_reach

    tenant_id = tenant_dir(args.data_dir, args.tenant_id)
    body = EraseIn(
        dry_run=args.dry_run,
        identifiers=args.identifier or None,
        confirm_ids=args.confirm or None,
        cascade=args.cascade,
    )
    q = to_reach(args.subject, body)
    env = {**os.environ, "MEMSPINE_DATA_DIR": str(args.data_dir), "MEMSPINE_EMBEDDER": "none"}
    settings = load_settings(env)
    why = "stop it, or erase through POST /v1/admin/subjects/{subject}/erase"
    with unserved(args.data_dir, why):
        holds = _holds(args.data_dir, tenant_id)  # no server runs: none is placed meanwhile
        engine = Engine(settings, EngineHooks(holds=lambda _tenant: holds))
        try:
            if args.dry_run:
                found: Any = anyio.run(dry_run, engine, tenant_id, q)
                human = "\n".join(
                    f"{e.event_id} {e.kind} {','.join(e.reasons)}" for e in found.events
                )
                human += f"\n{found.count} events would be erased; nothing was changed"
            else:
                found = anyio.run(erase, engine, tenant_id, q, Asker(key_id="memspine-admin"))
                receipt = found.receipt.receipt
                human = (
                    f"erased {len(found.deleted_ids)} events of tenant {tenant_id}; "
                    f"receipt {found.receipt_id} ({'clean' if receipt.clean else 'NOT clean'} "
                    f"scan), kept in {args.data_dir}/_receipts/{tenant_id}/"
                )
        finally:
            engine.close()
    _emit(args, found, human.strip())
    return 0


def _holds(data_dir: Path, tenant_id: str) -> list[Any]:
    """The tenant's legal holds in the control plane (none in local mode): an erasure here
    honours them as the server's does (409 legal_hold, nothing erased)."""
    if not _controlled(data_dir):
        return []
    with _plane(data_dir) as db:
        return list(db.list_holds(tenant_id))


def cmd_subject_export(args: argparse.Namespace) -> int:
    """Write everything about SUBJECT in TENANT as NDJSON (an access request); safe while the
    server runs. The export is recorded in the tenant's read log (door cli) as the HTTP access
    export is: before the file is in place, or after the lines on stdout (docs/audit.md)."""
    from memspine.subjects import read_records
    from storage.transfer.export import log_snapshot, subject_lines

    beside_the_server()
    subject = args.subject  # subject_lines refuses one that cannot be a subject
    tenant_id = tenant_dir(args.data_dir, args.tenant_id)
    purpose = cli_purpose(args.purpose)

    def write(out: IO[bytes]) -> None:
        exported: list[str] = []
        with log_snapshot(args.data_dir / tenant_id) as r:
            reads = read_records(args.data_dir / tenant_id)
            for line in subject_lines(r, tenant_id, subject, reads=reads, exported=exported):
                out.write(line)
        out.flush()
        record_cli(args.data_dir, tenant_id, "subject export", exported, purpose)

    if args.out is None:
        write(sys.stdout.buffer)
        return 0
    from storage.fsync import replace_durably

    replace_durably(Path(args.out), write)
    _emit(args, {"tenant_id": tenant_id, "out": args.out}, f"wrote {args.out}")
    return 0


def cmd_receipt_verify(args: argparse.Namespace) -> int:
    """Check a receipt file's signature: exit 0 if valid, 1 if not (a changed byte fails)."""
    from storage import receipts

    body = Path(args.file).read_bytes()
    trusted = None
    if args.public_key is not None:
        try:
            trusted = base64.b64decode(args.public_key, validate=True)
        except ValueError:
            raise InvalidRequest("--public-key must be base64 (GET /v1/receipts/key)") from None
    elif (args.data_dir / receipts.DIR / receipts.KEY_FILE).exists():
        key = receipts.public_key(args.data_dir)
        trusted = base64.b64decode(key.public_key)
    receipt = receipts.verify(body, trusted)
    if receipt is None:
        _emit(args, {"valid": False}, "INVALID: the signature does not match this receipt")
        return 1
    payload = {"valid": True, "receipt": msgspec.to_builtins(receipt)}
    if isinstance(receipt, receipts.RunReceipt):
        did = f"a retention run, {receipt.deleted} events deleted, {receipt.purged} purged"
    else:
        did = f"{len(receipt.event_ids)} events erased, scan {'clean' if receipt.clean else 'not clean'}"
    _emit(
        args, payload, f"valid: receipt {receipt.receipt_id} of tenant {receipt.tenant_id}, {did}"
    )
    return 0


def add_commands(sub: Any, command: Callable[..., argparse.ArgumentParser]) -> None:
    """The subject and receipt commands, in the parser of memspine_admin/cli.py."""
    subject = sub.add_parser("subject", help="erase or export everything about a data subject")
    ssub = subject.add_subparsers(dest="subject_command", required=True)
    p = command(ssub, "erase", cmd_subject_erase)
    p.add_argument("tenant_id")
    p.add_argument("subject")
    p.add_argument("--dry-run", action="store_true", help="list what would go; change nothing")
    p.add_argument("--identifier", action="append", default=[], help="a name, email, number")
    p.add_argument("--confirm", action="append", default=[], help="an id an identifier found")
    p.add_argument("--cascade", choices=("derived", "none"), default="derived")
    p = command(ssub, "export", cmd_subject_export)
    p.add_argument("tenant_id")
    p.add_argument("subject")
    p.add_argument("--out", default=None, help="write to this file (default: stdout)")
    p.add_argument("--purpose", default=None, help=PURPOSE_HELP)
    receipt = sub.add_parser("receipt", help="check an erasure receipt")
    rsub = receipt.add_subparsers(dest="receipt_command", required=True)
    p = command(rsub, "verify", cmd_receipt_verify)
    p.add_argument("file", help="the body of GET /v1/memory/receipts/{receipt_id}")
    p.add_argument(
        "--public-key",
        default=None,
        help="the key to trust, base64 (default: the data directory's, if it has one)",
    )

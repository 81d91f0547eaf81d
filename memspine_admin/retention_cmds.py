"""memspine-admin's retention and legal-hold commands: `tenant retention`, `tenant hold`,
`tenant holds`, `tenant unhold`, and what `tenant show` adds about them (docs/admin.md)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memspine_admin import command
from memspine_admin.records import HoldRecord, TenantRecord, now_us
from memspine_admin.retention import typo_warnings
from storage.errors import NotFound
from storage.read.retention import Policy, outlook_of_files
from storage.tenants.runs import RetentionView, last_receipt, view_of

DEFAULT_ENV = "MEMSPINE_RETENTION_DAYS"

Command = Callable[..., argparse.ArgumentParser]


def _window(text: str) -> tuple[str, int | None]:
    """KIND=DAYS (DAYS a whole number, or none to remove the kind's window)."""
    kind, sep, days = text.rpartition("=")
    if not sep or not kind:
        raise argparse.ArgumentTypeError(
            f"expected KIND=DAYS such as turn=90 or '*=365', got {text!r}"
        )
    if days.strip().lower() == "none":
        return kind, None
    try:
        return kind, int(days)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of days or none after '=', got {text!r}"
        ) from None


def server_default() -> int | None:
    """The server's MEMSPINE_RETENTION_DAYS as this process's environment gives it."""
    raw = os.environ.get(DEFAULT_ENV, "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def view_from_files(data_dir: Path, record: TenantRecord) -> RetentionView | None:
    """The tenant's retention from its files (None: no directory here)."""
    root = data_dir / record.tenant_id
    if not root.is_dir():
        return None
    policy = Policy.of(record.retention, server_default())
    return view_of(policy, outlook_of_files(root, policy, now_us()), last_receipt(root))


def show_lines(
    record: TenantRecord, holds: list[HoldRecord], view: RetentionView | None
) -> list[str]:
    """The lines `tenant show` gives about retention and holds."""
    own = record.retention
    lines = [f"retention: {_windows(own) if own else 'none of its own'}"]
    if view is not None:
        last = view.last_run
        lines += [
            f"retention in force: {_windows(view.in_force) if view.in_force else 'keep everything'}"
            f" ({DEFAULT_ENV} as this shell has it)",
            f"oldest event: {_when(view.oldest_event)}; due now {view.due_now}, "
            f"within 7 days {view.due_next_7_days}",
            "last retention run: none"
            if last is None
            else f"last retention run: {_when(last.finished_at)}, deleted {last.deleted}, "
            f"purged {last.purged}, held {last.held} (receipt {last.receipt_id})",
        ]
    lines += [f"holds: {len(holds)}"] + [f"  {_hold(h)}" for h in holds]
    return lines


def _windows(windows: dict[str, int]) -> str:
    return ", ".join(f"{kind}={days}d" for kind, days in windows.items())


def _when(us: int | None) -> str:
    return command.when(us)


def _hold(hold: HoldRecord) -> str:
    on = "the tenant" if hold.subject is None else f"subject {hold.subject}"
    return (
        f"{hold.hold_id} on {on}, placed {_when(hold.placed_at)} by {hold.placed_by}: {hold.reason}"
    )


def cmd_retention(args: argparse.Namespace) -> int:
    """Set or remove (KIND=none) a tenant's retention windows in days ('*' for other kinds)."""
    changes: dict[str, object] = dict(args.windows)
    with command.open_plane(args) as db:
        tenant = db.set_retention(args.tenant_id, changes, actor=command.actor())
    view = view_from_files(args.data_dir, tenant)
    named = [kind for kind, days in changes.items() if days is not None]
    warnings = typo_warnings(named, view.kinds if view is not None else [])
    human = "\n".join(
        [f"tenant {tenant.tenant_id}: retention {_windows(tenant.retention or {}) or 'none'}"]
        + [f"warning: {w}" for w in warnings]
    )
    command.emit(
        args,
        {"tenant_id": tenant.tenant_id, "retention": tenant.retention, "warnings": warnings},
        human,
    )
    return int(command.EXIT_OK)


def cmd_hold(args: argparse.Namespace) -> int:
    """Place a legal hold on a tenant (or, with --subject, on one data subject's events)."""
    with command.open_plane(args) as db:
        hold = db.place_hold(args.tenant_id, args.reason, args.subject, actor=command.actor())
    command.emit(args, hold, f"placed {_hold(hold)}")
    return int(command.EXIT_OK)


def cmd_holds(args: argparse.Namespace) -> int:
    """List a tenant's legal holds."""
    with command.open_plane(args) as db:
        if db.get_tenant(args.tenant_id) is None:
            raise NotFound("no tenant with that id")
        holds = db.list_holds(args.tenant_id)
    command.emit(args, {"holds": holds}, "\n".join(_hold(h) for h in holds) or "no holds")
    return int(command.EXIT_OK)


def cmd_unhold(args: argparse.Namespace) -> int:
    """Lift a legal hold."""
    with command.open_plane(args) as db:
        hold = db.lift_hold(args.tenant_id, args.hold_id, actor=command.actor())
    command.emit(args, {"hold_id": hold.hold_id, "lifted": True}, f"lifted {hold.hold_id}")
    return int(command.EXIT_OK)


def add_commands(tsub: Any, command: Command) -> None:
    """The retention and hold subcommands of `tenant`."""
    p = command(tsub, "retention", cmd_retention)
    p.add_argument("tenant_id")
    p.add_argument("windows", nargs="+", type=_window, metavar="KIND=DAYS")
    p = command(tsub, "hold", cmd_hold)
    p.add_argument("tenant_id")
    p.add_argument("--reason", required=True, help="why (a case, a dispute)")
    p.add_argument("--subject", default=None, help="hold only this data subject's events")
    command(tsub, "holds", cmd_holds).add_argument("tenant_id")
    p = command(tsub, "unhold", cmd_unhold)
    p.add_argument("tenant_id")
    p.add_argument("hold_id")

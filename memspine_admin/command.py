"""What every command of memspine-admin shares (memspine_admin/cli.py, data.py, retention_cmds.py):
who runs it, which control plane it opens, how it prints, which tenant directories are local."""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import os
import sys
from pathlib import Path
from typing import Any

import msgspec

from memspine_admin.plane import ControlPlane, open_control

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_ABORTED = 0, 1, 2, 3
EXIT_PENDING = 4  # `audit verify`: not judged yet (a move's hand-over of the records pending)


def actor() -> str:
    """The audit actor for this CLI run: `cli:<os user>`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # containers often run with a uid that has no passwd entry
        user = f"uid{os.getuid()}"
    return f"cli:{user}"


def control_url() -> str | None:
    """MEMSPINE_CONTROL_URL: the PostgreSQL control plane, as the server reads it; None for LMDB."""
    return os.environ.get("MEMSPINE_CONTROL_URL", "").strip() or None


def open_plane(args: argparse.Namespace) -> ControlPlane:
    """The control plane of the command's data directory (or MEMSPINE_CONTROL_URL's)."""
    return open_control(args.data_dir, control_url(), actor=actor())


def when(us: int | None) -> str:
    """A time in microseconds as UTC for people, or "never"."""
    if us is None:
        return "never"
    return dt.datetime.fromtimestamp(us / 1e6, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def emit(args: argparse.Namespace, payload: Any, human: str) -> None:
    """A command's result: the payload as JSON with --json, else the sentence for people."""
    if args.json:
        sys.stdout.write(msgspec.json.encode(payload).decode() + "\n")
    else:
        sys.stdout.write(human + "\n")


def local_tenants(data_dir: Path, known: set[str]) -> list[str]:
    """Tenant directories (holding an event log) whose names the control database lacks:
    the tenants of local mode, whose tokens were their names."""
    try:
        entries = sorted(os.scandir(data_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    return [
        e.name
        for e in entries
        if e.name[0] not in "._"  # _control, and the .erasing-* or .control-init-* leftovers
        and e.is_dir(follow_symlinks=False)
        and os.path.isdir(os.path.join(e.path, "events"))
        and e.name not in known
    ]

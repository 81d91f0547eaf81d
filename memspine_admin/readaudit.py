"""The read audit's control-plane side: the marks of each tenant's read chain, and its verify."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from memspine_admin.plane import ControlPlane
from memspine_admin.records import ReadMark, check_tenant_id
from storage import readlog
from storage.errors import NotFound
from storage.readlog import Mark, Verdict, append_beside, records_of

CLI_DOOR = "cli"


def verify_reads(data_dir: Path, control: ControlPlane, tenant_id: str) -> Verdict:
    """Check a tenant's read log (in data_dir) against the last head and cut recorded."""
    tenant_id = check_tenant_id(tenant_id)
    root = Path(data_dir) / tenant_id
    if control.get_tenant(tenant_id) is None and not root.is_dir():
        raise NotFound("no tenant with that id")
    head, cut = control.read_marks(tenant_id)
    return readlog.verify(root, _mark(head), _mark(cut))


def _mark(m: ReadMark | None) -> Mark | None:
    return None if m is None else Mark(m.seq, m.hash)


def mark_keeper(control: ControlPlane, *, cut: bool = False) -> Callable[[str, Mark], None]:
    """A callback that records a tenant's chain mark in the control plane."""

    def keep(tenant_id: str, mark: Mark) -> None:
        control.keep_read_mark(tenant_id, ReadMark(seq=mark.seq, hash=mark.hash), cut=cut)

    return keep


def record_cli_read(
    data_dir: Path,
    tenant_id: str,
    command: str,
    event_ids: list[str],
    *,
    who: str,
    purpose: str | None = None,
    control: Callable[[], ControlPlane | None] = lambda: None,
) -> None:
    """Record an operator's command that read event content (door `cli`, the command as its
    route, `who` as its key id), appended beside a running server, and hand the chain's head
    to the control plane `control` opens (None: local mode). Nothing when this shell's
    MEMSPINE_READ_AUDIT is off, as the server records nothing then (docs/audit.md)."""
    if not event_ids or cli_audit_mode() == "off":
        return
    ts = time.time_ns() // 1000
    reads = records_of(ts, who, CLI_DOOR, command, uuid.uuid4().hex, purpose, event_ids)
    head = append_beside(Path(data_dir) / tenant_id, reads)
    if head is not None:
        plane = control()
        if plane is not None:
            with plane:
                mark_keeper(plane)(tenant_id, head)


def cli_audit_mode() -> str:
    """MEMSPINE_READ_AUDIT as this shell sets it (buffered when unset; the server checks the
    value)."""
    return os.environ.get("MEMSPINE_READ_AUDIT", "buffered").strip().lower()

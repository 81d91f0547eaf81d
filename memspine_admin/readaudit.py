"""The read audit's control-plane side: the marks of each tenant's read chain, and its verify."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from memspine_admin.plane import ControlPlane
from memspine_admin.records import ReadMark, check_tenant_id
from storage import readlog
from storage.errors import NotFound
from storage.readlog import Mark, Verdict


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

"""The open-file limit: raised toward the hard limit at start, so more tenants fit."""

from __future__ import annotations

import logging
import resource
from pathlib import Path

import msgspec

log = logging.getLogger("memspine.limits")

NR_OPEN = Path("/proc/sys/fs/nr_open")
# What an unlimited hard limit is taken to mean where the kernel does not say (Linux's default).
UNLIMITED_FALLBACK = 1_048_576


class FdLimit(msgspec.Struct, frozen=True):
    """The soft limit before and after the raise, the hard limit, and why it stopped where it did."""

    before: int
    soft: int
    hard: int
    note: str = ""


def _ceiling(hard: int) -> int:
    """The highest soft limit worth asking for: the hard limit, or the kernel's cap if unlimited."""
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        return int(NR_OPEN.read_text().strip())
    except (OSError, ValueError):
        return UNLIMITED_FALLBACK


def raise_fd_limit() -> FdLimit:
    """Raise the soft RLIMIT_NOFILE as far as allowed; never lowers it and never fails."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return FdLimit(before=soft, soft=soft, hard=hard, note="already unlimited")
    target = _ceiling(hard)
    if soft >= target:
        return FdLimit(before=soft, soft=soft, hard=hard, note="already at the hard limit")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        # macOS refuses more than OPEN_MAX whatever the hard limit says; keep what we have.
        return FdLimit(
            before=soft, soft=soft, hard=hard, note=f"raise refused ({type(exc).__name__})"
        )
    return FdLimit(before=soft, soft=resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard=hard)


def log_fd_limit(limit: FdLimit) -> None:
    """Say what the raise did, with numbers (call once logging is configured)."""
    fields = {"before": limit.before, "soft": limit.soft, "hard": limit.hard}
    if limit.soft > limit.before:
        log.info("raised the open-file limit toward the hard limit", extra=fields)
    else:
        log.info("open-file limit unchanged: %s", limit.note or "no raise", extra=fields)

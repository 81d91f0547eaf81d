"""The process's limits: the open-file limit, raised toward the hard limit at start so more
tenants fit, and the memory the machine (or its cgroup) gives it, for the open tenants' budget."""

from __future__ import annotations

import logging
import os
import resource
from pathlib import Path

import msgspec

log = logging.getLogger("memspine.limits")

NR_OPEN = Path("/proc/sys/fs/nr_open")
# What an unlimited hard limit is taken to mean where the kernel does not say (Linux's default).
UNLIMITED_FALLBACK = 1_048_576
MEMINFO = Path("/proc/meminfo")
PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# The default memory budget of open tenants: this share of the machine's memory (or of a lower
# cgroup limit). The rest is for the page cache, which LMDB and Tantivy read through, requests
# and their queries, and everything else on the host.
OPEN_BYTES_FRACTION = 0.5
# What the budget is taken from where the system tells nothing (not Linux, no sysconf).
MEMORY_FALLBACK = 4 << 30


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


def _read_int(path: Path) -> int | None:
    """A file holding one integer; None if absent, unreadable or not a number ("max")."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _physical_memory() -> int | None:
    """Bytes of physical memory: sysconf, else /proc/meminfo's MemTotal."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        if pages > 0 and size > 0:
            return pages * size
    except (ValueError, OSError, AttributeError):
        pass
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_limit() -> int | None:
    """The tightest memory limit of this process's cgroup and its ancestors, v2 or v1; None if
    there is none (a container's limit shows here, not in MemTotal)."""
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        hierarchy, controllers, path = ([*line.split(":", 2), "", ""])[:3]
        if hierarchy == "0":
            base, name = CGROUP_ROOT, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = CGROUP_ROOT / "memory", "memory.limit_in_bytes"
        else:
            continue
        rel = Path(path.strip().lstrip("/"))
        for folder in (rel, *rel.parents):
            limit = _read_int(base / folder / name)
            if limit is not None and limit > 0:
                limits.append(limit)
    return min(limits) if limits else None


def machine_memory() -> int:
    """Bytes of memory this process can have: physical memory or a lower cgroup limit."""
    known = [m for m in (_physical_memory(), _cgroup_limit()) if m is not None]
    return min(known) if known else MEMORY_FALLBACK


def default_max_open_bytes() -> int:
    """The default memory budget of open tenants: OPEN_BYTES_FRACTION of machine_memory()."""
    return int(machine_memory() * OPEN_BYTES_FRACTION)

"""What /proc says of a process: its open descriptors and its resident memory."""

from __future__ import annotations

import os
from pathlib import Path


def fd_count(pid: int | str = "self") -> int:
    """Open file descriptors of a process."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def vm_rss(pid: int) -> int:
    """A process's resident set size in bytes, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")

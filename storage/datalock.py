"""One process serves a data directory: `memspine-server` and the embedded `memspine mcp` each
hold an exclusive flock on `DATA_DIR/.memspine-lock` for as long as they run.

Two processes on one directory would each open the tenants' LMDB logs, Tantivy indexes and
vector files: one process's writes are missed by the other's indexes, Tantivy's writer lock
refuses the second writer, and a purge in one swaps files under the other. The lock turns that
into one sentence at start. The kernel drops it when the process ends, however it ends (a
kill -9 leaves no stale lock); the file stays, and what it says (who holds it) is only read
when its lock is taken.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

LOCK_NAME = ".memspine-lock"  # a dot name: never a tenant id, so never a tenant directory


class DataDirBusy(Exception):
    """Another live process holds the data directory."""

    def __init__(self, data_dir: Path, holder: dict[str, Any]) -> None:
        super().__init__(str(data_dir))
        self.data_dir = data_dir
        self.holder = holder

    @property
    def url(self) -> str | None:
        """The URL the holder serves on, if it is a server."""
        url = self.holder.get("url")
        return url if isinstance(url, str) else None

    def who(self) -> str:
        """The holder in words: `memspine-server (pid 123, http://127.0.0.1:7781)`."""
        name = str(self.holder.get("program") or "another memspine process")
        details = [f"pid {self.holder['pid']}"] if isinstance(self.holder.get("pid"), int) else []
        if self.url:
            details.append(self.url)
        return f"{name} ({', '.join(details)})" if details else name


class DataDirLock:
    """The held lock; released by close() or when the process ends."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    def close(self) -> None:
        """Release the lock (the file stays: removing it would race a process about to lock it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def hold(data_dir: Path, program: str, url: str | None = None) -> DataDirLock:
    """Create data_dir if needed and lock it for this process; DataDirBusy if another holds it.

    OSError (not a directory, not writable) is the caller's to report.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise DataDirBusy(data_dir, holder) from None
    except BaseException:
        os.close(fd)
        raise
    record = {"program": program, "pid": os.getpid(), "url": url}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return DataDirLock(fd, path)


def _read(fd: int) -> dict[str, Any]:
    """Who wrote the lock file; {} if it cannot be read as such (being written, or damaged)."""
    try:
        found = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def client_url(host: str, port: int) -> str:
    """The URL a client on this machine uses for a server bound to host:port."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"

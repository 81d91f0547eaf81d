"""Failpoints: named places in storage where a test can make real I/O fail; inert unless armed.

Tests arm them through the environment of the process, read once at import:

    MEMSPINE_FAILPOINTS=keyword.commit=enospc:3,log.commit=eio@5

arms `keyword.commit` to fail its next 3 hits with ENOSPC, and `log.commit` to let 5 hits pass
and then fail every one with EIO (`name=action[:count][@after]`). In-process tests call `arm`
and `disarm_all` instead. The action `pause` fails nothing: the hitting thread writes
`NAME.reached` into the directory MEMSPINE_FAILPOINT_GATES names and waits there until a test
writes `NAME.go` (a held-up operation whose world the test changes meanwhile). Each point sits right before the
operation whose I/O can fail, so what follows a hit is the store's own failure path (an aborted
LMDB transaction, a Tantivy writer to roll back, a temp file left behind). Unarmed, `hit` costs
one dictionary look-up: the table is empty.
"""

from __future__ import annotations

import errno
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import lmdb

ENV = "MEMSPINE_FAILPOINTS"
GATES = "MEMSPINE_FAILPOINT_GATES"
PAUSE = "pause"
# How long a paused point waits for its go before going on (a test that died must not leave a
# server stuck for ever).
PAUSE_LIMIT_SECS = 120.0

# Where storage calls `hit`: the points a test may arm (a typo in a spec must not arm nothing).
POINTS = frozenset(
    {
        "log.commit",  # storage/log/eventlog.py: a write transaction, before LMDB commits it
        "keyword.commit",  # storage/index/keyword.py: a Tantivy commit, documents already staged
        "keyword.reload",  # storage/index/keyword.py: a Tantivy commit durable, its searcher not yet
        "vectors.save",  # storage/index/vectors.py: the saved index written to its temp file, not renamed
        "purge.copy",  # storage/erasure/compact.py: the purge's copy of the log written, before its sync
        "retention.journal",  # storage/tenants/runs.py: a retention batch's ids, before the journal write
        "reads.append",  # storage/readlog/logfile.py: read records, before their write
        "reads.sync",  # storage/readlog/logfile.py: a read log's fdatasync (after an append)
        "reads.journal",  # storage/readlog/journal.py: a round's entries, before their write
        "delete.held",  # storage/read/retention.py: a delete on the writer, before its holds are read
    }
)


def _os_error(code: int) -> BaseException:
    return OSError(code, os.strerror(code))


# What each action raises: what the store itself raises for that fault.
ACTIONS: dict[str, Callable[[], BaseException]] = {
    "enospc": lambda: _os_error(errno.ENOSPC),
    "edquot": lambda: _os_error(errno.EDQUOT),
    "eio": lambda: _os_error(errno.EIO),
    "panic": lambda: lmdb.PanicError("mdb_txn_commit: MDB_PANIC: injected by a failpoint"),
}


class _Armed:
    """One armed point: what it raises, how many hits pass first, how many then fail (None:
    every one)."""

    __slots__ = ("action", "left", "skip")

    def __init__(self, action: str, left: int | None, skip: int) -> None:
        self.action = action
        self.left = left
        self.skip = skip


_armed: dict[str, _Armed] = {}
_lock = threading.Lock()
hits: dict[str, int] = {}  # failures raised per point since it was armed (for tests)


def hit(name: str) -> None:
    """Raise the armed fault of this point, if any."""
    if not _armed:
        return
    with _lock:
        armed = _armed.get(name)
        if armed is None:
            return
        if armed.skip:
            armed.skip -= 1
            return
        if armed.left is not None:
            armed.left -= 1
            if armed.left <= 0:
                del _armed[name]
        hits[name] = hits.get(name, 0) + 1
    if armed.action == PAUSE:
        _pause(name)
        return
    raise ACTIONS[armed.action]()


def _pause(name: str) -> None:
    """Say this point is reached, then wait for the test's go (a file in the gates directory)."""
    gates = Path(os.environ.get(GATES) or tempfile.gettempdir())
    (gates / f"{name}.reached").touch()
    go = gates / f"{name}.go"
    deadline = time.monotonic() + PAUSE_LIMIT_SECS
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def arm(name: str, action: str, count: int | None = None, *, after: int = 0) -> None:
    """Let `after` hits of a point pass, then make the next `count` (every one if None) raise
    `action`'s fault."""
    if name not in POINTS:
        raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(sorted(POINTS))}")
    if action not in ACTIONS and action != PAUSE:
        raise ValueError(
            f"unknown failpoint action {action!r}; known: {', '.join(sorted([*ACTIONS, PAUSE]))}"
        )
    if count is not None and count < 1:
        raise ValueError(f"a failpoint count must be at least 1, got {count}")
    if after < 0:
        raise ValueError(f"a failpoint's hits to let pass cannot be negative, got {after}")
    with _lock:
        _armed[name] = _Armed(action, count, after)
        hits[name] = 0


def disarm_all() -> None:
    """Make every point inert again."""
    with _lock:
        _armed.clear()


def armed() -> dict[str, int | None]:
    """The armed points and how many more hits of each fail (None: every one)."""
    with _lock:
        return {name: a.left for name, a in _armed.items()}


def load(env: Mapping[str, str]) -> None:
    """Arm the points named in env[ENV] (`name=action[:count][@after]`, comma-separated)."""
    spec = env.get(ENV, "").strip()
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, rest = item.partition("=")
        rest, _, after = rest.partition("@")
        action, _, count = rest.partition(":")
        if not sep or not action:
            raise ValueError(f"{ENV}: expected name=action[:count][@after], got {item!r}")
        try:
            n = int(count) if count else None
            skip = int(after) if after else 0
        except ValueError:
            raise ValueError(
                f"{ENV}: expected whole numbers after ':' and '@', got {item!r}"
            ) from None
        try:
            arm(name.strip(), action.strip(), n, after=skip)
        except ValueError as exc:
            raise ValueError(f"{ENV}: {exc}") from None


load(os.environ)

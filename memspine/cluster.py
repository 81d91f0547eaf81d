"""A cluster node's side of placement: which tenants it may serve, and a move's hold on writes.

Every tenant request passes `NodeGate.check` once its key is verified (memspine/auth.py), so
a node answers 421 `misdirected` for a tenant placed elsewhere whatever the door (HTTP, hot
routes, MCP); every write passes `enter_write`/`exit_write` around its lease (memspine/
engine.py), which counts the writes in flight per tenant so that `drain` can wait them out
when a move holds the tenant's writes (memspine_admin/move.py). Placements are cached per
control-plane generation, as verified keys are: a request costs a dictionary look-up.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from memspine_admin.placement import (
    MOVING,
    RETRY_AFTER_SECS,
    NodeFigures,
    Placement,
    holding,
    refusal,
)
from storage.errors import Unavailable

MAX_ENTRIES = 10_000
DRAIN_TIMEOUT_SECS = 30.0


def default_node_url(host: str, port: int) -> str:
    """Where other machines reach a server bound to host:port (the machine's name for a
    wildcard address)."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def node_figures(data_dir: Path, open_tenants: int) -> NodeFigures:
    """This node's tenants on disk and their allocated bytes (what the placement weighs)."""
    tenants = total = 0
    try:
        entries = list(os.scandir(data_dir))
    except FileNotFoundError:
        return NodeFigures(0, 0, open_tenants)
    for entry in entries:
        # _control, and .erasing-* or staging leftovers, are no tenant.
        if entry.name[0] in "._" or not entry.is_dir(follow_symlinks=False):
            continue
        tenants += 1
        for root, _dirs, files in os.walk(entry.path):
            for name in files:
                # A file may be renamed away meanwhile (a purge's swap).
                with contextlib.suppress(FileNotFoundError):
                    total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return NodeFigures(tenants, total, open_tenants)


class NodeGate:
    """What this node may serve, from the tenants' placement in the control plane."""

    def __init__(self, control: Any, node: str, *, max_entries: int = MAX_ENTRIES) -> None:
        """`control` is the PostgreSQL plane (memspine_admin/control_pg.py's PgControl)."""
        self.control = control
        self.node = node
        self._max = max_entries
        self._cache: OrderedDict[str, tuple[int, Placement | None]] = OrderedDict()
        self._lock = threading.Lock()
        self._writes: dict[str, int] = {}  # writes in flight per tenant
        self._held: dict[str, int] = {}  # tenant -> generation when a drain held its writes
        self._drained = threading.Condition(self._lock)

    def placement(self, tenant_id: str) -> tuple[int, Placement | None]:
        """The tenant's placement and the generation it holds at (one query per generation)."""
        # The generation is read before the row: a change committed after this read leaves
        # the entry at an older generation, and the next request reads the row again.
        generation = self.control.generation()
        with self._lock:
            entry = self._cache.get(tenant_id)
            if entry is not None and entry[0] == generation:
                self._cache.move_to_end(tenant_id)
                return entry
        placement = self.control.placement(tenant_id)
        with self._lock:
            self._cache[tenant_id] = (generation, placement)
            self._cache.move_to_end(tenant_id)
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return generation, placement

    def check(self, tenant_id: str, *, write: bool = False) -> None:
        """Raise 421 if this node must not serve the tenant; 503 for a write a move holds."""
        _generation, placement = self.placement(tenant_id)
        refused = refusal(placement, self.node, write=write)
        if refused is not None:
            raise refused

    def check_open(self, tenant_id: str) -> None:
        """Raise 421 unless this node may open the tenant's files: it serves the tenant, or it
        is the target of its move (the copy is written here before it serves it)."""
        _generation, placement = self.placement(tenant_id)
        refused = refusal(placement, self.node, write=False)
        if refused is not None and (placement is None or placement.move_to != self.node):
            raise refused

    def enter_write(self, tenant_id: str) -> None:
        """Count a write in flight for the tenant, or refuse it (421, or 503 while held)."""
        with self._lock:
            held = self._held.get(tenant_id)
            if held is None:
                self._writes[tenant_id] = self._writes.get(tenant_id, 0) + 1
        if held is not None:
            # Read from the database, not the watcher's cache: the watcher may not have seen yet
            # a change made since the drain (a hold whose lease ran out was refused until it
            # caught up). Only writes to a held tenant pay these two queries.
            generation = self.control.database_generation()
            placement = self.control.placement(tenant_id)
            # The hold outlives its move only if the plane, since the drain, says writes go on
            # here (the move was given up, or its hold's lease ran out): then it ends.
            expired = (
                placement is not None
                and placement.writes_held
                and not holding(placement, time.time_ns() // 1000)
            )
            released = (
                placement is not None
                and (generation > held or expired)
                and refusal(placement, self.node, write=True) is None
            )
            with self._lock:
                if not released or self._held.get(tenant_id) != held:
                    raise Unavailable(MOVING, headers={"Retry-After": str(RETRY_AFTER_SECS)})
                del self._held[tenant_id]
                self._writes[tenant_id] = self._writes.get(tenant_id, 0) + 1
        try:
            self.check(tenant_id, write=True)
        except BaseException:
            self.exit_write(tenant_id)
            raise

    def exit_write(self, tenant_id: str) -> None:
        """A counted write ended (committed or failed)."""
        with self._lock:
            left = self._writes.get(tenant_id, 1) - 1
            if left <= 0:
                self._writes.pop(tenant_id, None)
                self._drained.notify_all()
            else:
                self._writes[tenant_id] = left

    def drain(self, tenant_id: str, timeout: float = DRAIN_TIMEOUT_SECS) -> None:
        """Refuse the tenant's new writes here from now on, and wait for those in flight to
        end: afterwards nothing changes its files until the hold ends (503 if they do not end
        within `timeout`)."""
        # The database's generation, not the watcher's (which may lag): the hold ends only on
        # a change made after this drain.
        generation = self.control.database_generation()
        deadline = time.monotonic() + timeout
        with self._lock:
            self._held[tenant_id] = generation
            while self._writes.get(tenant_id):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Unavailable(
                        "the tenant's writes in flight did not end in time; retry the move",
                        headers={"Retry-After": str(RETRY_AFTER_SECS)},
                    )
                self._drained.wait(left)

    def release(self, tenant_id: str) -> None:
        """End this node's hold on the tenant's writes (its copy is erased, or the move ended)."""
        with self._lock:
            self._held.pop(tenant_id, None)
            self._cache.pop(tenant_id, None)

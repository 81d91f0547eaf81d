"""Read audit: a record of every read of event content, made where a read's answer is built.

Each read kind (one event, a page, a recall, an export) calls `ReadAudit.record` once with the
ids its answer carries and the `Reader` its door made: HTTP operations get it from the
pipeline (memspine/pipeline.py, `Operation.audited`), MCP tools and the embedded bridge from
memspine/mcp/backend.py. The records go to the process's one writer (storage/readlog/):
`buffered` answers at once and the writer commits every 100 ms; `durable` answers once the
record is synced; `off` records nothing (docs/audit.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import NamedTuple

from memspine.verifier import Principal
from memspine_admin.plane import ControlPlane
from memspine_admin.readaudit import mark_keeper
from storage import (
    MAX_PENDING,
    MAX_PENDING_PER_TENANT,
    Backlogged,
    Mark,
    Read,
    ReadLogWriter,
    check_purpose_text,
    first_ts,
    full_disk_as,
    records_of,
)
from storage import MAX_PURPOSE_BYTES as MAX_PURPOSE_BYTES  # the routes' docs name them
from storage import PURPOSE_HEADER as PURPOSE_HEADER
from storage.errors import DiskFull, InvalidRequest, Unavailable

BACKLOG_WAIT_SECS = 10.0
DAY_US = 86_400_000_000
CUT_SLACK_US = 3_600_000_000
POLL_SECS = 0.005
BACKLOG_FULL = (
    "the read audit's writer is behind (or its disk is full): this read was not answered "
    "because it could not be recorded; retry shortly"
)
NOT_RECORDED = "this read could not be recorded (the disk is full); nothing was answered"
HELD_FULL = (
    "the disk is full and this tenant's read records held in memory reached their bound: this "
    "read was not answered because it could not be recorded; retry once space is freed"
)


class Reader(NamedTuple):
    """Who reads, through which door (http, mcp, bridge) and route or tool, why."""

    key_id: str
    door: str
    route: str
    request_id: str
    purpose: str | None


def check_purpose(value: str | None, principal: Principal | None) -> str | None:
    """A read's purpose, checked: at most 200 bytes, no control characters, and given when the
    key requires one."""
    if value is None or value == "":
        if principal is not None and principal.require_purpose:
            raise InvalidRequest(
                f"this key requires a purpose for every read: send the {PURPOSE_HEADER} header "
                "(or the purpose argument of an MCP tool)"
            )
        return None
    return check_purpose_text(value)


class ReadAudit:
    """The server's read records: the mode, the process's writer, the waits of a full backlog."""

    def __init__(
        self,
        mode: str,
        root_of: Callable[[str], Path],
        *,
        max_pending: int = MAX_PENDING,
        max_pending_per_tenant: int = MAX_PENDING_PER_TENANT,
        journal: Path | None = None,
    ) -> None:
        """mode: buffered, durable or off; root_of: a tenant's directory; the backlog's
        bounds and the round journal's path (storage/readlog/writer.py)."""
        self.mode = mode
        self._root_of = root_of
        self._roots: dict[str, Path] = {}  # a Path join per read shows in a recall's profile
        # Even when off: retention still drops the records made before (expire).
        self.writer = ReadLogWriter(
            durable=mode == "durable",
            max_pending=max_pending,
            max_pending_per_tenant=max_pending_per_tenant,
            journal=journal,
        )
        self.writer.start()
        self.keep_cut: Callable[[str, Mark], None] = lambda _tenant_id, _mark: None

    def keep_marks_in(
        self,
        control_of: Callable[[], ControlPlane | None],
        serves: Callable[[str], bool] = lambda _tenant_id: True,
    ) -> None:
        """Hand the chains' heads (at intervals) and retention cuts (before they are made) to
        the control plane `control_of` gives, when there is one (not in local mode), for the
        tenants this process `serves` (a cluster node: those placed on it, so the node a
        tenant left records no head over the one its new node keeps, memspine/readmove.py)."""

        def keeper(cut: bool) -> Callable[[str, Mark], None]:
            def keep(tenant_id: str, mark: Mark) -> None:
                control = control_of()
                if control is not None and serves(tenant_id):
                    mark_keeper(control, cut=cut)(tenant_id, mark)

            return keep

        self.writer.on_head = keeper(False)
        self.keep_cut = keeper(True)

    def expire(
        self,
        tenant_ids: list[str],
        days: int,
        now_us: int | None = None,
        slack_us: int = CUT_SLACK_US,
    ) -> int:
        """Blocking: drop the read records older than `days` of these tenants, in chain order
        (each cut recorded first); the records dropped. A tenant is cut once its oldest record
        is an hour past the limit, so a busy log is not rewritten at every sweep."""
        now = time.time_ns() // 1000 if now_us is None else now_us
        before = now - days * DAY_US
        dropped = 0
        for tenant_id in tenant_ids:
            root = self._root_of(tenant_id)
            oldest = first_ts(root)
            if oldest is None or oldest >= before - slack_us:
                continue
            done = self.writer.cut(tenant_id, root, before, partial(self.keep_cut, tenant_id))
            dropped += done.result()
        return dropped

    async def record(self, tenant_id: str, reader: Reader, event_ids: list[str]) -> None:
        """Record one read; durable: return once it is synced. A read that returned no event
        is not recorded (it read no content)."""
        w = self.writer
        if self.mode == "off" or not event_ids:
            return
        root = self._roots.get(tenant_id)
        if root is None:
            root = self._roots[tenant_id] = self._root_of(tenant_id)
        ts = time.time_ns() // 1000
        waits = []
        r = reader
        for read in records_of(ts, r.key_id, r.door, r.route, r.request_id, r.purpose, event_ids):
            done = await self._submit(w, tenant_id, root, read)
            if done is not None:
                waits.append(done)
        for done in waits:
            with full_disk_as(NOT_RECORDED):
                await asyncio.wrap_future(done)

    async def _submit(
        self, w: ReadLogWriter, tenant_id: str, root: Path, read: Read
    ) -> Future[None] | None:
        """Queue a record, waiting while the backlog is full (503 after BACKLOG_WAIT_SECS)."""
        deadline = time.monotonic() + BACKLOG_WAIT_SECS
        while True:
            try:
                return w.submit(tenant_id, root, read)
            except Backlogged:
                if w.stuck(tenant_id):  # held for a full disk: no wait would help
                    raise DiskFull(HELD_FULL) from None
                if time.monotonic() > deadline or w.failing is not None:
                    raise Unavailable(BACKLOG_FULL, headers={"Retry-After": "5"}) from None
                await asyncio.sleep(POLL_SECS)

    def close(self) -> None:
        """Write what is queued and stop the writer."""
        self.writer.stop()

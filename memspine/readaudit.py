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
import unicodedata
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import NamedTuple

from memspine_admin.verifier import Principal
from storage.errors import DiskFull, InvalidRequest, Unavailable
from storage.readlog import Backlogged, Mark, Read, ReadLogWriter
from storage.space import names_full_disk

PURPOSE_HEADER = "Memspine-Purpose"
MAX_PURPOSE_BYTES = 200
IDS_PER_RECORD = 4096  # a bigger answer (an export) is several records of one request
BACKLOG_WAIT_SECS = 10.0
POLL_SECS = 0.005
BACKLOG_FULL = (
    "the read audit's writer is behind (or its disk is full): this read was not answered "
    "because it could not be recorded; retry shortly"
)
NOT_RECORDED = "this read could not be recorded (the disk is full); nothing was answered"


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
        if principal is not None and getattr(principal, "require_purpose", False):
            raise InvalidRequest(
                f"this key requires a purpose for every read: send the {PURPOSE_HEADER} header "
                "(or the purpose argument of an MCP tool)"
            )
        return None
    if len(value.encode("utf-8", "surrogatepass")) > MAX_PURPOSE_BYTES:
        raise InvalidRequest(f"{PURPOSE_HEADER} may be at most {MAX_PURPOSE_BYTES} bytes")
    if any(unicodedata.category(ch).startswith("C") for ch in value):
        raise InvalidRequest(f"{PURPOSE_HEADER} must not contain control characters")
    return value


class ReadAudit:
    """The server's read records: the mode, the process's writer, the waits of a full backlog."""

    def __init__(self, mode: str, root_of: Callable[[str], Path]) -> None:
        """mode: buffered, durable or off; root_of: a tenant's directory."""
        self.mode = mode
        self._root_of = root_of
        self.writer: ReadLogWriter | None = None
        if mode != "off":
            self.writer = ReadLogWriter(durable=mode == "durable")
            self.writer.start()

    def set_head_keeper(self, keep: Callable[[str, Mark], None] | None) -> None:
        """Where the chains' heads go at intervals (the control plane)."""
        if self.writer is not None:
            self.writer.on_head = keep

    async def record(self, tenant_id: str, reader: Reader, event_ids: list[str]) -> None:
        """Record one read; durable: return once it is synced. A read that returned no event
        is not recorded (it read no content)."""
        w = self.writer
        if w is None or not event_ids:
            return
        root = self._root_of(tenant_id)
        ts = time.time_ns() // 1000
        waits = []
        for i in range(0, len(event_ids), IDS_PER_RECORD):
            read = Read(
                ts=ts,
                key_id=reader.key_id,
                door=reader.door,
                route=reader.route,
                request_id=reader.request_id,
                purpose=reader.purpose,
                event_ids=event_ids[i : i + IDS_PER_RECORD],
            )
            done = await self._submit(w, tenant_id, root, read)
            if done is not None:
                waits.append(done)
        for done in waits:
            try:
                await asyncio.wrap_future(done)
            except OSError as exc:
                if names_full_disk(exc):
                    raise DiskFull(NOT_RECORDED) from exc
                raise

    async def _submit(
        self, w: ReadLogWriter, tenant_id: str, root: Path, read: Read
    ) -> Future[None] | None:
        """Queue a record, waiting while the backlog is full (503 after BACKLOG_WAIT_SECS)."""
        deadline = time.monotonic() + BACKLOG_WAIT_SECS
        while True:
            try:
                return w.submit(tenant_id, root, read)
            except Backlogged:
                if time.monotonic() > deadline or w.failing is not None:
                    raise Unavailable(BACKLOG_FULL, headers={"Retry-After": "5"}) from None
                await asyncio.sleep(POLL_SECS)

    def close(self) -> None:
        """Write what is queued and stop the writer."""
        if self.writer is not None:
            self.writer.stop()

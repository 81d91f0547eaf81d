"""GET /v1/memory/export: the caller's tenant as the NDJSON of storage/transfer/format.py.

The export is written from one snapshot into a spool file, then streamed from it: the snapshot
(which a purge's swap or a map growth of the tenant waits for) is held for as long as the local
disk takes to write it, never for as long as a slow client takes to read. The spool has no
name (O_TMPFILE in the data directory): its bytes leave the disk when the answer ends or the
process does, whatever way it ends.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Callable
from typing import IO

import anyio.to_thread

from memspine.pipeline import READ, Call, Operation, Outcome, Reply, Streamed
from memspine.routes.memory import PURPOSE
from storage import MEDIA_TYPE, Tenant, full_disk_as, record_copy, write_export

CHUNK_BYTES = 1 << 20
SPOOL_BUFFER_BYTES = 1 << 20
NO_ROOM = (
    "the server's disk is full: the export could not be written out before sending; "
    "retry once space is freed"
)


async def export_tenant(call: Call) -> Outcome:
    """The tenant's export, spooled then streamed; a tenant never written exports empty."""
    tenant_id = call.tenant_id
    exported: list[str] = []
    outcome = await spooled(call, lambda t, spool: write_export(t, spool, tenant_id, exported))
    await recorded(call, outcome, exported)
    # what an erasure's receipt lists as a copy that may still hold its events
    await anyio.to_thread.run_sync(
        record_copy, call.services.settings.data_dir, "export", tenant_id
    )
    return outcome


async def recorded(call: Call, outcome: Outcome, exported: list[str]) -> None:
    """Record a spooled export's read before its first byte leaves (every event in it counts
    as read); its spool is closed if the record cannot be made."""
    try:
        if call.reader is not None:
            await call.services.engine.reads.record(call.tenant_id, call.reader, exported)
    except BaseException:
        if isinstance(outcome.value, Streamed):
            await outcome.value.chunks.aclose()  # type: ignore[attr-defined]
        raise


async def spooled(call: Call, write: Callable[[Tenant, IO[bytes]], int]) -> Outcome:
    """What `write` writes of the caller's tenant (its bytes' count), into a spool from one
    read, then streamed from it; 503 if the disk is full."""
    services, tenant_id = call.services, call.tenant_id
    data_dir = services.settings.data_dir
    # Closed by _chunks once the answer ends, or below if it never starts.
    spool = tempfile.TemporaryFile(dir=data_dir, buffering=SPOOL_BUFFER_BYTES)  # noqa: SIM115

    def spool_it(t: Tenant) -> int:
        size = write(t, spool)
        spool.flush()
        spool.seek(0)
        return size

    try:
        with full_disk_as(NO_ROOM, data_dir):
            async with services.engine.export_shares.slot(tenant_id):  # one per tenant at once
                size = await services.engine.read(tenant_id, spool_it)
    except BaseException:
        spool.close()
        raise
    return Outcome(200, Streamed(_chunks(spool), size), media_type=MEDIA_TYPE)


async def _chunks(spool: IO[bytes]) -> AsyncIterator[bytes]:
    """The spool's bytes, read off the event loop; the spool is closed however the answer ends."""
    try:
        while chunk := await anyio.to_thread.run_sync(spool.read, CHUNK_BYTES):
            yield chunk
    finally:
        spool.close()


EXPORT = Operation(
    "export_events",
    "GET",
    "/v1/memory/export",
    READ,
    export_tenant,
    "The whole tenant as NDJSON: a header, every live event, a trailer that counts and hashes",
    replies={
        200: Reply(
            str,
            "One JSON object per line: `header`, one `event` per live event in append order, "
            "`idempotency` records of deleted events, `end` with the counts and a SHA-256 "
            "(docs/api.md, Export format).",
            media_type=MEDIA_TYPE,
        )
    },
    errors=(503,),
    description="From one snapshot; memspine-admin import loads it (docs/operations.md).",
    headers=(PURPOSE,),
    audited=True,
)

OPERATIONS = (EXPORT,)

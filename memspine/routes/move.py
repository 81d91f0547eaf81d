"""/v1/admin/move/{tenant_id}/…: a node's part in moving a tenant (memspine_admin/move.py).

On the source node: `export` (everything, or what changed after an op, from one snapshot),
`deleted` (the ids deleted in a range of ops) and `drain` (wait out the writes in flight once
the control plane holds them). On the target node: `pull`, which reads the source's export
straight from the source (its URL from the control plane, never from the caller) into the
tenant here: the first round lands a new directory (storage/transfer/landing.py), later rounds
write through the open tenant and then delete and purge what the source deleted. On either:
DELETE erases the local copy, refused while this node serves the tenant. Admin key only; a
server that is not a cluster node answers 409.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import IO, Any

import anyio.to_thread
import httpx
import msgspec

from memspine.cluster import NodeGate
from memspine.pipeline import ADMIN, Call, Operation, Outcome, Query, Reply, Streamed
from memspine.queryparams import int_range
from memspine.readmove import TakeIn, Taken, hand_over, take
from memspine_admin.placement import refusal
from storage import (
    MEDIA_TYPE,
    Tenant,
    apply_changes,
    await_carried,
    import_tenant,
    is_tenant_id,
    receipts_of_tenant,
    sweep_stale,
    take_receipts,
    whole_bytes,
    write_since,
)
from storage.errors import Conflict, InvalidRequest, MemspineError, NotFound, Unavailable

MOVE = "/v1/admin/move/{tenant_id:str}"
LAST_SEQ = "Memspine-Last-Seq"  # the export's snapshot: the op the next round starts after
CHUNK_BYTES = 1 << 20
MAX_SEQ = 2**63 - 1
NOT_A_NODE = "this server is not a cluster node (MEMSPINE_NODE): it moves no tenant"
# A pull reads the source for as long as the copy takes; only a silence this long fails it.
PULL_TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=60.0, pool=10.0)


class PullIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST …/pull: copy what the source's log holds after op `after` (0: everything), and with
    `receipts` the tenant's signed receipts too (the held round)."""

    after: int = msgspec.field(default=0)
    receipts: bool = False


class Pulled(msgspec.Struct):
    """What one round of a pull wrote here."""

    tenant_id: str
    after: int
    last_seq: int  # the source's op this copy is now current with
    events: int
    deleted: int
    receipts: int = 0  # signed receipts new here


class MovedReceipt(msgspec.Struct):
    """One signed receipt file of the tenant, byte for byte (UTF-8 JSON)."""

    receipt_id: str
    body: str


class MovedReceipts(msgspec.Struct):
    """GET …/receipts: the tenant's signed erasure and retention receipts on the source."""

    receipts: list[MovedReceipt]


class Drained(msgspec.Struct):
    """The source once its writes are held and those in flight ended."""

    tenant_id: str
    last_seq: int


class Deleted(msgspec.Struct):
    """Ids deleted in a range of the source's ops."""

    deleted: list[str]


class Erased(msgspec.Struct):
    """A local copy erased (or there was none)."""

    tenant_id: str
    erased: bool


def _gate(call: Call) -> NodeGate:
    gate = call.services.auth.gate
    if gate is None:
        raise Conflict(NOT_A_NODE)
    return gate


def _tenant_id(call: Call) -> str:
    tenant_id: str = call.path["tenant_id"]
    if not is_tenant_id(tenant_id):
        raise NotFound("no tenant with that id")
    return tenant_id


def _serving(gate: NodeGate, tenant_id: str) -> None:
    """Conflict unless this node serves the tenant (it is the source of its data)."""
    placement = gate.control.placement(tenant_id)
    if placement is None:
        raise NotFound("no tenant with that id")
    if refusal(placement, gate.node, write=False) is not None:
        raise Conflict("this node does not hold the tenant")


async def _export(call: Call) -> Outcome:
    """The tenant's export from one snapshot, whole (after=0) or what came after an op."""
    gate, tenant_id = _gate(call), _tenant_id(call)
    await anyio.to_thread.run_sync(_serving, gate, tenant_id)
    after = call.query.get("after", 0)
    services = call.services
    # Spooled, as GET /v1/memory/export is: the snapshot is held for the local disk's time.
    spool = tempfile.TemporaryFile(dir=services.settings.data_dir)  # noqa: SIM115

    def spool_it(t: Tenant) -> tuple[int, int]:
        last, size = write_since(t, spool, tenant_id, after, ledger=True)
        spool.flush()
        spool.seek(0)
        return last, size

    try:
        last, size = await services.engine.read(tenant_id, spool_it)
    except BaseException:
        spool.close()
        raise
    return Outcome(
        200, Streamed(_chunks(spool), size), headers={LAST_SEQ: str(last)}, media_type=MEDIA_TYPE
    )


async def _chunks(spool: IO[bytes]) -> AsyncIterator[bytes]:
    try:
        while chunk := await anyio.to_thread.run_sync(spool.read, CHUNK_BYTES):
            yield chunk
    finally:
        spool.close()


async def _deleted(call: Call) -> Outcome:
    """The ids the tenant's log deleted in ops after `after`, up to `upto`."""
    gate, tenant_id = _gate(call), _tenant_id(call)
    await anyio.to_thread.run_sync(_serving, gate, tenant_id)
    after, upto = call.query.get("after", 0), call.query.get("upto", MAX_SEQ)

    deleted = await call.services.engine.read(tenant_id, lambda t: t.deleted_after(after, upto))
    return Outcome(200, Deleted(deleted))


async def _receipts(call: Call) -> Outcome:
    """The tenant's receipt files here, for the target to keep (docs/operations.md)."""
    gate, tenant_id = _gate(call), _tenant_id(call)
    await anyio.to_thread.run_sync(_serving, gate, tenant_id)
    data_dir = call.services.settings.data_dir
    found = await anyio.to_thread.run_sync(receipts_of_tenant, data_dir, tenant_id)
    return Outcome(200, MovedReceipts([MovedReceipt(i, b.decode()) for i, b in found]))


async def _drain(call: Call) -> Outcome:
    """Once the control plane holds the tenant's writes: refuse them here too, wait for those
    in flight, and answer the op the copy must reach."""
    gate, tenant_id = _gate(call), _tenant_id(call)
    placement = await anyio.to_thread.run_sync(gate.control.placement, tenant_id)
    if placement is None:
        raise NotFound("no tenant with that id")
    if placement.node != gate.node or placement.move_to is None or not placement.writes_held:
        raise Conflict("the tenant's writes are not held for a move from this node")
    await anyio.to_thread.run_sync(gate.drain, tenant_id)

    last = await call.services.engine.read(tenant_id, lambda t: t.last_seq())
    return Outcome(200, Drained(tenant_id, last))


class _Body(io.RawIOBase):
    """A response body's chunks as a readable stream (what the import path reads lines from)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left = chunk
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def _source_error(what: str, r: httpx.Response) -> MemspineError:
    try:
        detail = str(r.json().get("detail", ""))
    except ValueError:
        detail = ""
    return Unavailable(
        f"the source node refused {what} ({r.status_code}{': ' + detail if detail else ''})",
        headers={"Retry-After": "1"},
    )


async def _pull(call: Call) -> Outcome:
    """Copy into this node, the target of the tenant's move, what its source holds after op
    `after`: the first round (after=0) makes the tenant here, later ones bring it up to date."""
    gate, tenant_id = _gate(call), _tenant_id(call)
    after = call.body.after
    if not 0 <= after <= MAX_SEQ:
        raise InvalidRequest("after must be an op number from 0")
    placement = await anyio.to_thread.run_sync(gate.control.placement, tenant_id)
    if placement is None:
        raise NotFound("no tenant with that id")
    if placement.move_to != gate.node or placement.node is None:
        raise Conflict("this node is not the target of a move of this tenant")
    urls = {n.name: n.url for n in await anyio.to_thread.run_sync(gate.control.node_loads)}
    source = urls.get(placement.node)
    if not source:
        raise Conflict(f"node {placement.node} has registered no URL (MEMSPINE_NODE_URL)")
    services = call.services
    receipts = call.body.receipts
    result = await anyio.to_thread.run_sync(
        lambda: _pull_from(services, source, tenant_id, after, receipts)
    )
    return Outcome(200, result)


def _pull_from(
    services: Any, source: str, tenant_id: str, after: int, receipts: bool = False
) -> Pulled:
    """The blocking part of a pull (a worker thread)."""
    data_dir = services.settings.data_dir
    manager = services.engine.manager
    admin = {"Authorization": f"Bearer {services.settings.admin_key}"}
    path = f"/v1/admin/move/{tenant_id}"
    with httpx.Client(base_url=source, headers=admin, timeout=PULL_TIMEOUT) as http:
        with http.stream("GET", f"{path}/export", params={"after": after}) as r:
            if r.status_code != 200:
                r.read()
                raise _source_error("the export", r)
            last = int(r.headers[LAST_SEQ])
            body = io.BufferedReader(_Body(r.iter_raw()), CHUNK_BYTES)
            if after == 0:
                if (data_dir / tenant_id).exists():
                    raise Conflict(
                        "this node has a copy of the tenant already; erase it first "
                        f"(DELETE {path} here)"
                    )
                events = import_tenant(data_dir, tenant_id, body).events
                # Its read log follows once the source erases its copy (memspine/readmove.py).
                await_carried(data_dir / tenant_id)
            else:
                with manager.use(tenant_id) as t:
                    events = apply_changes(t, body)
        deleted = 0
        if after > 0:
            r = http.get(f"{path}/deleted", params={"after": after, "upto": last})
            if r.status_code != 200:
                raise _source_error("the deleted ids", r)
            ids = r.json()["deleted"]
            if ids:
                with manager.use(tenant_id) as t:
                    deleted = len(t.submit_delete(ids).result())
                    if deleted:
                        t.purge()  # their bytes leave this node's disk before the switch
        taken = 0
        if receipts:
            r = http.get(f"{path}/receipts")
            if r.status_code != 200:
                raise _source_error("the receipts", r)
            found = msgspec.json.decode(r.content, type=MovedReceipts).receipts
            taken = take_receipts(
                data_dir, tenant_id, [(x.receipt_id, x.body.encode()) for x in found]
            )
    return Pulled(
        tenant_id=tenant_id,
        after=after,
        last_seq=last,
        events=events,
        deleted=deleted,
        receipts=taken,
    )


async def _erase(call: Call) -> Outcome:
    """Erase this node's copy of the tenant, once the control plane says it serves it no more
    (the source after its move, or the target of a move given up)."""
    gate, tenant_id = _gate(call), _tenant_id(call)
    placement = await anyio.to_thread.run_sync(gate.control.placement, tenant_id)
    if placement is not None and refusal(placement, gate.node, write=False) is None:
        raise Conflict("this node serves the tenant; its copy here is not erased")
    services = call.services

    def erase() -> bool:
        data_dir = services.settings.data_dir
        engine, key = services.engine, services.settings.admin_key or ""
        # New requests find it placed elsewhere; its read records go to its node first.
        erased = engine.erase_copy(tenant_id, lambda: hand_over(engine, gate, tenant_id, key))
        sweep_stale(data_dir, tenant_id)  # an import of a pull that was killed
        return erased

    erased = await anyio.to_thread.run_sync(erase)
    gate.release(tenant_id)
    return Outcome(200, Erased(tenant_id, erased))


async def _reads(call: Call) -> Outcome:
    """The node a tenant left: its read log, whole records only, for the tenant's node to
    take (memspine/readmove.py); 409 while this node is the tenant's node."""
    gate, tenant_id = _gate(call), _tenant_id(call)
    placement = await anyio.to_thread.run_sync(gate.control.placement, tenant_id)
    if placement is None:
        raise NotFound("no tenant with that id")
    if placement.node in (None, gate.node):
        raise Conflict("this node is the tenant's node: its read records stay here")
    root = call.services.engine.manager.path_of(tenant_id)
    found = await anyio.to_thread.run_sync(whole_bytes, root)
    return Outcome(200, found or b"", media_type="application/octet-stream")


async def _take_reads(call: Call) -> Outcome:
    """The tenant's node: take its read records from the node it left, ours chained after."""
    gate, tenant_id = _gate(call), _tenant_id(call)
    placement = await anyio.to_thread.run_sync(gate.control.placement, tenant_id)
    if placement is None:
        raise NotFound("no tenant with that id")
    if placement.node != gate.node or call.body.source == gate.node:
        raise Conflict("this node is not the tenant's node, or the source is this node")
    services = call.services
    taken = await anyio.to_thread.run_sync(
        lambda: take(
            services.engine, gate, tenant_id, call.body.source, services.settings.admin_key or ""
        )
    )
    return Outcome(200, taken)


OP = Query(
    "after",
    int_range("after", 0, MAX_SEQ),
    {"type": "integer", "minimum": 0, "default": 0},
    "Only what the log gained after this op (0: everything).",
)
UPTO = Query(
    "upto",
    int_range("upto", 0, MAX_SEQ),
    {"type": "integer", "minimum": 0},
    "Only ops up to this one (the op an export's Memspine-Last-Seq named).",
)


def _move(name: str, method: str, suffix: str, run: Any, summary: str, **more: Any) -> Operation:
    return Operation(name, method, MOVE + suffix, ADMIN, run, summary, tag="admin", **more)


OPERATIONS = (
    _move(
        "move_export",
        "GET",
        "/export",
        _export,
        "A move's source: the tenant's export, whole or after an op, from one snapshot",
        query=(OP,),
        replies={
            200: Reply(
                str,
                "The export format of GET /v1/memory/export; Memspine-Last-Seq names the op "
                "of its snapshot.",
                media_type=MEDIA_TYPE,
            )
        },
        errors=(404, 409, 503),
    ),
    _move(
        "move_deleted",
        "GET",
        "/deleted",
        _deleted,
        "A move's source: the ids deleted in a range of ops",
        query=(OP, UPTO),
        replies={200: Reply(Deleted, "The ids, in op order.")},
        errors=(404, 409),
    ),
    _move(
        "move_receipts",
        "GET",
        "/receipts",
        _receipts,
        "A move's source: the tenant's signed receipts, for its target to keep",
        replies={200: Reply(MovedReceipts, "Each receipt file, byte for byte.")},
        errors=(404, 409),
    ),
    _move(
        "move_drain",
        "POST",
        "/drain",
        _drain,
        "A move's source: refuse the tenant's writes here and wait for those in flight",
        replies={200: Reply(Drained, "The op the copy must reach.")},
        errors=(404, 409, 503),
    ),
    _move(
        "move_pull",
        "POST",
        "/pull",
        _pull,
        "A move's target: copy from the source what its log holds after an op",
        body=PullIn,
        replies={200: Reply(Pulled, "What this round wrote here.")},
        errors=(404, 409, 413, 503),
    ),
    _move(
        "move_reads",
        "GET",
        "/reads",
        _reads,
        "The node a tenant left: its read log, for the tenant's node to take",
        replies={
            200: Reply(
                str,
                "The read log's bytes up to its last whole record (docs/audit.md); empty "
                "when there is none.",
                media_type="application/octet-stream",
            )
        },
        errors=(404, 409),
    ),
    _move(
        "move_take_reads",
        "POST",
        "/reads",
        _take_reads,
        "The tenant's node: take its read records from the node it left",
        body=TakeIn,
        replies={200: Reply(Taken, "The chain's head here after them.")},
        errors=(404, 409, 503),
    ),
    _move(
        "move_erase",
        "DELETE",
        "",
        _erase,
        "Erase this node's copy of a tenant it no longer serves",
        replies={200: Reply(Erased, "Erased, or there was no copy.")},
        errors=(404, 409),
    ),
)

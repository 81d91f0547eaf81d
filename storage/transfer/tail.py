"""What a tenant's log gained after an operation number: its appends as an export, its deletes.

A move (memspine_admin/move.py) copies a tenant while it is written: first everything, then,
round after round, what changed since the previous round, the last round while its writes are
held. A round is read from one snapshot with `changes`: the events appended after op `after`
and still live, as an export (storage/transfer/format.py, so the import path checks and writes
it as it does any export), the ids deleted after it, and the snapshot's last op, where the
next round starts. The ops of the log make this exact: every append and every delete has one,
in order, and a purge keeps them (it drops the deleted records and their tombstones only), so
an event copied in one round and deleted before the next is named by the next one's deletes.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from typing import IO

import msgspec

from storage.log import layout
from storage.log.reader import LogReader
from storage.model import SOURCE_FROM, SUPERSEDES
from storage.tenants.tenant import Tenant
from storage.transfer.export import export_lines, vectors_by
from storage.transfer.format import (
    FORMAT,
    FORMAT_VERSION,
    Header,
    Links,
    Reader,
    end_line,
    event_line,
    header_line,
    idempotency_line,
)
from storage.transfer.load import lines_of, load, read_header


class Changes(msgspec.Struct, frozen=True, kw_only=True):
    """One round of a copy: what the snapshot at op `last_seq` holds that op `after` did not."""

    after: int
    last_seq: int
    appended: list[str]  # live events appended after `after`, in append order
    deleted: list[str]  # events deleted after `after` (including ones appended after it)


def changes(r: LogReader, after: int) -> Changes:
    """The ops after `after` in the snapshot r, as ids (constant work per op, no record read)."""
    appended: list[str] = []
    deleted: list[str] = []
    for _seq, op, event_id in r.ops_after(after):
        # An OP_EMBED (a server vector written after the append) is not carried: the event's
        # record as a later round reads it has the vector; one copied before has not, and the
        # new node's embedder makes it (the event is listed for it there).
        if op == layout.OP_APPEND:
            appended.append(event_id)
        elif op == layout.OP_DELETE:
            deleted.append(event_id)
    return Changes(after=after, last_seq=r.last_seq(), appended=appended, deleted=deleted)


def changes_lines(
    r: LogReader, tenant_id: str, found: Changes, *, default_dim: int = 384
) -> Iterator[bytes]:
    """The export of the events `found` appended (with their links and idempotency records),
    and the idempotency records of the events it deleted, from the same snapshot r."""
    digest = hashlib.sha256()
    header = Header(
        format=FORMAT,
        version=FORMAT_VERSION,
        tenant_id=tenant_id,
        embedding_dim=r.meta_int(layout.DIM) or default_dim,
        embedding_model=r.meta_str(layout.MODEL),
        vectors_by=vectors_by(r),
        exported_at=time.time_ns() // 1000,
        events=len(found.appended),
    )
    line = header_line(header)
    digest.update(line)
    yield line
    for event_id in found.appended:
        ev = r.get(event_id)
        assert ev is not None  # its append op is in this snapshot: it is live in it
        links = Links(
            SOURCE_FROM=r.links_out(event_id, SOURCE_FROM),
            SUPERSEDES=r.links_out(event_id, SUPERSEDES),
        )
        idem = r.idempotency(event_id)
        line = event_line(ev, links, None if idem is None else (idem.body_hash, idem.unlinked))
        digest.update(line)
        yield line
    kept = 0
    for event_id in found.deleted:
        rec = r.idempotency(event_id)
        if rec is None:
            continue
        # A retry of that append must still replay on the new node, not store it again.
        line = idempotency_line(event_id, rec.body_hash, rec.unlinked)
        digest.update(line)
        kept += 1
        yield line
    yield end_line(len(found.appended), kept, digest.hexdigest())


def write_since(
    tenant: Tenant, out: IO[bytes], tenant_id: str, after: int = 0, *, ledger: bool = False
) -> tuple[int, int]:
    """Write the tenant's export from one snapshot to out: whole (after=0; with its erasure
    ledger if `ledger`) or what its log gained after op `after`; the snapshot's last op and the
    bytes written."""
    with tenant.snapshot() as r:
        last = r.last_seq()
        if after == 0:
            lines = export_lines(r, tenant_id, default_dim=tenant.dim, ledger=ledger)
        else:
            lines = changes_lines(r, tenant_id, changes(r, after), default_dim=tenant.dim)
        size = 0
        for line in lines:
            out.write(line)
            size += len(line)
    return last, size


def apply_changes(tenant: Tenant, stream: IO[bytes]) -> int:
    """Write a round's export (changes_lines) into the open tenant through its writer, every
    line checked; the events written. An event the tenant holds already (the same round sent
    again) is kept as it is."""
    reader = Reader()
    lines = lines_of(stream)
    read_header(lines, reader)
    with tenant.log.reader() as r:
        keep = r.last_seq()
    return load(tenant, lines, reader, keep_before=keep).events

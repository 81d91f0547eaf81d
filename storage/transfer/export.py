"""Export: one snapshot of a tenant's log as the lines of storage/transfer/format.py."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

from storage.log import layout
from storage.log.reader import LogReader
from storage.model import SOURCE_FROM, SUPERSEDES
from storage.transfer.format import (
    FORMAT,
    FORMAT_VERSION,
    Header,
    Links,
    end_line,
    event_line,
    header_line,
    idempotency_line,
)


def export_lines(r: LogReader, tenant_id: str, *, default_dim: int = 384) -> Iterator[bytes]:
    """Every line of the tenant's export, from the one snapshot r, in constant memory."""
    digest = hashlib.sha256()
    header = Header(
        format=FORMAT,
        version=FORMAT_VERSION,
        tenant_id=tenant_id,
        embedding_dim=r.meta_int(layout.DIM) or default_dim,
        embedding_model=r.meta_str(layout.MODEL),
        exported_at=time.time_ns() // 1000,
        events=r.count(),
    )
    line = header_line(header)
    digest.update(line)
    yield line
    events = 0
    for _seq, op, event_id in r.ops_after(0):  # append order; a delete removed its append op
        if op != layout.OP_APPEND:
            continue
        ev = r.get(event_id)
        if ev is None:
            continue
        links = Links(
            SOURCE_FROM=r.links_out(event_id, SOURCE_FROM),
            SUPERSEDES=r.links_out(event_id, SUPERSEDES),
        )
        idem = r.idempotency(event_id)
        line = event_line(ev, links, None if idem is None else (idem.body_hash, idem.unlinked))
        digest.update(line)
        events += 1
        yield line
    kept = 0
    for event_id, rec in r.idempotency_records():
        if r.exists(event_id):
            continue  # carried on its event's line
        line = idempotency_line(event_id, rec.body_hash, rec.unlinked)
        digest.update(line)
        kept += 1
        yield line
    yield end_line(events, kept, digest.hexdigest())

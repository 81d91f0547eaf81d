"""A conversion written as memspine's own export (storage/transfer/format.py) and loaded by
memspine's own import (storage/transfer/landing.py): the same checks, the same staging, so a
refused or interrupted import leaves the tenant as it was."""

from __future__ import annotations

import hashlib
import io
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from storage.errors import NotFound
from storage.log import layout
from storage.model import StoredEvent
from storage.transfer import format as fmt
from storage.transfer.export import log_snapshot
from storage.transfer.foreign.records import Conversion, Record, event_id
from storage.transfer.landing import import_tenant
from storage.transfer.load import Drop, ImportStats, Progress

DEFAULT_DIM = 384  # a new tenant's dimension when no embedding is kept (Tenant.open's default)


def export_lines(conv: Conversion, tenant_id: str, dim: int) -> Iterator[bytes]:
    """The lines of a memspine export holding the conversion's records, ids from their keys."""
    model = conv.report.embedding_model
    header = fmt.Header(
        format=fmt.FORMAT,
        version=fmt.FORMAT_VERSION,
        tenant_id=tenant_id,
        embedding_dim=dim,
        embedding_model=model,
        exported_at=time.time_ns() // 1000,
        events=len(conv.records),
        vectors_by="client" if model is not None else None,
    )
    digest = hashlib.sha256()
    first = fmt.header_line(header)
    digest.update(first)
    yield first
    for rec in conv.records:
        line = _event_line(rec, tenant_id, model)
        digest.update(line)
        yield line
    yield fmt.end_line(len(conv.records), 0, digest.hexdigest())


def _event_line(rec: Record, tenant_id: str, model: str | None) -> bytes:
    """One record as an event line."""
    sources = [event_id(tenant_id, k) for k in rec.sources]
    superseded = [event_id(tenant_id, k) for k in rec.supersedes]
    properties = dict(rec.properties)
    if sources:  # where an append carries them (docs/api.md)
        properties["source_event_ids"] = sources
    event = StoredEvent(
        event_id=event_id(tenant_id, rec.key),
        seq=0,
        kind=rec.kind,
        ts=rec.ts,
        text=rec.text,
        embedding=rec.embedding,
        embedding_model=model if rec.embedding is not None else None,
        properties_raw=msgspec.json.encode(properties) if properties else None,
        supersedes=superseded,
        valid_from=rec.valid_from,
        valid_until=rec.valid_until,
        subjects=list(rec.subjects),
    )
    return fmt.event_line(event, fmt.Links(SOURCE_FROM=sources, SUPERSEDES=superseded), None)


def present(data_dir: Path, tenant_id: str, conv: Conversion) -> tuple[int | None, int]:
    """The tenant's embedding dimension (None: no tenant yet) and how many of the conversion's
    events it holds already, read from one snapshot (safe while a server serves it)."""
    if not (data_dir / tenant_id).is_dir():
        return None, 0
    try:
        with log_snapshot(data_dir / tenant_id) as r:
            held = sum(r.exists(event_id(tenant_id, rec.key)) for rec in conv.records)
            return r.meta_int(layout.DIM), held
    except NotFound:  # a directory without a log yet
        return None, 0


def land(
    data_dir: Path,
    tenant_id: str,
    conv: Conversion,
    *,
    dim: int | None = None,
    progress: Progress | None = None,
    drop: Drop | None = None,
) -> ImportStats:
    """Import the conversion into DATA_DIR/<tenant_id>, merging into what it holds (the events
    of an earlier run of the same file are there already and kept as they are); `drop` as
    memspine's own import takes it (events past their retention window)."""
    if dim is None:
        dim = _dim_of(conv) or DEFAULT_DIM
    stream = io.BytesIO(b"".join(export_lines(conv, tenant_id, dim)))
    return import_tenant(data_dir, tenant_id, stream, merge=True, progress=progress, drop=drop)


def _dim_of(conv: Conversion) -> int | None:
    """The length of the conversion's embeddings, if it kept any."""
    return next((len(r.embedding) for r in conv.records if r.embedding is not None), None)

"""A conversion as the bodies of POST /v1/memory/events, for a client that imports through a
server's API instead of the data directory (docs/migrate.md, "From Python")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from storage.transfer.foreign.records import Conversion, Record, event_id

MAX_BATCH = 1000  # events in one POST /v1/memory/events (memspine/batch.py)


def batches(
    conv: Conversion, tenant_id: str, size: int = MAX_BATCH
) -> Iterator[list[dict[str, Any]]]:
    """The records in order, `size` at a time, each under its key as its idempotency_key: the
    ids the server gives are those an import-from into the same tenant gives, and a batch sent
    again stores nothing new."""
    batch: list[dict[str, Any]] = []
    for rec in conv.records:
        batch.append(body(rec, tenant_id, conv.report.embedding_model))
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def body(rec: Record, tenant_id: str, model: str | None) -> dict[str, Any]:
    """One record as an event of a batch."""
    properties = dict(rec.properties)
    if rec.sources:
        properties["source_event_ids"] = [event_id(tenant_id, k) for k in rec.sources]
    out: dict[str, Any] = {"kind": rec.kind, "ts": rec.ts, "idempotency_key": rec.key}
    optional = {
        "text": rec.text,
        "properties": properties or None,
        "supersedes": [event_id(tenant_id, k) for k in rec.supersedes] or None,
        "valid_from": rec.valid_from,
        "valid_until": rec.valid_until,
        "embedding": rec.embedding,
        "embedding_model": model if rec.embedding is not None else None,
        "subjects": rec.subjects or None,
    }
    return out | {k: v for k, v in optional.items() if v is not None}

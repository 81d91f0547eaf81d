"""Import: the lines of an export, checked as they are read, written into an open tenant in
batches through its writer; memory stays bounded by one batch whatever the file's size."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import IO, Protocol

import msgspec

from storage.errors import InvalidRequest
from storage.log import layout
from storage.model import PlacedEvent, StoredEvent
from storage.transfer.format import (
    MAX_LINE_BYTES,
    End,
    ErasedLine,
    Header,
    IdempotencyLine,
    Reader,
)

BATCH_EVENTS = 500  # one LMDB transaction each; a batch's records are what memory holds
BATCH_BYTES = 8 << 20

Progress = Callable[[int], None]  # told how many events were written so far
Drop = Callable[[StoredEvent], bool]  # an event not to write (past its retention window)


class Importable(Protocol):
    """What an import needs of a tenant (storage/tenants/tenant.py's Tenant)."""

    dim: int

    def submit_import(
        self,
        placed: list[PlacedEvent],
        idempotency: Sequence[tuple[str, bytes, list[str]]] = (),
        *,
        model: str | None = None,
        space: int | None = None,
        keep_before: int | None = None,
    ) -> Future[int]:
        """Write exported events as they were, in one transaction on the tenant's writer."""
        ...


class ImportStats(msgspec.Struct, frozen=True, kw_only=True):
    """What an import did."""

    tenant_id: str  # the tenant the file was exported from
    events: int  # events written
    skipped: int = 0  # events a merge found live already and kept
    idempotency: int = 0  # Idempotency-Key records of deleted events
    lines: int = 0
    retention_dropped: int = 0  # events past their retention window, not written
    erased_dropped: int = 0  # events an erasure ledger names, not written (docs/erasure.md)
    ledger: dict[str, int] = {}  # the file's erasure ledger (a move's), for the new log to keep


def lines_of(stream: IO[bytes]) -> Iterator[bytes]:
    """The stream's lines, each with its newline (the last may lack it), none past the bound."""
    while True:
        line = stream.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        yield line


def read_header(lines: Iterator[bytes], reader: Reader) -> Header:
    """The first line, which must be the header."""
    first = next(lines, None)
    if first is None:
        raise InvalidRequest("the file is empty: an export starts with its header line")
    header = reader.feed(first)
    if not isinstance(header, Header):
        raise InvalidRequest("line 1: the file does not start with a header line")
    return header


def load(
    tenant: Importable,
    lines: Iterator[bytes],
    reader: Reader,
    *,
    keep_before: int | None = None,
    progress: Progress | None = None,
    drop: Drop | None = None,
    erased: Mapping[str, int] | None = None,
    check: Callable[[], None] | None = None,
) -> ImportStats:
    """Write the rest of an export (its header already read by `reader`) into the tenant.

    Every line is checked before its batch is written, and the trailer's counts and checksum
    once the input ends; a refusal is InvalidRequest naming the line. Batches written before a
    refusal stay in the tenant: import into a staging copy (storage/transfer/landing.py) so
    that a refused or interrupted import leaves nothing behind. An event `drop` refuses is
    not written, and the events after it link to it no longer (counted as retention_dropped);
    so is an event the erasure ledger `erased` names (erased_dropped; its Idempotency-Key
    record is kept, so that a retry of its append replays rather than stores it again).
    """
    header = reader.header
    assert header is not None
    if header.embedding_dim != tenant.dim:
        raise InvalidRequest(
            f"the file's embeddings have {header.embedding_dim} values, this tenant's {tenant.dim}"
        )
    batch: list[PlacedEvent] = []
    idem: list[tuple[str, bytes, list[str]]] = []
    size = written = seen = 0
    dropped: set[str] = set()  # ids only: what later events' links must forget
    erased_n = 0
    ledger: dict[str, int] = {}
    model = header.embedding_model
    space = {"server": layout.SPACE_SERVER, "client": layout.SPACE_CLIENT}.get(
        header.vectors_by or ""
    )
    # One batch is written on the tenant's writer while the next is read and checked here;
    # memory holds those two.
    pending: Future[int] | None = None

    def settle() -> None:
        nonlocal pending, written
        if pending is not None:
            done, pending = pending, None
            written += done.result()
            if progress is not None:
                progress(written)
            if check is not None:  # a quota: it may refuse the rest
                check()

    def flush() -> None:
        nonlocal batch, idem, size, model, space, pending
        if batch or idem or model is not None or space is not None:
            settle()
            pending = tenant.submit_import(
                batch, idem, model=model, space=space, keep_before=keep_before
            )
        batch, idem, size, model, space = [], [], 0, None, None

    try:
        for raw in lines:
            item = reader.feed(raw)
            if isinstance(item, End):
                continue  # reader.finish() below checks there is nothing after it
            if isinstance(item, ErasedLine):
                ledger[item.event_id] = item.erased_at
                continue
            if isinstance(item, IdempotencyLine):
                idem.append((item.event_id, bytes.fromhex(item.body_hash), item.unlinked))
            else:
                assert isinstance(item, PlacedEvent)
                if erased and item.event.event_id in erased:
                    dropped.add(item.event.event_id)
                    erased_n += 1
                    if item.body_hash is not None:
                        idem.append((item.event.event_id, item.body_hash, item.unlinked))
                    continue
                if drop is not None and drop(item.event):
                    dropped.add(item.event.event_id)
                    continue
                batch.append(_unlinked(item, dropped) if dropped else item)
                seen += 1
            size += len(raw)
            if len(batch) + len(idem) >= BATCH_EVENTS or size >= BATCH_BYTES:
                flush()
        end = reader.finish()
        flush()
        settle()
    finally:
        if pending is not None:  # refused meanwhile: the batch in flight ends before the caller
            pending.exception()
    return ImportStats(
        tenant_id=header.tenant_id,
        events=written,
        skipped=seen - written,
        idempotency=end.idempotency,
        lines=reader.line,
        retention_dropped=len(dropped) - erased_n,
        erased_dropped=erased_n,
        ledger=ledger,
    )


def _unlinked(item: PlacedEvent, dropped: set[str]) -> PlacedEvent:
    """The event without its links to dropped events (as a delete would have left it)."""
    if dropped.isdisjoint(item.sources) and dropped.isdisjoint(item.superseded):
        return item
    return msgspec.structs.replace(
        item,
        sources=[s for s in item.sources if s not in dropped],
        superseded=[s for s in item.superseded if s not in dropped],
        event=msgspec.structs.replace(
            item.event, supersedes=[s for s in item.event.supersedes if s not in dropped]
        ),
    )

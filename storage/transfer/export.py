"""Export: one snapshot of a tenant's log as the lines of storage/transfer/format.py, from the
open tenant (the server) or from its directory (another process, while the server runs)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO

import lmdb

from storage import files
from storage.erasure import swap
from storage.errors import NotFound
from storage.log import layout
from storage.log.eventlog import snapshot
from storage.log.reader import LogReader
from storage.model import SOURCE_FROM, SUPERSEDES, check_subject
from storage.read.subjects import Reach, reach
from storage.tenants.tenant import Tenant
from storage.transfer.format import (
    FORMAT,
    FORMAT_VERSION,
    Header,
    Links,
    end_line,
    erased_line,
    event_line,
    header_line,
    idempotency_line,
)

# A delete's effect is the event's absence; a server vector's is in the record it was written to.
_CARRIED = (layout.OP_APPEND, layout.OP_DELETE, layout.OP_EMBED)
SNAPSHOT_TRIES = 20  # a purge's swap renames the log away for an instant: look again
NO_TENANT = "no tenant with that id in this data directory"


def vectors_by(r: LogReader) -> str | None:
    """The header's vectors_by for the snapshot r: who makes the tenant's vectors, if anyone."""
    return {layout.SPACE_SERVER: "server", layout.SPACE_CLIENT: "client"}.get(r.space() or 0)


def export_lines(
    r: LogReader,
    tenant_id: str,
    *,
    default_dim: int = 384,
    only: set[str] | None = None,
    extra: Iterable[bytes] = (),
    ledger: bool = False,
    exported: list[str] | None = None,
) -> Iterator[bytes]:
    """Every line of the tenant's export, from the one snapshot r, in constant memory; with
    `only`, the lines of those events alone (an access export: no idempotency lines), and
    `extra` lines (each ending in a newline) before the end line, hashed with the rest; with
    `ledger`, the erasure ledger's `erased` lines (a tenant move carries them; an export for
    people holds no id of a purged event); the ids of the events written go to `exported` if
    given (the read audit's record)."""
    digest = hashlib.sha256()
    header = Header(
        format=FORMAT,
        version=FORMAT_VERSION,
        tenant_id=tenant_id,
        embedding_dim=r.meta_int(layout.DIM) or default_dim,
        embedding_model=r.meta_str(layout.MODEL),
        vectors_by=vectors_by(r),
        exported_at=time.time_ns() // 1000,
        events=r.count() if only is None else sum(1 for e in only if r.exists(e)),
    )
    line = header_line(header)
    digest.update(line)
    yield line
    events = 0
    for _seq, op, event_id in r.ops_after(0):  # append order; a delete removed its append op
        if op != layout.OP_APPEND:
            if op not in _CARRIED:
                # An op this format has no line for: exporting without it would lose what it
                # wrote. A new kind of op comes with its line (a format version more).
                raise RuntimeError(f"the export format does not carry log op {op!r} yet")
            continue
        if only is not None and event_id not in only:
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
        if exported is not None:
            exported.append(ev.event_id)
        yield line
    for line in extra:
        digest.update(line)
        yield line
    kept = 0
    for event_id, rec in () if only is not None else r.idempotency_records():
        if r.exists(event_id):
            continue  # carried on its event's line
        line = idempotency_line(event_id, rec.body_hash, rec.unlinked)
        digest.update(line)
        kept += 1
        yield line
    erased = 0
    for event_id, at in r.erased() if ledger and only is None else ():
        line = erased_line(event_id, at)
        digest.update(line)
        erased += 1
        yield line
    yield end_line(events, kept, digest.hexdigest(), erased)


def subject_lines(
    r: LogReader,
    tenant_id: str,
    subject: str,
    *,
    default_dim: int = 384,
    reads: Callable[[set[str]], Iterable[bytes]] = lambda ids: (),
    exported: list[str] | None = None,
) -> Iterator[bytes]:
    """An access export (docs/erasure.md): the lines of the subject's events and of those
    derived from them, then `reads` of those ids (the recorded reads, as lines); InvalidRequest
    for a subject that cannot be one. The ids of the events written go to `exported` if given
    (the read audit's record of the export)."""
    ids = {f.event_id for f in reach(r, Reach(subject=check_subject(subject)))}
    return export_lines(
        r, tenant_id, default_dim=default_dim, only=ids, extra=reads(ids), exported=exported
    )


@contextmanager
def tenant_export(
    tenant: Tenant, tenant_id: str | None = None, exported: list[str] | None = None
) -> Iterator[Iterator[bytes]]:
    """The export of an open tenant, line by line, from one snapshot held until the block
    ends (tenant_id: the id the header names, when the tenant object answers for another, as
    the manager's empty stand-in does)."""
    with tenant.snapshot() as r:
        yield export_lines(
            r, tenant_id or tenant.tenant_id, default_dim=tenant.dim, exported=exported
        )


def write_export(
    tenant: Tenant,
    out: IO[bytes],
    tenant_id: str | None = None,
    exported: list[str] | None = None,
) -> int:
    """Write an open tenant's whole export to out; the bytes written (the events' ids to
    `exported` if given)."""
    size = 0
    with tenant_export(tenant, tenant_id, exported) as lines:
        for line in lines:
            out.write(line)
            size += len(line)
    return size


def log_path(root: Path) -> Path:
    """Where a tenant directory's current log is: the committed generation of a purge whose
    swap is under way (storage/erasure/swap.py) wins over the one it replaces."""
    ready = root / swap.READY / files.LOG
    return ready if ready.is_dir() else root / files.LOG


@contextmanager
def log_snapshot(root: Path) -> Iterator[LogReader]:
    """One read transaction of the log in the tenant directory root, from a process that does
    not serve it (NotFound if there is none). Nothing here waits for or stalls the server: LMDB
    readers of another process take a slot in the lock file, not a lock. A purge that swaps
    the files meanwhile leaves this snapshot reading the old generation, still whole."""
    for _ in range(SNAPSHOT_TRIES):
        if not root.is_dir():
            break
        stack = ExitStack()
        try:
            r = stack.enter_context(snapshot(log_path(root)))
        except lmdb.Error:  # no log, or renamed between the look and the open
            time.sleep(0.01)
            continue
        with stack:
            yield r
        return
    raise NotFound(NO_TENANT)


@contextmanager
def dir_export(
    root: Path, tenant_id: str, *, default_dim: int = 384, exported: list[str] | None = None
) -> Iterator[Iterator[bytes]]:
    """The export of the tenant stored at root, from another process than the one serving it
    (memspine-admin export while the server runs); the events' ids to `exported` if given."""
    with log_snapshot(root) as r:
        yield export_lines(r, tenant_id, default_dim=default_dim, exported=exported)

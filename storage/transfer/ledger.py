"""The erasure ledger across copies (docs/erasure.md, "The erasure ledger"): every tenant's log
keeps the ids of the events deleted from it and when (storage/log/layout.py, "erased"); a
restore or an import reads the ledgers that apply and drops those events before any client can
read the tenant, and the new log carries the ledger on."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from storage import files
from storage.errors import NotFound
from storage.log.eventlog import EventLog, snapshot
from storage.log.reader import LogReader
from storage.tenants.tenant import Tenant
from storage.transfer.export import log_snapshot

Ledger = dict[str, int]  # event id -> microseconds since the epoch of its delete
DAY_US = 86_400 * 1_000_000
DEFAULT_DAYS = 30.0
BACKUP_MANIFEST = "BACKUP.json"  # storage/transfer/backup.py's MANIFEST and TENANTS
BACKUP_TENANTS = "tenants"


def of_log(r: LogReader) -> Ledger:
    """The ledger one log holds."""
    return dict(r.erased())


def of_tenant(root: Path) -> Ledger:
    """The ledger of the tenant directory root (empty if it has no log)."""
    try:
        with log_snapshot(root) as r:
            return of_log(r)
    except NotFound:
        return {}


def of_path(path: Path) -> dict[str, Ledger]:
    """Every tenant's ledger at path: a backup (its logs) or a data directory."""
    found: dict[str, Ledger] = {}
    if (path / BACKUP_MANIFEST).is_file():
        for log in sorted((path / BACKUP_TENANTS).glob(f"*/{files.LOG}")):
            with snapshot(log, lock=False) as r:
                found[log.parent.name] = of_log(r)
        return found
    if not path.is_dir():
        return found
    for entry in sorted(path.iterdir()):
        if entry.name[0] not in "._" and (entry / files.LOG).is_dir():
            found[entry.name] = of_tenant(entry)
    return found


def merged(ledgers: Iterable[Mapping[str, Ledger]]) -> dict[str, Ledger]:
    """The union of several sets of tenants' ledgers (an id keeps its latest time)."""
    out: dict[str, Ledger] = {}
    for one in ledgers:
        for tenant_id, ledger in one.items():
            mine = out.setdefault(tenant_id, {})
            for event_id, at in ledger.items():
                mine[event_id] = max(at, mine.get(event_id, 0))
    return out


def every_id(ledgers: Mapping[str, Ledger]) -> Ledger:
    """One ledger of every tenant's ids (ids are unique across tenants)."""
    return merged([{"": ledger} for ledger in ledgers.values()]).get("", {})


def within(ledger: Mapping[str, int], days: float, now: int | None = None) -> Ledger:
    """The entries younger than `days`: after the window an entry goes (docs/erasure.md)."""
    since = (time.time_ns() // 1000 if now is None else now) - int(days * DAY_US)
    return {e: at for e, at in ledger.items() if at >= since}


def carry(root: Path, ledger: Mapping[str, int]) -> None:
    """Write ledger entries into the closed tenant log at root (a restored or imported tenant
    keeps the ledger of what it was made from)."""
    if not ledger:
        return
    log = EventLog.open(root / files.LOG)
    try:
        log.write(lambda txn: log.record_erased(txn, ledger))
    finally:
        log.close()


def apply(root: Path, tenant_id: str, ledger: Mapping[str, int]) -> int:
    """Erase from the closed tenant at root every live event the ledger names, and purge once
    (an adopted directory, a tenant copied in from elsewhere); how many were erased."""
    with log_snapshot(root) as r:
        live = [e for e in ledger if r.exists(e)]
    if not live:
        return 0
    tenant = Tenant.open(tenant_id, root)
    try:
        deleted: list[str] = tenant.submit_delete(live).result()
        tenant.purge()
    finally:
        tenant.close()
    return len(deleted)

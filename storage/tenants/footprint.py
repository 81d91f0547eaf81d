"""What an open tenant holds in memory, estimated from its indexes' counters, and giving memory
back to the system once tenants close."""

from __future__ import annotations

from pathlib import Path

from storage import files
from storage.heap import trim
from storage.index.keyword import READER_BYTES
from storage.index.vectors import file_memory_bytes
from storage.tenants.tenant import Tenant

# What an open tenant holds beyond its two indexes: its LMDB environment's buffers, its writer
# thread, its Python objects (an empty tenant added 108 KB of anonymous RSS with its searcher and
# its empty vector rows, opened and closed in turn with the heap as memspine/app.py sets it;
# bench/RESULTS.md, "Cold tenants").
TENANT_BASE_BYTES = 80_000
# What a tenant's first append adds beyond its rows: LMDB's write-transaction buffers and the
# reader of a second Tantivy segment (100 tenants of 200 events held 598 KB each after one
# append, 420 KB before; bench/RESULTS.md, "Cold tenants").
WRITTEN_BYTES = 80_000
PARTS = ("graph", "exact", "keyword", "other")


def tenant_memory(tenant: Tenant) -> dict[str, int]:
    """An open tenant's estimated resident bytes by part (PARTS), from counters: no walk.

    The LMDB map is left out: it is a read-only mapping of the file, so its resident pages are
    page cache the kernel reclaims under pressure, and closing the tenant would not free them.
    """
    graph, exact = tenant.vectors.memory_bytes()
    keyword = tenant.keyword.memory_bytes()
    return {"graph": graph, "exact": exact, "keyword": keyword, "other": _other(tenant)}


def tenant_bytes(tenant: Tenant) -> int:
    """An open tenant's estimated resident bytes in all (a few microseconds)."""
    graph, exact = tenant.vectors.memory_bytes()
    return graph + exact + tenant.keyword.memory_bytes() + _other(tenant)


def _other(tenant: Tenant) -> int:
    """What the tenant holds beyond its indexes: more once it has appended since it opened."""
    return TENANT_BASE_BYTES + (WRITTEN_BYTES if tenant.appended_at else 0)


def closed_tenant_bytes(root: Path, dim: int) -> int:
    """What the tenant stored at root will hold once open, guessed from its vector file's header
    (one small read) before opening it."""
    return TENANT_BASE_BYTES + READER_BYTES + file_memory_bytes(root / files.VECTORS, dim)


def give_back_memory() -> None:
    """Return freed heap pages to the system after tenants close (glibc only; the call releases
    the GIL).

    glibc keeps freed heap pages for reuse; without this the process's RSS would stay at its
    high-water mark, and the budget would bound the accounted figure but not the process.
    """
    trim()

"""memspine's storage: a tenant's log, indexes, reads and erasure, with no HTTP in it.

This package is storage's front door: the names below are the embedded API the server
(memspine/) may use; besides them it imports only storage.errors. Each name is loaded from its
home on first use, so importing storage.errors alone loads no index library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from storage.cypher import (
        MAX_QUERY_CHARS as MAX_QUERY_CHARS,
    )
    from storage.cypher import (
        CypherResult as CypherResult,
    )
    from storage.cypher import (
        Limits as Limits,
    )
    from storage.cypher import (
        warm as warm,
    )
    from storage.embedders import make_embedder as make_embedder
    from storage.erasure.purge import PurgeStats as PurgeStats
    from storage.erasure.purge import for_want_of_room as for_want_of_room
    from storage.erasure.swap import (
        PENDING as PENDING,
    )
    from storage.erasure.swap import (
        pending_tenants as pending_tenants,
    )
    from storage.heap import (
        available as available,
    )
    from storage.heap import (
        free_bytes as free_bytes,
    )
    from storage.heap import (
        limit_arenas as limit_arenas,
    )
    from storage.heap import (
        trim as trim,
    )
    from storage.log.layout import (
        MAX_FILTER_NAME_BYTES as MAX_FILTER_NAME_BYTES,
    )
    from storage.log.layout import (
        MAX_FILTER_STRING_BYTES as MAX_FILTER_STRING_BYTES,
    )
    from storage.log.layout import (
        PROPERTY_NAME as PROPERTY_NAME,
    )
    from storage.log.layout import (
        is_filterable_value as is_filterable_value,
    )
    from storage.model import (
        UNLIMITED as UNLIMITED,
    )
    from storage.model import (
        AppendResult as AppendResult,
    )
    from storage.model import (
        FilterValue as FilterValue,
    )
    from storage.model import (
        ItemRefused as ItemRefused,
    )
    from storage.model import (
        NewEvent as NewEvent,
    )
    from storage.model import (
        Quota as Quota,
    )
    from storage.model import (
        QuotaSource as QuotaSource,
    )
    from storage.model import (
        StoredEvent as StoredEvent,
    )
    from storage.read.current import EventState as EventState
    from storage.read.listing import MAX_LIMIT as MAX_LIMIT
    from storage.read.listing import ListQuery as ListQuery
    from storage.read.recall import (
        RecallQuery as RecallQuery,
    )
    from storage.read.recall import (
        RecallResult as RecallResult,
    )
    from storage.read.recall import (
        Walk as Walk,
    )
    from storage.read.recall import (
        Withheld as Withheld,
    )
    from storage.read.retention import Due as Due
    from storage.read.retention import Hold as Hold
    from storage.read.retention import Outlook as Outlook
    from storage.read.retention import Policy as Policy
    from storage.read.retention import due as due
    from storage.read.retention import outlook as outlook
    from storage.read.retention import outlook_of_files as outlook_of_files
    from storage.read.retention import refuse_held as refuse_held
    from storage.space import disk_full as disk_full
    from storage.space import names_full_disk as names_full_disk
    from storage.tenants.embedding import EmbeddingWorker as EmbeddingWorker
    from storage.tenants.footprint import (
        PARTS as PARTS,
    )
    from storage.tenants.footprint import (
        closed_tenant_bytes as closed_tenant_bytes,
    )
    from storage.tenants.footprint import (
        tenant_memory as tenant_memory,
    )
    from storage.tenants.manager import REASONS as REASONS
    from storage.tenants.manager import TenantManager as TenantManager
    from storage.tenants.runs import JOURNAL as JOURNAL
    from storage.tenants.runs import RUNS as RUNS
    from storage.tenants.runs import Journal as Journal
    from storage.tenants.runs import RetentionView as RetentionView
    from storage.tenants.runs import RunReceipt as RunReceipt
    from storage.tenants.runs import last_receipt as last_receipt
    from storage.tenants.runs import view_of as view_of
    from storage.tenants.serving import ServerVectors as ServerVectors
    from storage.tenants.tenant import Tenant as Tenant
    from storage.tenants.usage import TenantUsage as TenantUsage
    from storage.tenants.usage import closed_usage as closed_usage
    from storage.transfer.backup import tenant_dirs as tenant_dirs
    from storage.transfer.export import export_lines as export_lines
    from storage.transfer.export import write_export as write_export
    from storage.transfer.format import MEDIA_TYPE as MEDIA_TYPE
    from storage.transfer.landing import import_tenant as import_tenant
    from storage.transfer.landing import sweep_stale as sweep_stale
    from storage.transfer.tail import (
        apply_changes as apply_changes,
    )
    from storage.transfer.tail import (
        changes as changes,
    )
    from storage.transfer.tail import (
        changes_lines as changes_lines,
    )
    from storage.transfer.tail import (
        write_since as write_since,
    )

# Each name of the API and the module it lives in (the imports above, for the type checker;
# tests/storage/test_storage_layers.py holds the two lists equal).
HOMES: dict[str, str] = {
    "AppendResult": "storage.model",
    "apply_changes": "storage.transfer.tail",
    "available": "storage.heap",
    "changes": "storage.transfer.tail",
    "changes_lines": "storage.transfer.tail",
    "closed_tenant_bytes": "storage.tenants.footprint",
    "closed_usage": "storage.tenants.usage",
    "CypherResult": "storage.cypher",
    "disk_full": "storage.space",
    "Due": "storage.read.retention",
    "due": "storage.read.retention",
    "EmbeddingWorker": "storage.tenants.embedding",
    "EventState": "storage.read.current",
    "export_lines": "storage.transfer.export",
    "FilterValue": "storage.model",
    "for_want_of_room": "storage.erasure.purge",
    "free_bytes": "storage.heap",
    "Hold": "storage.read.retention",
    "import_tenant": "storage.transfer.landing",
    "is_filterable_value": "storage.log.layout",
    "ItemRefused": "storage.model",
    "JOURNAL": "storage.tenants.runs",
    "Journal": "storage.tenants.runs",
    "last_receipt": "storage.tenants.runs",
    "limit_arenas": "storage.heap",
    "Limits": "storage.cypher",
    "ListQuery": "storage.read.listing",
    "make_embedder": "storage.embedders",
    "MAX_FILTER_NAME_BYTES": "storage.log.layout",
    "MAX_FILTER_STRING_BYTES": "storage.log.layout",
    "MAX_LIMIT": "storage.read.listing",
    "MAX_QUERY_CHARS": "storage.cypher",
    "MEDIA_TYPE": "storage.transfer.format",
    "names_full_disk": "storage.space",
    "NewEvent": "storage.model",
    "Outlook": "storage.read.retention",
    "outlook": "storage.read.retention",
    "outlook_of_files": "storage.read.retention",
    "PARTS": "storage.tenants.footprint",
    "PENDING": "storage.erasure.swap",
    "pending_tenants": "storage.erasure.swap",
    "Policy": "storage.read.retention",
    "PROPERTY_NAME": "storage.log.layout",
    "PurgeStats": "storage.erasure.purge",
    "Quota": "storage.model",
    "QuotaSource": "storage.model",
    "REASONS": "storage.tenants.manager",
    "RecallQuery": "storage.read.recall",
    "RecallResult": "storage.read.recall",
    "refuse_held": "storage.read.retention",
    "RetentionView": "storage.tenants.runs",
    "RunReceipt": "storage.tenants.runs",
    "RUNS": "storage.tenants.runs",
    "ServerVectors": "storage.tenants.serving",
    "StoredEvent": "storage.model",
    "sweep_stale": "storage.transfer.landing",
    "Tenant": "storage.tenants.tenant",
    "tenant_dirs": "storage.transfer.backup",
    "tenant_memory": "storage.tenants.footprint",
    "TenantManager": "storage.tenants.manager",
    "TenantUsage": "storage.tenants.usage",
    "trim": "storage.heap",
    "UNLIMITED": "storage.model",
    "view_of": "storage.tenants.runs",
    "Walk": "storage.read.recall",
    "warm": "storage.cypher",
    "Withheld": "storage.read.recall",
    "write_export": "storage.transfer.export",
    "write_since": "storage.transfer.tail",
}
__all__ = sorted(HOMES)


def __getattr__(name: str) -> Any:
    """A name of the API, imported from its home the first time it is asked for."""
    home = HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value

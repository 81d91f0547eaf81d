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
    from storage.datalock import DataDirBusy as DataDirBusy
    from storage.datalock import client_url as client_url
    from storage.datalock import hold as hold_data_dir
    from storage.embedders import describe as describe_embedder
    from storage.embedders import make_embedder as make_embedder
    from storage.embedders.settings import check_kind as check_embedder_kind
    from storage.embedders.settings import check_together as check_embedder_settings
    from storage.embedders.settings import check_url as check_embedder_url
    from storage.erasure.purge import PurgeStats as PurgeStats
    from storage.erasure.purge import check_room as check_room
    from storage.erasure.scan import files_holding as files_holding
    from storage.erasure.scan import log_holding as log_holding
    from storage.erasure.scan import tenant_holding as tenant_holding
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
        pin_mmap_threshold as pin_mmap_threshold,
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
    from storage.log.layout import SUBJECT as SUBJECT_PROPERTY
    from storage.log.layout import (
        is_filterable_value as is_filterable_value,
    )
    from storage.model import FLOAT32_MAX as FLOAT32_MAX
    from storage.model import KIND_PATTERN as KIND_PATTERN
    from storage.model import MAX_EMBEDDING_DIM as MAX_EMBEDDING_DIM
    from storage.model import MAX_IDS as MAX_IDS
    from storage.model import MAX_KIND_BYTES as MAX_KIND_BYTES
    from storage.model import MAX_MODEL_CHARS as MAX_MODEL_CHARS
    from storage.model import MAX_SUBJECT_BYTES as MAX_SUBJECT_BYTES
    from storage.model import MAX_SUBJECTS as MAX_SUBJECTS
    from storage.model import MAX_TEXT_CHARS as MAX_TEXT_CHARS
    from storage.model import MAX_TS as MAX_TS
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
    from storage.model import check_embedding as check_embedding
    from storage.model import check_kind as check_kind
    from storage.model import check_model as check_model
    from storage.model import check_subject as check_subject
    from storage.model import check_subjects as check_subjects
    from storage.model import check_text as check_text
    from storage.model import current_quota as current_quota
    from storage.model import new_event as new_event
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
    from storage.read.retention import unheld as unheld
    from storage.read.subjects import DERIVED as DERIVED
    from storage.read.subjects import IDENTIFIER as IDENTIFIER
    from storage.read.subjects import MAX_CONFIRM_IDS as MAX_CONFIRM_IDS
    from storage.read.subjects import MAX_IDENTIFIER_CHARS as MAX_IDENTIFIER_CHARS
    from storage.read.subjects import MAX_IDENTIFIERS as MAX_IDENTIFIERS
    from storage.read.subjects import MIN_IDENTIFIER_CHARS as MIN_IDENTIFIER_CHARS
    from storage.read.subjects import SUBJECT as SUBJECT
    from storage.read.subjects import Reach as Reach
    from storage.read.subjects import Reached as Reached
    from storage.read.subjects import check_identifiers as check_identifiers
    from storage.read.subjects import doomed as doomed
    from storage.read.subjects import reach as reach
    from storage.readlog import IDS_PER_RECORD as IDS_PER_RECORD
    from storage.readlog import MAX_PENDING as MAX_PENDING
    from storage.readlog import MAX_PENDING_PER_TENANT as MAX_PENDING_PER_TENANT
    from storage.readlog import MAX_PURPOSE_BYTES as MAX_PURPOSE_BYTES
    from storage.readlog import PURPOSE_HEADER as PURPOSE_HEADER
    from storage.readlog import READS_JOURNAL as READS_JOURNAL
    from storage.readlog import Backlogged as Backlogged
    from storage.readlog import Mark as Mark
    from storage.readlog import Read as Read
    from storage.readlog import ReadLogCorrupt as ReadLogCorrupt
    from storage.readlog import ReadLogWriter as ReadLogWriter
    from storage.readlog import await_carried as await_carried
    from storage.readlog import carried_in as carried_in
    from storage.readlog import check_purpose_text as check_purpose_text
    from storage.readlog import first_ts as first_ts
    from storage.readlog import read_bytes as read_bytes
    from storage.readlog import reads_of_events as reads_of_events
    from storage.readlog import reads_path as reads_path
    from storage.readlog import records as records
    from storage.readlog import records_of as records_of
    from storage.readlog import whole_bytes as whole_bytes
    from storage.receipts import RunReceipt as RunReceipt
    from storage.receipts import record_copy as record_copy
    from storage.space import disk_full as disk_full
    from storage.space import full_disk_as as full_disk_as
    from storage.space import names_full_disk as names_full_disk
    from storage.tenants.directory import erase_tenant_dir as erase_tenant_dir
    from storage.tenants.directory import is_tenant_id as is_tenant_id
    from storage.tenants.directory import tenant_dirs as tenant_dirs
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
    from storage.tenants.manager import tenants_within as tenants_within
    from storage.tenants.pool import default_threads as default_writer_threads
    from storage.tenants.runs import JOURNAL as JOURNAL
    from storage.tenants.runs import RUNS as RUNS
    from storage.tenants.runs import Journal as Journal
    from storage.tenants.runs import RetentionView as RetentionView
    from storage.tenants.runs import last_receipt as last_receipt
    from storage.tenants.runs import view_of as view_of
    from storage.tenants.serving import ServerVectors as ServerVectors
    from storage.tenants.tenant import Tenant as Tenant
    from storage.tenants.usage import TenantUsage as TenantUsage
    from storage.tenants.usage import closed_usage as closed_usage
    from storage.tenants.usage import quota_figures as quota_figures
    from storage.transfer.export import export_lines as export_lines
    from storage.transfer.export import subject_lines as subject_lines
    from storage.transfer.export import write_export as write_export
    from storage.transfer.format import MEDIA_TYPE as MEDIA_TYPE
    from storage.transfer.landing import import_tenant as import_tenant
    from storage.transfer.landing import sweep_stale as sweep_stale
    from storage.transfer.receipt_files import of_tenant as receipts_of_tenant
    from storage.transfer.receipt_files import take as take_receipts
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

# Each name of the API and the module it lives in, "module:name" where the name there is another
# (the imports above, for the type checker; tests/storage/test_storage_layers.py holds the two
# lists equal).
HOMES: dict[str, str] = {
    "AppendResult": "storage.model",
    "apply_changes": "storage.transfer.tail",
    "available": "storage.heap",
    "Backlogged": "storage.readlog",
    "changes": "storage.transfer.tail",
    "changes_lines": "storage.transfer.tail",
    "check_embedder_kind": "storage.embedders.settings:check_kind",
    "check_embedder_settings": "storage.embedders.settings:check_together",
    "check_embedder_url": "storage.embedders.settings:check_url",
    "check_embedding": "storage.model",
    "check_identifiers": "storage.read.subjects",
    "check_kind": "storage.model",
    "check_model": "storage.model",
    "check_room": "storage.erasure.purge",
    "check_subject": "storage.model",
    "check_subjects": "storage.model",
    "check_text": "storage.model",
    "client_url": "storage.datalock",
    "closed_tenant_bytes": "storage.tenants.footprint",
    "closed_usage": "storage.tenants.usage",
    "current_quota": "storage.model",
    "CypherResult": "storage.cypher",
    "DataDirBusy": "storage.datalock",
    "DERIVED": "storage.read.subjects",
    "describe_embedder": "storage.embedders:describe",
    "disk_full": "storage.space",
    "doomed": "storage.read.subjects",
    "Due": "storage.read.retention",
    "due": "storage.read.retention",
    "EmbeddingWorker": "storage.tenants.embedding",
    "EventState": "storage.read.current",
    "export_lines": "storage.transfer.export",
    "files_holding": "storage.erasure.scan",
    "FilterValue": "storage.model",
    "first_ts": "storage.readlog",
    "FLOAT32_MAX": "storage.model",
    "full_disk_as": "storage.space",
    "free_bytes": "storage.heap",
    "Hold": "storage.read.retention",
    "hold_data_dir": "storage.datalock:hold",
    "default_writer_threads": "storage.tenants.pool:default_threads",
    "tenants_within": "storage.tenants.manager",
    "IDENTIFIER": "storage.read.subjects",
    "import_tenant": "storage.transfer.landing",
    "is_filterable_value": "storage.log.layout",
    "ItemRefused": "storage.model",
    "JOURNAL": "storage.tenants.runs",
    "Journal": "storage.tenants.runs",
    "KIND_PATTERN": "storage.model",
    "last_receipt": "storage.tenants.runs",
    "limit_arenas": "storage.heap",
    "Limits": "storage.cypher",
    "ListQuery": "storage.read.listing",
    "log_holding": "storage.erasure.scan",
    "tenant_holding": "storage.erasure.scan",
    "make_embedder": "storage.embedders",
    "Mark": "storage.readlog",
    "MAX_CONFIRM_IDS": "storage.read.subjects",
    "MAX_EMBEDDING_DIM": "storage.model",
    "MAX_FILTER_NAME_BYTES": "storage.log.layout",
    "MAX_FILTER_STRING_BYTES": "storage.log.layout",
    "MAX_IDENTIFIER_CHARS": "storage.read.subjects",
    "MAX_IDENTIFIERS": "storage.read.subjects",
    "MAX_IDS": "storage.model",
    "MAX_KIND_BYTES": "storage.model",
    "MAX_LIMIT": "storage.read.listing",
    "MAX_MODEL_CHARS": "storage.model",
    "MAX_PENDING": "storage.readlog",
    "MAX_PENDING_PER_TENANT": "storage.readlog",
    "MAX_QUERY_CHARS": "storage.cypher",
    "MAX_SUBJECT_BYTES": "storage.model",
    "MAX_SUBJECTS": "storage.model",
    "MAX_TEXT_CHARS": "storage.model",
    "MAX_TS": "storage.model",
    "MEDIA_TYPE": "storage.transfer.format",
    "MIN_IDENTIFIER_CHARS": "storage.read.subjects",
    "names_full_disk": "storage.space",
    "new_event": "storage.model",
    "NewEvent": "storage.model",
    "Outlook": "storage.read.retention",
    "outlook": "storage.read.retention",
    "outlook_of_files": "storage.read.retention",
    "PARTS": "storage.tenants.footprint",
    "PENDING": "storage.erasure.swap",
    "pending_tenants": "storage.erasure.swap",
    "pin_mmap_threshold": "storage.heap",
    "Policy": "storage.read.retention",
    "PROPERTY_NAME": "storage.log.layout",
    "PurgeStats": "storage.erasure.purge",
    "Quota": "storage.model",
    "quota_figures": "storage.tenants.usage",
    "QuotaSource": "storage.model",
    "Reach": "storage.read.subjects",
    "reach": "storage.read.subjects",
    "Reached": "storage.read.subjects",
    "Read": "storage.readlog",
    "read_bytes": "storage.readlog",
    "ReadLogWriter": "storage.readlog",
    "reads_of_events": "storage.readlog",
    "REASONS": "storage.tenants.manager",
    "RecallQuery": "storage.read.recall",
    "RecallResult": "storage.read.recall",
    "record_copy": "storage.receipts",
    "records": "storage.readlog",
    "IDS_PER_RECORD": "storage.readlog",
    "MAX_PURPOSE_BYTES": "storage.readlog",
    "PURPOSE_HEADER": "storage.readlog",
    "READS_JOURNAL": "storage.readlog",
    "ReadLogCorrupt": "storage.readlog",
    "check_purpose_text": "storage.readlog",
    "await_carried": "storage.readlog",
    "carried_in": "storage.readlog",
    "reads_path": "storage.readlog",
    "records_of": "storage.readlog",
    "whole_bytes": "storage.readlog",
    "refuse_held": "storage.read.retention",
    "unheld": "storage.read.retention",
    "receipts_of_tenant": "storage.transfer.receipt_files:of_tenant",
    "take_receipts": "storage.transfer.receipt_files:take",
    "RetentionView": "storage.tenants.runs",
    "RunReceipt": "storage.receipts",
    "RUNS": "storage.tenants.runs",
    "ServerVectors": "storage.tenants.serving",
    "StoredEvent": "storage.model",
    "SUBJECT": "storage.read.subjects",
    "subject_lines": "storage.transfer.export",
    "SUBJECT_PROPERTY": "storage.log.layout:SUBJECT",
    "sweep_stale": "storage.transfer.landing",
    "Tenant": "storage.tenants.tenant",
    "tenant_dirs": "storage.tenants.directory",
    "erase_tenant_dir": "storage.tenants.directory",
    "is_tenant_id": "storage.tenants.directory",
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
__all__ = [
    "DERIVED",
    "FLOAT32_MAX",
    "IDENTIFIER",
    "IDS_PER_RECORD",
    "JOURNAL",
    "KIND_PATTERN",
    "MAX_CONFIRM_IDS",
    "MAX_EMBEDDING_DIM",
    "MAX_FILTER_NAME_BYTES",
    "MAX_FILTER_STRING_BYTES",
    "MAX_IDENTIFIERS",
    "MAX_IDENTIFIER_CHARS",
    "MAX_IDS",
    "MAX_KIND_BYTES",
    "MAX_LIMIT",
    "MAX_MODEL_CHARS",
    "MAX_PENDING",
    "MAX_PENDING_PER_TENANT",
    "MAX_PURPOSE_BYTES",
    "MAX_QUERY_CHARS",
    "MAX_SUBJECTS",
    "MAX_SUBJECT_BYTES",
    "MAX_TEXT_CHARS",
    "MAX_TS",
    "MEDIA_TYPE",
    "MIN_IDENTIFIER_CHARS",
    "PARTS",
    "PENDING",
    "PROPERTY_NAME",
    "PURPOSE_HEADER",
    "READS_JOURNAL",
    "REASONS",
    "RUNS",
    "SUBJECT",
    "SUBJECT_PROPERTY",
    "UNLIMITED",
    "AppendResult",
    "Backlogged",
    "CypherResult",
    "DataDirBusy",
    "Due",
    "EmbeddingWorker",
    "EventState",
    "FilterValue",
    "Hold",
    "ItemRefused",
    "Journal",
    "Limits",
    "ListQuery",
    "Mark",
    "NewEvent",
    "Outlook",
    "Policy",
    "PurgeStats",
    "Quota",
    "QuotaSource",
    "Reach",
    "Reached",
    "Read",
    "ReadLogCorrupt",
    "ReadLogWriter",
    "RecallQuery",
    "RecallResult",
    "RetentionView",
    "RunReceipt",
    "ServerVectors",
    "StoredEvent",
    "Tenant",
    "TenantManager",
    "TenantUsage",
    "Walk",
    "Withheld",
    "apply_changes",
    "available",
    "await_carried",
    "carried_in",
    "changes",
    "changes_lines",
    "check_embedder_kind",
    "check_embedder_settings",
    "check_embedder_url",
    "check_embedding",
    "check_identifiers",
    "check_kind",
    "check_model",
    "check_purpose_text",
    "check_room",
    "check_subject",
    "check_subjects",
    "check_text",
    "client_url",
    "closed_tenant_bytes",
    "closed_usage",
    "current_quota",
    "default_writer_threads",
    "describe_embedder",
    "disk_full",
    "doomed",
    "due",
    "erase_tenant_dir",
    "export_lines",
    "files_holding",
    "first_ts",
    "free_bytes",
    "full_disk_as",
    "hold_data_dir",
    "import_tenant",
    "is_filterable_value",
    "is_tenant_id",
    "last_receipt",
    "limit_arenas",
    "log_holding",
    "make_embedder",
    "names_full_disk",
    "new_event",
    "outlook",
    "outlook_of_files",
    "pending_tenants",
    "pin_mmap_threshold",
    "quota_figures",
    "reach",
    "read_bytes",
    "reads_of_events",
    "reads_path",
    "receipts_of_tenant",
    "record_copy",
    "records",
    "records_of",
    "refuse_held",
    "subject_lines",
    "sweep_stale",
    "take_receipts",
    "tenant_dirs",
    "tenant_holding",
    "tenant_memory",
    "tenants_within",
    "trim",
    "unheld",
    "view_of",
    "warm",
    "whole_bytes",
    "write_export",
    "write_since",
]


def __getattr__(name: str) -> Any:
    """A name of the API, imported from its home the first time it is asked for."""
    home = HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'storage' has no attribute {name!r}")
    module, _, attr = home.partition(":")
    value = getattr(importlib.import_module(module), attr or name)
    globals()[name] = value
    return value

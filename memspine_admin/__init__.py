"""The control plane: tenants, API keys and the admin audit log (see docs/admin.md)."""

from __future__ import annotations

from memspine_admin.control import (
    CONTROL_DIR,
    NO_CONTROL_DB,
    ControlDB,
    control_path,
)
from memspine_admin.keys import parse_token
from memspine_admin.records import (
    SCOPES,
    AuditEntry,
    IssuedKey,
    KeyInfo,
    KeyRecord,
    TenantRecord,
    now_us,
)
from storage.tenants.directory import erase_tenant_dir, is_tenant_id

__all__ = [
    "CONTROL_DIR",
    "NO_CONTROL_DB",
    "SCOPES",
    "AuditEntry",
    "ControlDB",
    "IssuedKey",
    "KeyInfo",
    "KeyRecord",
    "TenantRecord",
    "control_path",
    "erase_tenant_dir",
    "is_tenant_id",
    "now_us",
    "parse_token",
]

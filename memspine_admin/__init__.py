"""The control plane: tenants, API keys and the admin audit log (see docs/admin.md)."""

from __future__ import annotations

from memspine_admin.control import (
    CONTROL_DIR,
    NO_CONTROL_DB,
    ControlDB,
    control_path,
    erase_tenant_dir,
)
from memspine_admin.keys import parse_token
from memspine_admin.records import (
    SCOPES,
    AuditEntry,
    IssuedKey,
    KeyInfo,
    KeyRecord,
    TenantRecord,
    is_tenant_id,
    now_us,
)
from memspine_admin.verifier import UNAUTHORIZED_DETAIL, KeyVerifier, Principal

__all__ = [
    "CONTROL_DIR",
    "NO_CONTROL_DB",
    "SCOPES",
    "UNAUTHORIZED_DETAIL",
    "AuditEntry",
    "ControlDB",
    "IssuedKey",
    "KeyInfo",
    "KeyRecord",
    "KeyVerifier",
    "Principal",
    "TenantRecord",
    "control_path",
    "erase_tenant_dir",
    "is_tenant_id",
    "now_us",
    "parse_token",
]

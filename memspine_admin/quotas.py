"""The quota an import or a restore holds a tenant to: the one the server holds its appends to
(the tenant's own limits in the control plane, else MEMSPINE_DEFAULT_MAX_EVENTS/_BYTES)."""

from __future__ import annotations

import os
from pathlib import Path

from memspine_admin.command import actor, control_url
from memspine_admin.limits import default_limits, effective_limits
from memspine_admin.plane import control_exists, open_control
from memspine_admin.records import TenantRecord
from storage.errors import InvalidRequest
from storage.model import UNLIMITED, Quota


def quota_for(data_dir: Path, tenant_id: str) -> Quota | None:
    """What tenant_id of data_dir may store, read now; None if nothing bounds it."""
    try:
        defaults = default_limits(os.environ)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    url = control_url()
    record: TenantRecord | None = None
    if control_exists(data_dir, url):
        with open_control(data_dir, url, actor=actor()) as db:
            record = db.get_tenant(tenant_id)
    limits = effective_limits(record, defaults)
    bounded = Quota(max_events=limits["max_events"], max_bytes=limits["max_bytes"])
    return None if bounded == UNLIMITED else bounded

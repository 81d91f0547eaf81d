"""The quota an import or a restore holds a tenant to: the one the server holds its appends to
(the tenant's own limits in the control plane, else MEMSPINE_DEFAULT_MAX_EVENTS/_BYTES)."""

from __future__ import annotations

import os
from pathlib import Path

from memspine_admin.plane import control_exists, open_control
from storage.model import UNLIMITED, Quota


def quota_for(data_dir: Path, tenant_id: str) -> Quota | None:
    """What tenant_id of data_dir may store, read now; None if nothing bounds it."""
    from memspine.allowance import Allowance
    from memspine.config import load_settings
    from memspine_admin.command import actor, control_url

    settings = load_settings(os.environ)
    url = control_url()
    if not control_exists(data_dir, url):  # local mode: the server's defaults
        quota = Allowance(settings, lambda: None).quota(tenant_id)
    else:
        with open_control(data_dir, url, actor=actor()) as db:
            quota = Allowance(settings, lambda: db).quota(tenant_id)
    bounded = Quota(max_events=quota.max_events, max_bytes=quota.max_bytes)
    return None if bounded == UNLIMITED else bounded

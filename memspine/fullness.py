"""Appends to a tenant its quota has just refused are refused again before their body is read:
a loop of large batches at a full tenant costs the server no reading, decoding or validating
of bodies that would be refused anyway (docs/operations.md, quotas)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import lmdb

from storage.errors import QuotaExceeded
from storage.model import Quota, QuotaSource, current_quota
from storage.tenants.manager import TenantManager
from storage.tenants.usage import quota_figures

# A refusal is remembered this long; the limits are asked again at each check (a source's are
# cached per control-plane generation: memspine/allowance.py), so a raised limit holds at once.
REMEMBER_SECS = 1.0
MAX_REMEMBERED = 10_000
STORED = ("max_events", "max_bytes")  # limits a body's size can pass (max_memory is not one)


class FullTenants:
    """Tenants whose writer refused an append for max_events or max_bytes a moment ago."""

    def __init__(self, manager: TenantManager) -> None:
        self.manager = manager
        self._lock = threading.Lock()
        self._full: OrderedDict[str, tuple[float, Quota | QuotaSource]] = OrderedDict()
        self.refused_unread = 0  # requests refused before their body was read

    def learn(
        self, tenant_id: str, quota: Quota | QuotaSource | None, error: QuotaExceeded
    ) -> None:
        """The writer refused an append of tenant_id under `quota` (the limits it was held to)."""
        if error.limit not in STORED or quota is None:
            return
        with self._lock:
            self._full[tenant_id] = (time.monotonic(), quota)
            self._full.move_to_end(tenant_id)
            while len(self._full) > MAX_REMEMBERED:
                self._full.popitem(last=False)

    def refusal(self, tenant_id: str) -> QuotaExceeded | None:
        """Why an append to tenant_id would be refused whatever its body, or None: the tenant
        was refused a moment ago, is open, and still holds all its limits let it store."""
        with self._lock:
            known = self._full.get(tenant_id)
            if known is None:
                return None
            if time.monotonic() - known[0] > REMEMBER_SECS:
                del self._full[tenant_id]
                return None
        limits = current_quota(known[1])
        tenant = self.manager.open_tenant(tenant_id)
        if tenant is None or not isinstance(limits, Quota):  # closed, or limits unknown now
            return None
        try:
            with tenant.log.reader() as r:
                events, size = quota_figures(r)
        except lmdb.Error:  # closed meanwhile: its writer decides
            return None
        refused = Quota(max_events=limits.max_events, max_bytes=limits.max_bytes).refusal(
            events + 1, size + 1
        )
        if refused is None:  # a delete made room
            with self._lock:
                self._full.pop(tenant_id, None)
            return None
        with self._lock:
            self.refused_unread += 1
        return refused

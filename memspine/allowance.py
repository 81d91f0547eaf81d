"""What each key and tenant is allowed: a key's requests per minute (a token bucket in this
server), a tenant's live events and bytes (a quota its writer holds every append to), each
the key's or tenant's own limit from the control plane or else the server-wide default.

The pipeline (memspine/pipeline.py, so Litestar's handlers and the hot routes of
memspine/hot.py alike) and /mcp (memspine/mcp/http.py) call `admit` once per request with the
key it carries: a key over its rate is refused with 429 and `Retry-After` before its body is
read, and the request carries its tenant's quota source to the engine. The tenant's writer asks
it when the group commit that holds the write starts (storage/tenants/tenant.py), so a limit
changed before then holds for the write. In a cluster a key's requests all go to its tenant's
node (docs/scaling.md), so that node's bucket is the key's.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from functools import partial

from memspine.config import Settings
from memspine.verifier import Principal
from memspine_admin.limits import effective_limits
from memspine_admin.plane import ControlPlane
from memspine_admin.records import LIMITS, TenantRecord
from storage import UNLIMITED, Quota, QuotaSource
from storage.errors import TooManyRequests

REQUESTS_PER_MINUTE = "requests_per_minute"
REASONS = (REQUESTS_PER_MINUTE, *LIMITS)  # memspine_rejected_total's reasons
# Buckets kept at most; past it the least recently used goes (it is then full again when its key
# comes back, which only ever errs towards letting a request through).
MAX_BUCKETS = 100_000
MAX_TENANTS = 100_000  # quotas kept from the control plane, least recently used dropped first


class Buckets:
    """Token buckets by key: each holds up to `rate` tokens, refilled at rate / 60 a second;
    a request takes one."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: OrderedDict[tuple[str, str], tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: tuple[str, str], rate: int) -> float:
        """Take a token for key: 0.0 if one was there, else the seconds until one will be."""
        now = self._clock()
        with self._lock:
            tokens, stamp = self._buckets.get(key, (float(rate), now))
            tokens = min(float(rate), tokens + (now - stamp) * rate / 60.0)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) * 60.0 / rate
            self._buckets[key] = (tokens, now)
            self._buckets.move_to_end(key)
            if len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        return wait


class Allowance:
    """Each request's limits: the key's rate checked here, the tenant's quota handed on."""

    def __init__(
        self,
        settings: Settings,
        control: Callable[[], ControlPlane | None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`control` gives the control plane (None in local mode: only the defaults apply)."""
        self.default_rate = settings.default_requests_per_minute
        self.default_quota = Quota(
            max_events=settings.default_max_events,
            max_bytes=settings.default_max_bytes,
            max_memory=settings.default_max_memory,
        )
        self._control = control
        self._buckets = Buckets(clock)
        # tenant id -> (the control plane's generation when read, the tenant's quota)
        self._quotas: OrderedDict[str, tuple[int, Quota]] = OrderedDict()
        # tenant id -> how many times this server changed its limits (see `learn`)
        self._changes: dict[str, int] = {}
        self._lock = threading.Lock()
        self.rejected = dict.fromkeys(REASONS, 0)

    def admit(self, principal: Principal) -> Quota | QuotaSource | None:
        """Take a token from the key's bucket, or refuse with 429; what the tenant's writes
        are held to (None: nothing)."""
        rate = principal.requests_per_minute or self.default_rate
        if rate:
            wait = self._buckets.take((principal.tenant_id, principal.key_id), rate)
            if wait > 0:
                self.count(REQUESTS_PER_MINUTE)
                raise TooManyRequests(
                    f"this key may make {rate} requests a minute (its requests_per_minute "
                    "limit); retry after the seconds Retry-After gives",
                    headers={"Retry-After": str(max(1, math.ceil(wait)))},
                )
        if self._control() is None:  # local mode: the defaults, the same for every tenant
            return None if self.default_quota == UNLIMITED else self.default_quota
        return partial(self.quota, principal.tenant_id)

    def quota(self, tenant_id: str) -> Quota:
        """The tenant's limits (max_events, max_bytes, max_memory): its own, else the server's
        default each.

        Read from the control plane once per change to tenants or keys (its generation), as
        the key verifier reads a key's row: a change takes effect on the next group commit.
        """
        control = self._control()
        if control is None:
            return self.default_quota
        generation = control.generation()
        with self._lock:
            kept = self._quotas.get(tenant_id)
            if kept is not None and kept[0] == generation:
                self._quotas.move_to_end(tenant_id)
                return kept[1]
            changes = self._changes.get(tenant_id, 0)
        record = control.get_tenant(tenant_id)
        quota = self.default_quota if record is None else self.effective(record)
        with self._lock:
            # A change `learn` kept meanwhile is newer than this read: keep it, not this.
            if self._changes.get(tenant_id, 0) == changes:
                self._keep(tenant_id, generation, quota)
        return quota

    def learn(self, record: TenantRecord) -> None:
        """A tenant's limits as this server just changed them (PATCH /v1/admin/tenants/{id}),
        in force for its next group commit.

        A PostgreSQL control plane tells of a change through a notification that may arrive
        after the PATCH is answered: until then the generation has not moved, and the limits
        kept from before would still pass.
        """
        control = self._control()
        if control is None:
            return
        generation = control.generation()
        quota = self.effective(record)
        with self._lock:
            self._changes[record.tenant_id] = self._changes.get(record.tenant_id, 0) + 1
            if len(self._changes) > MAX_TENANTS:
                self._changes.pop(next(iter(self._changes)))
            self._keep(record.tenant_id, generation, quota)

    def _keep(self, tenant_id: str, generation: int, quota: Quota) -> None:
        """Remember a tenant's quota as of a generation (the lock held)."""
        self._quotas[tenant_id] = (generation, quota)
        self._quotas.move_to_end(tenant_id)
        if len(self._quotas) > MAX_TENANTS:
            self._quotas.popitem(last=False)

    def effective(self, record: TenantRecord) -> Quota:
        """A tenant's own limits with the server's defaults where it has none."""
        defaults = {name: getattr(self.default_quota, name) for name in LIMITS}
        return Quota(**effective_limits(record, defaults))

    def count(self, reason: str) -> None:
        """One request refused by a limit (memspine_rejected_total{reason})."""
        with self._lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1

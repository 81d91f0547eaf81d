"""GET /v1/memory/retention: the caller's tenant's retention windows, what comes due, its last
retention run and the legal holds standing, for its own keys (the console's Retention page);
the operator's view of the same is GET /v1/admin/tenants/{id} (docs/erasure.md)."""

from __future__ import annotations

import anyio.to_thread

from memspine.pipeline import READ, Call, Operation, Outcome, Reply
from memspine.retention import TenantRetention
from storage.errors import Unavailable

NO_RETENTION = "this server runs no retention (an embedded engine): ask the server that does"


async def _retention(call: Call) -> Outcome:
    retention = call.services.retention
    if retention is None:
        raise Unavailable(NO_RETENTION)
    return Outcome(200, await anyio.to_thread.run_sync(retention.shown, call.tenant_id))


OPERATIONS = (
    Operation(
        "tenant_retention",
        "GET",
        "/v1/memory/retention",
        READ,
        _retention,
        "The tenant's retention windows, what comes due, its last run and its legal holds",
        replies={
            200: Reply(
                TenantRetention,
                "`retention` (the tenant's own windows, null if none), `retention_state` "
                "(the windows in force, oldest event, due now and within 7 days, last run, "
                "kinds) and `holds` (the legal holds standing, oldest first).",
            )
        },
        errors=(503,),
    ),
)

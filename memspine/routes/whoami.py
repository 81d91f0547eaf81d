"""GET /v1/whoami: what the calling key is (tenant, key id, scopes, expiry, rate) and its tenant's
vector space."""

from __future__ import annotations

import msgspec

from memspine.engine import Engine, VectorSpaceView
from memspine.pipeline import ANY_KEY, Call, Operation, Outcome, Reply
from memspine.verifier import Principal


class WhoAmI(msgspec.Struct):
    """The caller's key and its tenant's vector space; in local mode key_id is "local" and the
    key never expires."""

    tenant_id: str
    key_id: str
    scopes: list[str]
    expires_at: int | None
    requests_per_minute: int | None  # the key's own rate; None: the server's default
    vector_space: VectorSpaceView


async def whoami_of(engine: Engine, principal: Principal) -> WhoAmI:
    """The tenant, key id, scopes and expiry of a key, and the tenant's vector space."""
    return WhoAmI(
        tenant_id=principal.tenant_id,
        key_id=principal.key_id,
        scopes=list(principal.scopes),
        expires_at=principal.expires_at,
        requests_per_minute=principal.requests_per_minute,
        vector_space=await engine.vector_space(principal.tenant_id),
    )


async def _whoami(call: Call) -> Outcome:
    assert call.principal is not None
    return Outcome(200, await whoami_of(call.services.engine, call.principal))


WHOAMI = Operation(
    "whoami",
    "GET",
    "/v1/whoami",
    ANY_KEY,
    _whoami,
    "The tenant, key id, scopes and expiry of the key that made the request",
    replies={200: Reply(WhoAmI, "The calling key.")},
    tag="keys",
)

OPERATIONS = (WHOAMI,)

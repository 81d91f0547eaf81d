"""GET /v1/whoami: what the calling key is (tenant, key id, scopes, expiry)."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get

from memspine.auth import tenant_guard
from memspine.queryparams import check_params
from memspine_admin.verifier import Principal


class WhoAmI(msgspec.Struct):
    """The caller's key; in local mode key_id is "local" and the key never expires."""

    tenant_id: str
    key_id: str
    scopes: list[str]
    expires_at: int | None


@get("/v1/whoami", guards=[tenant_guard], opt={"scope": None})
async def whoami(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The tenant, key id, scopes and expiry of the key that made the request."""
    check_params(request, set())
    principal: Principal = request.state.principal
    out = WhoAmI(
        tenant_id=principal.tenant_id,
        key_id=principal.key_id,
        scopes=list(principal.scopes),
        expires_at=principal.expires_at,
    )
    return Response(msgspec.json.encode(out), media_type="application/json")


ROUTES = [whoami]

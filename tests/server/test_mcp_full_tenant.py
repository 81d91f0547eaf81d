"""The MCP door refuses a full tenant's append as the HTTP route does, through the same engine
call (Engine.refuse_if_full): once its quota refused an append, the next is refused before its
body is validated, unless it carries an idempotency key (a replay is answered as before)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from memspine.auth import Authenticator
from memspine.config import Settings
from memspine.engine import Engine
from memspine.mcp.backend import EngineBackend
from memspine.mcp.server import Caller, build_server
from storage import Quota
from tests.support.mcp_calls import CHEAP_HASHER, call, issue_keys, refused

BAD_KIND = "k" * 1000  # a kind no event may have: refused by validation, when it is reached


def test_a_full_tenants_mcp_append_is_refused_before_its_body_is_validated(
    tmp_path: Path,
) -> None:
    keys = issue_keys(tmp_path / "data")
    engine = Engine(Settings(data_dir=tmp_path / "data", embedding_dim=4))
    auth = Authenticator(tmp_path / "data", None, hasher=CHEAP_HASHER)

    def resolve(_ctx: Any) -> Caller:
        principal = auth.authenticate(keys["rw"])
        return Caller(principal, EngineBackend(engine, principal, Quota(max_events=2)))

    async def main() -> list[str]:
        async with Client(build_server(resolve)) as c:
            for i in range(2):
                await call(c, "memory_append", {"kind": "note", "text": f"n{i}"})
            seen = [(await refused(c, "memory_append", {"kind": "note", "text": "n2"}))["error"]]
            assert engine.full.refused_unread == 0  # the writer refused that one
            seen.append((await refused(c, "memory_append", {"kind": BAD_KIND}))["error"])
            keyed = {"kind": BAD_KIND, "idempotency_key": "maybe-a-replay"}
            seen.append((await refused(c, "memory_append", keyed))["error"])
            return seen

    try:
        seen = anyio.run(main)
        # Refused at once (never validated: not a 400), but a keyed one is read as ever.
        assert seen == ["quota_exceeded", "quota_exceeded", "invalid_request"]
        assert engine.full.refused_unread == 1
        assert engine.usage_now(keys["tenant"]).events.live == 2
    finally:
        engine.close()
        auth.close()

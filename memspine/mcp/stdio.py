"""MCP over stdio for one tenant: embedded on a data directory, or as a client of a running server.

stdout carries the protocol and nothing else; logs go to stderr.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from memspine.client import AsyncMemspine
from memspine.config import Settings
from memspine.mcp.remote import Refused, RemoteBackend
from memspine.verifier import Principal
from storage.errors import Unavailable

# The MCP SDK and the engine load where they are used: `memspine mcp --url` that cannot reach
# its server says so without them.
if TYPE_CHECKING:
    from memspine.mcp.server import Caller

log = logging.getLogger("memspine.mcp")
# The bridge asks the server who the key is before it serves: bounded, so a wrong address
# (something that accepts the connection and never answers) ends in a sentence, not a hang.
FIRST_ANSWER_SECS = 10.0


async def serve(caller: Caller, tools: str = "memspine") -> None:
    """Serve a tool set (memspine/mcp/toolsets/) for this caller over the process's stdin and
    stdout until stdin closes."""
    from mcp.server.stdio import stdio_server

    from memspine.mcp.server import build_server, fixed

    server = build_server(fixed(caller), tools)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def serve_embedded(
    settings: Settings, tenant_id: str, *, read_only: bool = False, tools: str = "memspine"
) -> None:
    """Open the data directory in this process and serve one tenant (both scopes unless read_only)."""
    from memspine.engine import Engine
    from memspine.mcp.backend import EngineBackend
    from memspine.mcp.server import Caller
    from memspine.purger import Purger
    from memspine.retention import Retention
    from memspine_admin.plane import control_exists, open_control

    engine = Engine(settings)
    # Legal holds and retention windows hold here too, when the directory has a control plane.
    url = settings.control_url
    control = (
        open_control(settings.data_dir, url) if control_exists(settings.data_dir, url) else None
    )
    retention = Retention(engine, lambda: control)
    engine.holds = retention.holds
    scopes = ("read",) if read_only else ("read", "write")
    principal = Principal(tenant_id=tenant_id, key_id="embedded", scopes=scopes)
    log.info(
        "memspine mcp: tenant %s in %s, scopes %s", tenant_id, settings.data_dir, ",".join(scopes)
    )
    # As in the server: deletes made here leave the disk within MEMSPINE_PURGE_INTERVAL_SECS
    # while the host keeps this process running, not only once a server next opens the directory.
    purger = None if read_only else Purger(engine, settings.purge_interval_secs, retention)
    if purger is not None:
        purger.start()
    try:
        await serve(Caller(principal, EngineBackend(engine, principal)), tools)
    finally:
        if purger is not None:
            await purger.stop()
        engine.close()
        if control is not None:
            control.close()


async def serve_remote(url: str, api_key: str, tools: str = "memspine") -> None:
    """Serve the tenant of api_key on the server at url; the key's scopes decide the tools shown."""
    async with AsyncMemspine(url, api_key) as client:
        backend = RemoteBackend(client)
        who: dict[str, Any] | None = None
        try:
            with anyio.fail_after(FIRST_ANSWER_SECS):
                who = await backend.whoami()
        except TimeoutError:
            raise Unavailable(
                f"no answer from {url} within {FIRST_ANSWER_SECS:.0f} s; is memspine-server running there?"
            ) from None
        except Refused as refused:
            if refused.code != "not_found":
                raise
        from memspine.mcp.server import Caller, principal_of

        if who is not None:
            principal = principal_of(who)
        else:  # a server without /v1/whoami: show every tool, the server still refuses
            principal = Principal(tenant_id="?", key_id="?", scopes=("read", "write"))
        log.info(
            "memspine mcp: %s as key %s, scopes %s",
            url,
            principal.key_id,
            ",".join(principal.scopes),
        )
        await serve(Caller(principal, backend), tools)


def embedded_settings(base: Settings, data_dir: Path) -> Settings:
    """The environment's settings with the data directory from the command line."""
    return msgspec.structs.replace(base, data_dir=data_dir)

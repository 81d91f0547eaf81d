"""`memspine-server`: load settings once, build the app, serve it with uvicorn on uvloop."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

import uvicorn

from memspine import __version__
from memspine.config import SettingsError, load_settings
from memspine.connguard import guarded_protocol
from memspine.limits import log_fd_limit, raise_fd_limit
from memspine.logs import configure_logging
from memspine.startline import ReadyServer
from storage.datalock import DataDirBusy, client_url, hold
from storage.errors import MemspineError

log = logging.getLogger("memspine.server")

DESCRIPTION = (
    "Serve memspine's HTTP API (/v1/...) and MCP (/mcp). Settings come from MEMSPINE_* "
    "environment variables, not options: MEMSPINE_BIND (default 127.0.0.1:7781), "
    "MEMSPINE_DATA_DIR (default ./data), MEMSPINE_ADMIN_KEY, ...; every one is in "
    "docs/configuration.md."
)


def parser() -> argparse.ArgumentParser:
    """The command line: --help and --version only; the settings are in the environment."""
    top = argparse.ArgumentParser(prog="memspine-server", description=DESCRIPTION)
    top.add_argument("--version", action="version", version=f"memspine-server {__version__}")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the memspine-server console script."""
    parser().parse_args(argv)  # --help and --version answer here, before anything is touched
    fd_limit = raise_fd_limit()  # first: the default cap on open tenants is computed from it
    try:
        settings = load_settings(os.environ)
    except SettingsError as exc:
        print(f"memspine-server: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    log_fd_limit(fd_limit)
    source = "MEMSPINE_MAX_OPEN_TENANTS" if "MEMSPINE_MAX_OPEN_TENANTS" in os.environ else "default"
    log.info(
        "open tenants capped",
        extra={"max_open_tenants": settings.max_open_tenants, "source": source},
    )
    try:
        lock = hold(settings.data_dir, "memspine-server", client_url(settings.host, settings.port))
        from memspine.app import create_app  # here: --help and --version need none of it

        app = create_app(settings)
    except DataDirBusy as busy:
        print(
            f"memspine-server: {busy.data_dir} is in use by {busy.who()}; one process serves "
            "a data directory: stop that one or set another MEMSPINE_DATA_DIR",
            file=sys.stderr,
        )
        return 2
    except OSError as exc:  # e.g. a data directory that cannot be created: one clear line
        print(f"memspine-server: cannot use MEMSPINE_DATA_DIR: {exc.strerror}", file=sys.stderr)
        return 2
    except MemspineError as exc:  # e.g. MEMSPINE_CONTROL_URL's database cannot be reached
        print(f"memspine-server: {exc.detail}", file=sys.stderr)
        return 2
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=guarded_protocol(settings),  # httptools, with connection caps and read timeouts
        ws="none",  # no route speaks WebSocket; an upgrade would leave the guarded protocol
        log_level="warning",
        log_config=None,  # uvicorn's own loggers go through our JSON handler
        access_log=False,
        proxy_headers=False,  # nothing reads the client address; one ASGI layer less per request
        lifespan="on",
        timeout_graceful_shutdown=10,
    )
    server = ReadyServer(config, settings)
    server.run()
    lock.close()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())

"""`memspine-server`: load settings once, build the app, serve it with uvicorn on uvloop."""

from __future__ import annotations

import logging
import os
import sys

import uvicorn

from memspine.app import create_app
from memspine.config import SettingsError, load_settings
from memspine.connguard import guarded_protocol
from memspine.limits import log_fd_limit, raise_fd_limit
from memspine.logs import configure_logging

log = logging.getLogger("memspine.server")


def main() -> int:
    """Entry point of the memspine-server console script."""
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
        app = create_app(settings)
    except OSError as exc:  # e.g. a data directory that cannot be created: one clear line
        print(f"memspine-server: cannot use MEMSPINE_DATA_DIR: {exc.strerror}", file=sys.stderr)
        return 2
    uvicorn.run(
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
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`memspine-server`: load settings once, build the app, serve it with uvicorn on uvloop."""

from __future__ import annotations

import logging
import os
import sys

import uvicorn

from memspine.app import create_app
from memspine.config import SettingsError, load_settings


def main() -> int:
    """Entry point of the memspine-server console script."""
    try:
        settings = load_settings(os.environ)
    except SettingsError as exc:
        print(f"memspine-server: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format="%(message)s", stream=sys.stderr)
    app = create_app(settings)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="h11",
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=10,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GET /health: no auth, no tenant data."""

from __future__ import annotations

from litestar import get

from memspine import __version__


@get("/health")
async def health() -> dict[str, str]:
    """Liveness: the service name, status and version."""
    return {"service": "memspine-server", "status": "ok", "version": __version__}


ROUTES = [health]

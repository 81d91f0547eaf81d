"""GET /, GET /health and GET /metrics: no auth, no tenant data."""

from __future__ import annotations

import anyio.to_thread
import msgspec

from memspine import __version__
from memspine.metrics import MEDIA_TYPE
from memspine.pipeline import PUBLIC, Call, Operation, Outcome, Reply


class Health(msgspec.Struct):
    """Liveness: the service name, status and version."""

    service: str
    status: str
    version: str


HEALTHY = Health(service="memspine-server", status="ok", version=__version__)


async def _health(_call: Call) -> Outcome:
    return Outcome(200, HEALTHY)


class Home(msgspec.Struct):
    """What answers at the root: this server, and where a person goes from here."""

    service: str
    version: str
    console: str | None  # None when MEMSPINE_UI=0
    schema: str
    openapi: str
    health: str


async def _home(call: Call) -> Outcome:
    console = "/ui" if call.services.settings.ui else None
    return Outcome(
        200,
        Home(
            service="memspine-server",
            version=__version__,
            console=console,
            schema="/schema",
            openapi="/schema/openapi.json",
            health="/health",
        ),
    )


async def _metrics(call: Call) -> Outcome:
    """Prometheus exposition (rendering reads every open tenant's map size: in a thread)."""
    body = await anyio.to_thread.run_sync(call.services.metrics.render)
    return Outcome(200, body, media_type=MEDIA_TYPE)


HEALTH = Operation(
    "health",
    "GET",
    "/health",
    PUBLIC,
    _health,
    "Liveness: the service name, status and version",
    replies={200: Reply(Health, "The server is up.")},
    strict_query=False,
    tag="server",
)
HOME = Operation(
    "home",
    "GET",
    "/",
    PUBLIC,
    _home,
    "Where to go: the console (/ui), the API's document (/schema) and /health",
    replies={200: Reply(Home, "This server, and the paths a person starts from.")},
    strict_query=False,
    tag="server",
)
METRICS = Operation(
    "metrics",
    "GET",
    "/metrics",
    PUBLIC,
    _metrics,
    "Prometheus metrics; tenant ids only with MEMSPINE_METRICS_PER_TENANT=1",
    replies={
        200: Reply(str, "Prometheus text exposition (docs/operations.md).", media_type=MEDIA_TYPE)
    },
    strict_query=False,
    tag="server",
)

OPERATIONS = (HOME, HEALTH, METRICS)

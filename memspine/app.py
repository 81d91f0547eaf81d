"""The Litestar application factory."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.datastructures import State

from memspine.allowance import Allowance
from memspine.auth import Authenticator, AuthLimits
from memspine.cluster import default_node_url, node_figures
from memspine.config import Settings
from memspine.edge import Edge
from memspine.engine import Engine, EngineHooks
from memspine.errors import EXCEPTION_HANDLERS
from memspine.heap import HeapTrimmer
from memspine.hot import HotRoutes
from memspine.leftovers import Leftovers
from memspine.logs import install_request_observer, log_request
from memspine.mcp.lazy import LazyMcp
from memspine.metrics import Metrics
from memspine.openapi import schema_routes
from memspine.pipeline import Services
from memspine.purger import Purger
from memspine.readmove import serves
from memspine.retention import Retention
from memspine.routes import OPERATIONS, litestar_handlers, ui
from storage import limit_arenas, pin_mmap_threshold
from storage import warm as warm_cypher

log = logging.getLogger("memspine.app")


# How long a thread that holds the interpreter keeps it while another waits (Python's default
# is 5 ms). A request waits for it at every hop between the event loop and a read thread, so
# while another tenant's long query runs, each hop cost up to 5 ms; 1 ms keeps one tenant's
# CPU-bound read from adding tens of milliseconds to every other tenant's requests.
SWITCH_INTERVAL_S = 0.001


def _settle() -> None:
    """Once the server is built: build the Cypher parser, freeze what exists so far (the code,
    the parser, the app) out of the garbage collector's reach, and shorten the switch interval.
    A full collection then walks only what requests made since, instead of the whole server
    each time one request keeps some tens of thousands of objects (a long query's parse tree,
    a sort's rows): a pause every tenant waited out."""
    warm_cypher()
    gc.freeze()
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def create_app(
    settings: Settings, *, auth: Authenticator | None = None, hot_routes: bool = True
) -> Litestar:
    """Build the app for these settings; tenants open lazily, background work starts with the app.

    `auth` replaces the default Authenticator (tests pass one with a fake clock); with
    `hot_routes=False` Litestar serves append and recall too (tests compare the two).
    """
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    limit_arenas()  # before the tenants' threads start: each would get an arena of its own
    pin_mmap_threshold()  # tenants opened and closed in turn: see storage/heap.py
    auth = auth or Authenticator(
        settings.data_dir,
        settings.admin_key,
        limits=AuthLimits.of(settings),
        control_url=settings.control_url,
        node=settings.node,
        node_url=settings.node_url or default_node_url(settings.host, settings.port),
        figures=lambda: node_figures(settings.data_dir, engine.manager.open_count()),
    )
    allowance = Allowance(settings, auth.control)
    metrics = Metrics(per_tenant=settings.metrics_per_tenant)
    engine = Engine(
        settings,
        EngineHooks(
            on_purge=metrics.observe_purge,
            on_reject=allowance.count,
            on_open=metrics.observe_open,
            on_batch=metrics.observe_batch,
            admit=auth.admit_tenant,
            gate=auth.gate,
            # A delete of what a legal hold keeps is refused (the holds come from the control
            # plane through Retention, made just below: it needs the engine).
            holds=lambda tenant_id: retention.holds(tenant_id),
        ),
    )
    retention = Retention(engine, auth.control)
    gate = auth.gate  # a cluster node records the heads of the tenants placed on it only
    engine.reads.keep_marks_in(auth.control, serves=lambda tenant_id: serves(gate, tenant_id))
    metrics.watch(engine.manager)
    metrics.watch_limits(lambda: dict(allowance.rejected))
    metrics.watch_embedding(engine.embedding)
    mcp = LazyMcp(engine, auth, settings, allowance)  # the MCP SDK loads on its first request
    services = Services(
        engine=engine,
        auth=auth,
        settings=settings,
        metrics=metrics,
        allowance=allowance,
        retention=retention,
    )

    @asynccontextmanager
    async def lifespan(_app: Litestar) -> AsyncIterator[None]:
        engine.manager.start_idle_closer()
        purger = Purger(engine, settings.purge_interval_secs, retention)
        purger.start()
        sweeper = None  # a cluster node erases copies a killed move left (memspine/leftovers.py)
        if auth.gate is not None:
            leftovers = Leftovers(engine, auth.gate, settings.data_dir, settings.admin_key or "")
            sweeper = asyncio.create_task(leftovers.run(), name="leftovers")
        trimmer = HeapTrimmer()
        trimmer.start()
        # lark takes a noticeable part of a second to build the Cypher parser: beside startup,
        # not in a first query
        threading.Thread(target=_settle, name="cypher-warm", daemon=True).start()
        try:
            yield
        finally:
            if sweeper is not None:
                sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeper
            await trimmer.stop()
            await purger.stop()  # before the tenants close: a purge under way finishes first
            engine.close()
            auth.close()

    app = Litestar(
        route_handlers=[
            *litestar_handlers(services),
            *schema_routes(OPERATIONS, settings.embedding_dim, ui=settings.ui),
            *ui.routes(settings),
            mcp.route(),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        state=State(
            {
                "engine": engine,
                "auth": auth,
                "settings": settings,
                "metrics": metrics,
                "retention": retention,
            }
        ),
        lifespan=[lifespan, mcp.lifespan],  # MCP sessions end before the engine closes
        request_max_body_size=settings.max_body_bytes,
        openapi_config=None,  # memspine/openapi.py builds the document from the operations
        debug=False,
        logging_config=None,  # logging is configured once, as JSON lines, by the server (logs.py)
    )
    if hot_routes:
        app.asgi_handler = HotRoutes(app.asgi_handler, services)
    # In front of both, inside the observer: refusals at the edge are logged and counted too.
    app.asgi_handler = Edge(app.asgi_handler, settings, local_mode=lambda: auth.control() is None)
    install_request_observer(app, [log_request, metrics.observe_request])
    return app

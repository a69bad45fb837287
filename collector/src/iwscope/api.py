"""The FastAPI application (``create_app``) and its lame-duck uvicorn server (``serve``)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio.to_thread
import sqlalchemy.exc
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.config import STARTUP_FAILURE

from iwscope import __version__
from iwscope.admission import Admission
from iwscope.analysis.routes import router as analysis_router
from iwscope.auth.dependencies import start_credential_listener, stop_credential_listener
from iwscope.campaigns.routes import router as campaigns_router
from iwscope.config import get_settings
from iwscope.dbslots import DatabaseBusy
from iwscope.exports.routes import router as exports_router
from iwscope.health import router as health_router
from iwscope.hotpaths import HotPaths
from iwscope.http import database_busy_response
from iwscope.metrics import DB_BUSY, LATENCY, REQUESTS, labelled
from iwscope.openapi import install_openapi
from iwscope.origins.routes import router as origins_router
from iwscope.passive.routes import router as passive_router
from iwscope.predictions.routes import router as predictions_router
from iwscope.probes.routes import router as probes_router
from iwscope.server import LameDuckServer, listening_sockets
from iwscope.servers.routes import router as servers_router
from iwscope.supervisor import run_workers
from iwscope.traces.routes import router as traces_router
from iwscope.trials.routes import router as trials_router
from iwscope.trials.writer import close_group_writer

log = logging.getLogger(__name__)


class RequestMetrics:
    """ASGI middleware counting every request and its latency by method, route template
    (bounded label cardinality; ``unmatched`` when no route matched) and status.

    Plain ASGI, not Starlette's ``BaseHTTPMiddleware``: that one runs the app in a task group
    and streams the body through a memory channel, a cost every request paid twice over."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status_code = 500
        counted = False

        def count() -> None:
            nonlocal counted
            counted = True
            # The router (or iwscope.hotpaths) put the matched route into this same scope.
            route = str(getattr(scope.get("route"), "path", "unmatched"))
            labelled(LATENCY, scope["method"], route).observe(time.perf_counter() - started)
            labelled(REQUESTS, scope["method"], route, str(status_code)).inc()

        async def send_and_note(message: Message) -> None:
            nonlocal status_code
            if message["type"] == "http.response.start":
                status_code = message["status"]
            await send(message)
            # Counted when the answer is complete, not when the app returns: work after the
            # answer (an upload's join request waits up to 50 ms) is not the client's latency,
            # and a client reading /metrics right after its answer sees it counted.
            if message["type"] == "http.response.body" and not message.get("more_body", False) and not counted:
                count()

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            if not counted:
                count()


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Size this event loop's default thread pool (``IWSCOPE_API_THREADS``); database work
    runs on the threads of :mod:`iwscope.dbslots`, one per pooled connection."""
    settings = get_settings()
    anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_threads
    log.info(
        "API: %d database connections (pool %d + overflow %d, wait at most %g s), %d other threads",
        settings.db_connections,
        settings.db_pool_size,
        settings.db_max_overflow,
        settings.db_pool_timeout_s,
        settings.api_threads,
    )
    listener = start_credential_listener()
    # Ready means listening (or 3 s passed: then the short credential cache applies until it does).
    if not await anyio.to_thread.run_sync(listener.wait_listening, 3.0):
        log.warning("not yet listening to credential changes: credentials cached %g s meanwhile", settings.credential_cache_s)
    try:
        yield
    finally:
        await close_group_writer()
        await anyio.to_thread.run_sync(stop_credential_listener)


def create_app(*, hot_paths: bool = True) -> CollectorApp:
    """The collector's ASGI application (``hot_paths=False``: every request through FastAPI's
    routes, the reference the hot paths are tested against)."""
    app = FastAPI(
        title="iwscope collector",
        version=__version__,
        lifespan=_lifespan,
        description="Ingest and read API of iwscope (wire format, see iwprobe.wire).",
        # FastAPI's native OpenTelemetry: iwscope exports Prometheus metrics (/metrics) and no
        # traces; left on, every request asks the global OTel providers whether they are set
        # (reading os.environ each time): 3-6 % of the API's CPU under upload load (py-spy,
        # docs/ingest-throughput.md).
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    for router in (
        health_router,
        probes_router,
        origins_router,
        servers_router,
        campaigns_router,
        trials_router,
        traces_router,
        passive_router,
        exports_router,
        analysis_router,
        predictions_router,
    ):
        app.include_router(router)
    install_openapi(app)

    @app.exception_handler(DatabaseBusy)
    async def database_busy(request: Request, error: DatabaseBusy) -> JSONResponse:
        return database_busy_response(get_settings().retry_after_s)

    @app.exception_handler(sqlalchemy.exc.TimeoutError)
    async def pool_timeout(request: Request, error: sqlalchemy.exc.TimeoutError) -> JSONResponse:
        # Raised by pool.connect() before anything was written: connections held outside the
        # database slots (code that does not go through iwscope.dbslots, or another process
        # sharing the engine's pool settings) kept the pool empty for pool_timeout.
        DB_BUSY.labels("pool").inc()
        log.warning("answered 503: %s", error)
        return database_busy_response(get_settings().retry_after_s)

    return CollectorApp(app, hot_paths=hot_paths)


class CollectorApp:
    """What uvicorn runs: :class:`iwscope.admission.Admission`, then :class:`RequestMetrics`,
    then :class:`iwscope.hotpaths.HotPaths`, then the FastAPI application (``fastapi``).

    The three are plain ASGI layers in front of FastAPI, not FastAPI middleware: as middleware
    they sat inside FastAPI's own layers (Starlette's ``ServerErrorMiddleware`` and FastAPI's
    exception-telemetry and body-limit middleware, each wrapping ``send``), which every probe
    upload and schedule poll then crossed for nothing (docs/ingest-throughput.md).  A request
    the hot paths do not answer goes through FastAPI's whole stack as before; a fault in the
    hot paths is answered 500 by uvicorn.
    """

    def __init__(self, fastapi: FastAPI, *, hot_paths: bool = True) -> None:
        self.fastapi = fastapi
        settings = get_settings()
        inner: ASGIApp = HotPaths(fastapi) if hot_paths else fastapi
        # Outermost: a refused request costs no routing, no body, no metrics.
        self._app = Admission(
            RequestMetrics(inner),
            limit=settings.max_in_progress,
            other_limit=settings.max_other_in_progress,
            retry_after_s=settings.retry_after_s,
            max_retry_after_s=settings.max_retry_after_s,
            max_lag_s=settings.max_loop_lag_s,
            upload_latency_target_s=settings.upload_latency_target_s,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def serve(hosts: Sequence[str], port: int, workers: int = 1, tls_cert: str | None = None, tls_key: str | None = None) -> int:
    """Run the API on every address of ``hosts`` in ``workers`` processes (``iwscope.supervisor``
    when more than one); each drains on SIGTERM.  With ``tls_cert``/``tls_key`` it serves HTTPS
    only.  Returns the exit status."""
    settings = get_settings()
    config = uvicorn.Config(
        "iwscope.api:create_app",
        factory=True,
        host=hosts[0],
        port=port,
        log_level=settings.log_level.lower(),
        access_log=False,
        ssl_certfile=tls_cert if tls_cert else None,
        ssl_keyfile=tls_key if tls_cert else None,
    )
    sockets = listening_sockets(hosts, port)
    if workers > 1:
        return run_workers(config, sockets, workers, settings.drain_seconds)
    server = LameDuckServer(config, settings.drain_seconds)
    server.run(sockets=sockets)
    return 0 if server.started else STARTUP_FAILURE

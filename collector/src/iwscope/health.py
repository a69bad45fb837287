"""``/healthz`` (alive), ``/readyz`` (PostgreSQL and Redis reachable, not draining), ``/metrics``."""

from __future__ import annotations

import os
import threading
from functools import lru_cache

import redis
from fastapi import APIRouter, Response, status
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from iwscope.config import get_settings
from iwscope.metrics import exposition

router = APIRouter(tags=["health"])

#: Set on SIGTERM: the process finishes in-flight work but tells load balancers to go away.
DRAINING = threading.Event()


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@lru_cache(maxsize=1)
def _readiness_engine() -> Engine:
    """A connection of its own per check (no pool): readiness asks whether PostgreSQL answers,
    not whether this process's pool has a connection free -- a busy pool answers 503 +
    ``Retry-After`` to requests, it must not take the process out of its load balancer."""
    return create_engine(
        get_settings().database_url,
        poolclass=NullPool,
        connect_args={"connect_timeout": 2, "application_name": f"iwscope[{os.getpid()}]readyz"},
    )


def _check_dependencies() -> dict[str, str]:
    checks: dict[str, str] = {}
    try:
        with _readiness_engine().connect() as connection:
            connection.execute(text("SELECT 1"))
        checks["postgresql"] = "ok"
    except Exception as error:  # report, do not raise: this is a probe endpoint
        checks["postgresql"] = f"error: {type(error).__name__}"
    try:
        client = redis.Redis.from_url(get_settings().redis_url, socket_connect_timeout=2, socket_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
        checks["redis"] = "ok"
    except Exception as error:
        checks["redis"] = f"error: {type(error).__name__}"
    return checks


@router.get("/readyz")
async def readyz(response: Response) -> dict[str, object]:
    checks = await run_in_threadpool(_check_dependencies)
    draining = DRAINING.is_set()
    ready = not draining and all(value == "ok" for value in checks.values())
    if not ready:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return {"status": "ready" if ready else ("draining" if draining else "not ready"), "checks": checks}


@router.get("/metrics")
def metrics() -> Response:
    return Response(exposition(), media_type=CONTENT_TYPE_LATEST)

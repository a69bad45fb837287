"""Admission at the front door: a bounded number of requests in progress per API process.

An overloaded collector must shed load, not queue it: a request that waits in front of busy
handlers costs the probe seconds and the collector memory, and its answer comes too late to
be useful (docs/reliability.md "Load").  :class:`Admission` is the outermost ASGI middleware:
it counts the requests in progress in this process and answers one more than the limit at
once with 503 + ``Retry-After`` -- before its body is read, before authentication, before
any database work.  Probes keep their spools and come back after ``Retry-After``; nothing is
lost.

Two classes share the limit (``IWSCOPE_MAX_IN_PROGRESS``):

* **probe traffic** (uploads of trials, observations, traces and passive batches, heartbeats,
  schedules, server configurations, enrollment: :func:`is_probe_traffic`) may use all of it;
* **everything else** (public reads, the CSV export, admin routes) at most
  ``IWSCOPE_MAX_OTHER_IN_PROGRESS`` of it, so readers never take the last places from probes.

Counting requests in progress is blind to the ones not yet in: when the process's CPU is
saturated, requests wait in the event loop's queue (headers read, handler not yet run) and
their latency grows without bound while the count stays below the limit.  So the door also
watches the **event-loop lag** (:class:`LoopLag`: how late a 50 ms timer fires, smoothed over
about a second so one slow callback does not trip it): above ``IWSCOPE_MAX_LOOP_LAG_S`` new
probe traffic is refused too, above half of it every other request.

Health, readiness and metrics are never refused (the orchestrator must see an overloaded
process as alive).  The database slots of :mod:`iwscope.dbslots` stay behind this door: they
split the connections between probes and readers once a request is in.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from iwprobe import wire
from iwscope.metrics import ADMISSION_REJECTED, IN_PROGRESS, LOOP_LAG, labelled

#: Paths never refused: liveness, readiness and metrics must answer under any load.
EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
#: Body of a 503 answered by admission.
OVERLOADED_DETAIL = "collector overloaded: retry later"
#: A refused request declaring more body than this is answered with ``Connection: close``:
#: reading and discarding it would cost more than the client's reconnecting.
CLOSE_ABOVE_BYTES = 64 * 1024

_PROBE_PREFIXES = ("/api/v1/probes/", "/api/v1/origins/", "/api/v1/servers/")
_PROBE_EXACT = frozenset({wire.TRIALS_BATCH_PATH, wire.OBSERVATIONS_BATCH_PATH, wire.PASSIVE_BATCH_PATH, wire.TRACES_BATCH_PATH})


def is_probe_traffic(method: str, path: str) -> bool:
    """Uploads, heartbeats, schedules, configurations and enrollment of probes, origins and
    servers (``iwprobe tap``) -- the agents, whose measurements wait in spools -- not fleet listings."""
    if path in _PROBE_EXACT:
        return method == "POST"
    return path.startswith(_PROBE_PREFIXES)


class LoopLag:
    """Smoothed lateness of a periodic timer on the running event loop (started on first use)."""

    #: Timer period (seconds) and the weight of each new sample in the moving average.
    PERIOD_S = 0.05
    WEIGHT = 0.1

    def __init__(self) -> None:
        self.seconds = 0.0
        self._task: asyncio.Task[None] | None = None

    def ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="iwscope-loop-lag")

    async def _run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.PERIOD_S)
            late = max(0.0, time.perf_counter() - before - self.PERIOD_S)
            self.seconds += self.WEIGHT * (late - self.seconds)
            LOOP_LAG.set(self.seconds)


@dataclass
class _Counts:
    total: int = 0
    other: int = 0


class Admission:
    """ASGI middleware: at most ``limit`` requests in progress, of which at most
    ``other_limit`` are not probe traffic, and none while the loop lags more than ``max_lag_s``
    (others from half of it); beyond, 503 + ``Retry-After`` immediately."""

    def __init__(self, app: ASGIApp, *, limit: int, other_limit: int, retry_after_s: int, max_lag_s: float = 0.0) -> None:
        if limit < 1 or not 1 <= other_limit <= limit:
            raise ValueError(f"admission limits must satisfy 1 <= other ({other_limit}) <= total ({limit})")
        self.app = app
        self.limit = limit
        self.other_limit = other_limit
        self.retry_after_s = retry_after_s
        self.max_lag_s = max_lag_s
        self.lag = LoopLag()
        # One event loop per process: plain integers, no lock (no await between check and count).
        self.counts = _Counts()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        probe = is_probe_traffic(scope["method"], scope["path"])
        kind = "probe" if probe else "other"
        if self.counts.total >= self.limit or (not probe and self.counts.other >= self.other_limit):
            labelled(ADMISSION_REJECTED, kind, "in_progress").inc()
            await self._refuse(scope, send)
            return
        if self.max_lag_s > 0:
            self.lag.ensure_running()
            if self.lag.seconds > (self.max_lag_s if probe else self.max_lag_s / 2):
                labelled(ADMISSION_REJECTED, kind, "loop_lag").inc()
                await self._refuse(scope, send)
                return
        self.counts.total += 1
        self.counts.other += 0 if probe else 1
        labelled(IN_PROGRESS, kind).inc()
        try:
            await self.app(scope, receive, send)
        finally:
            self.counts.total -= 1
            self.counts.other -= 0 if probe else 1
            labelled(IN_PROGRESS, kind).dec()

    async def _refuse(self, scope: Scope, send: Send) -> None:
        body = b'{"detail":"%s","retry_after_s":%d}' % (OVERLOADED_DETAIL.encode(), self.retry_after_s)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(self.retry_after_s).encode()),
        ]
        if _declared_length(scope) > CLOSE_ABOVE_BYTES:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _declared_length(scope: Scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
        if name == b"transfer-encoding":
            return CLOSE_ABOVE_BYTES + 1  # chunked: unknown, possibly large
    return 0

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

Neither sees the uploads waiting for the database inside the process: past the box's capacity
(PostgreSQL's CPU) nearly every place held an upload queued for the group writer, so an
accepted upload waited for the 95 before it -- the API's own histogram put the p50 at 2.5 s and
the p99 at 5 s at 1,000 to 4,000 probes on 2026-12-01/02 (docs/ingest-throughput.md).  So the
door also bounds the **uploads in progress by their latency** (:class:`UploadLimit`, adjusted
each second from the trial uploads' p90 against ``IWSCOPE_UPLOAD_LATENCY_TARGET_S``): while
the collector takes longer than that to answer them, the process takes fewer at once and
refuses the others at once with 503 + ``Retry-After`` instead of letting them wait in line.
The ``Retry-After`` itself grows while the process refuses more probe requests than it admits
(:class:`RetryAfter`, up to ``IWSCOPE_MAX_RETRY_AFTER_S``), so that refused agents come back
spread over the time it needs for them, not all within seconds.

Health, readiness and metrics are never refused (the orchestrator must see an overloaded
process as alive).  The database slots of :mod:`iwscope.dbslots` stay behind this door: they
split the connections between probes and readers once a request is in.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from iwprobe import wire
from iwscope.metrics import ADMISSION_REJECTED, IN_PROGRESS, LOOP_LAG, RETRY_AFTER, UPLOAD_LIMIT, labelled
from iwscope.trials.ingest import TRIALS_PATH, UPLOAD_PATHS

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


class _Interval:
    """Consecutive intervals of ``length_s`` from the first call on: :meth:`ended` is true once
    per interval, at the first call after it ended (both controllers below adjust then)."""

    def __init__(self, length_s: float) -> None:
        self.length_s = length_s
        self._ends: float | None = None

    def ended(self, now: float) -> bool:
        if self._ends is None:
            self._ends = now + self.length_s
            return False
        if now < self._ends:
            return False
        self._ends = now + self.length_s
        return True


class UploadLimit:
    """How many uploads one process takes at once, adjusted every :data:`INTERVAL_S` from how
    long the collector took to answer the trial uploads of that interval (their p90, from the
    body's last byte to the answer): above ``target_s`` the limit shrinks to :data:`DECREASE`
    of itself (never below :data:`FLOOR`), at or below it it grows by an eighth (never above
    ``ceiling``, the door's own limit); an interval in which no trial upload was answered leaves
    it as it is.  So under overload the limit settles where the uploads' latency is about the
    target (a queue of uploads in front of the database is a queue of latency), and after it
    the limit climbs back from :data:`FLOOR` to a ceiling of 96 in 29 intervals.

    Trial uploads set the pace because they are what a probe waits for; an origin's observation
    uploads (hundreds of records each, one lane at a time) take a place each but do not set it."""

    INTERVAL_S = 1.0
    DECREASE = 0.75

    #: The fewest uploads a process takes at once (or its door's limit, if smaller).
    FLOOR = 4

    def __init__(self, ceiling: int, target_s: float) -> None:
        if target_s <= 0 or ceiling < 1:
            raise ValueError(f"an upload limit needs target_s > 0 ({target_s}) and a ceiling >= 1 ({ceiling})")
        self.ceiling = ceiling
        self.floor = min(self.FLOOR, ceiling)
        self.target_s = target_s
        self.limit = ceiling
        UPLOAD_LIMIT.set(ceiling)
        self._durations: list[float] = []
        self._interval = _Interval(self.INTERVAL_S)
        self._decreased_at = -math.inf

    def admits(self, uploads_in_progress: int, now: float) -> bool:
        """Whether one more upload may start now, with ``uploads_in_progress`` under way."""
        self._adjust(now)
        return uploads_in_progress < self.limit

    def finished(self, duration_s: float, now: float) -> None:
        """A trial upload was answered ``duration_s`` after its body's last byte arrived.

        Only uploads that arrived after the last decrease count: the ones queued before it tell
        of the old limit, and counted, they cut a limit already cut while the queue drained
        (73 -> 6 in 8 s as a 2x overload began, 2026-12-02) -- as TCP reduces its
        window once per window of losses, not once per loss.  At a target of 0.5 s this alone
        changed no measured figure (docs/ingest-throughput.md); the target did."""
        if now - duration_s >= self._decreased_at:
            self._durations.append(duration_s)
        self._adjust(now)

    def _adjust(self, now: float) -> None:
        if not self._interval.ended(now):
            return
        durations, self._durations = self._durations, []
        if not durations:
            return
        durations.sort()
        p90 = durations[math.ceil(0.9 * len(durations)) - 1]  # nearest rank: of two, the slower
        if p90 > self.target_s:
            self.limit = max(self.floor, int(self.limit * self.DECREASE))
            self._decreased_at = now
        else:
            self.limit = min(self.ceiling, self.limit + max(1, self.limit // 8))
        UPLOAD_LIMIT.set(self.limit)


class RetryAfter:
    """The ``Retry-After`` the door answers with: ``base_s`` until the process refuses more
    probe requests in a second than it admits, then longer, up to ``max_s``.

    A refused agent comes back after the ``Retry-After`` (x 1-1.5, iwprobe's spools) or later;
    each refusal costs the API, the kernel and the agent a request (and for a body over 64 KiB
    a new connection), CPU taken from PostgreSQL, which stores the accepted ones.  With a fixed
    2 s and uploads bounded by their latency, the door answered 17,000-19,000 requests in 30 s
    at 4x the saturating probe count; with this, 10,600-12,500 (docs/ingest-throughput.md,
    2026-12-02).  Each :data:`INTERVAL_S` the value moves by the ratio of refused to admitted
    probe requests (at most x2 or /2), damped by its own length (a Retry-After of 30 s has its
    effect 30 s later: it moves by a thirtieth of that ratio's logarithm a second); a second
    with fewer than :data:`MIN_REFUSALS` refusals halves it, down to ``base_s``.  It settles
    where about as many requests are refused as admitted."""

    INTERVAL_S = 1.0
    #: Fewer refusals a second than this is no overload to back off from (a door full for a moment).
    MIN_REFUSALS = 10

    def __init__(self, base_s: int, max_s: int) -> None:
        if base_s < 1:
            raise ValueError(f"Retry-After must be at least 1 s, got {base_s}")
        self.base_s = base_s
        self.max_s = max(base_s, max_s)
        self.seconds = float(base_s)
        self._admitted = 0
        self._refused = 0
        self._interval = _Interval(self.INTERVAL_S)

    @property
    def value(self) -> int:
        """Whole seconds, as the header says them (``seconds`` never falls below ``base_s``)."""
        return round(self.seconds)

    def admitted(self, now: float) -> None:
        self._admitted += 1
        self._adjust(now)

    def refused(self, now: float) -> int:
        """Count one refused probe request; the ``Retry-After`` to answer it with."""
        self._refused += 1
        self._adjust(now)
        return self.value

    def _adjust(self, now: float) -> None:
        if not self._interval.ended(now):
            return
        refused, admitted = self._refused, self._admitted
        self._refused = self._admitted = 0
        if refused < self.MIN_REFUSALS:
            self.seconds = max(float(self.base_s), self.seconds / 2)
        else:
            ratio = min(2.0, max(0.5, refused / max(1, admitted)))
            moved = self.seconds * ratio ** min(1.0, self.INTERVAL_S / self.seconds)
            self.seconds = min(float(self.max_s), max(float(self.base_s), moved))
        RETRY_AFTER.set(self.value)


@dataclass
class _Counts:
    total: int = 0
    other: int = 0
    #: Of ``total``: uploads of trials and observations (``trials.ingest.UPLOAD_PATHS``, the group writer's).
    uploads: int = 0


class Admission:
    """ASGI middleware: at most ``limit`` requests in progress, of which at most
    ``other_limit`` are not probe traffic, and none while the loop lags more than ``max_lag_s``
    (others from half of it); uploads at most as many as their :class:`UploadLimit` takes
    (``upload_latency_target_s``; 0: uploads only count against ``limit``); beyond, 503 +
    ``Retry-After`` immediately."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int,
        other_limit: int,
        retry_after_s: int,
        max_retry_after_s: int = 0,
        max_lag_s: float = 0.0,
        upload_latency_target_s: float = 0.0,
    ) -> None:
        if limit < 1 or not 1 <= other_limit <= limit:
            raise ValueError(f"admission limits must satisfy 1 <= other ({other_limit}) <= total ({limit})")
        self.app = app
        self.limit = limit
        self.other_limit = other_limit
        self.retry_after = RetryAfter(retry_after_s, max_retry_after_s)
        self.max_lag_s = max_lag_s
        self.lag = LoopLag()
        self.uploads = UploadLimit(limit, upload_latency_target_s) if upload_latency_target_s > 0 else None
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
            await self._refuse(scope, send, probe)
            return
        if self.max_lag_s > 0:
            self.lag.ensure_running()
            if self.lag.seconds > (self.max_lag_s if probe else self.max_lag_s / 2):
                labelled(ADMISSION_REJECTED, kind, "loop_lag").inc()
                await self._refuse(scope, send, probe)
                return
        uploads = self.uploads if probe and scope["method"] == "POST" and scope["path"] in UPLOAD_PATHS else None
        if probe:
            now = time.monotonic()
            if uploads is not None:
                if not uploads.admits(self.counts.uploads, now):
                    labelled(ADMISSION_REJECTED, kind, "upload_latency").inc()
                    await self._refuse(scope, send, probe)
                    return
                self.counts.uploads += 1
                if scope["path"] == TRIALS_PATH:
                    receive, send = _timed(uploads, receive, send)
            self.retry_after.admitted(now)
        self.counts.total += 1
        self.counts.other += 0 if probe else 1
        labelled(IN_PROGRESS, kind).inc()
        try:
            await self.app(scope, receive, send)
        finally:
            self.counts.total -= 1
            self.counts.other -= 0 if probe else 1
            labelled(IN_PROGRESS, kind).dec()
            if uploads is not None:
                self.counts.uploads -= 1

    async def _refuse(self, scope: Scope, send: Send, probe: bool) -> None:
        retry_after_s = self.retry_after.refused(time.monotonic()) if probe else self.retry_after.value
        body = b'{"detail":"%s","retry_after_s":%d}' % (OVERLOADED_DETAIL.encode(), retry_after_s)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(retry_after_s).encode()),
        ]
        if _declared_length(scope) > CLOSE_ABOVE_BYTES:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _timed(uploads: UploadLimit, receive: Receive, send: Send) -> tuple[Receive, Send]:
    """``receive`` and ``send`` of a trial upload, telling ``uploads`` how long the collector
    took from the body's last byte to the answer's start: its own time, not the client's (a
    probe on a slow link sends a body for seconds without the collector being busy)."""
    body_read_at = 0.0

    async def receive_timed() -> Message:
        nonlocal body_read_at
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            body_read_at = time.monotonic()
        return message

    async def send_timed(message: Message) -> None:
        if message["type"] == "http.response.start" and body_read_at:
            now = time.monotonic()
            uploads.finished(now - body_read_at, now)
        await send(message)

    return receive_timed, send_timed


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

"""The two upload routes' hot path: ``POST /api/v1/trials/batch`` and ``/api/v1/observations/batch``
answered before FastAPI's router (:class:`iwscope.hotpaths.HotPaths` calls :func:`answer_upload`).

Every probe and origin upload went through FastAPI's per-request machinery -- dependency
solving (the credential check), a ``Response`` object per request, the exception middlewares
-- which a profile at the fleet's shape put at about as much CPU as the records themselves
(docs/ingest-throughput.md).  :func:`answer_upload` does the same work with none of it: the
same credential check (:func:`iwscope.auth.dependencies.authenticate`: the cache, else one
database lookup), the same bounded body read, the same validation and store
(:func:`store_upload`, which the FastAPI routes call too, for clients that reach them through a
``root_path``, and which gives the OpenAPI document its two operations), the same answers
byte for byte (401 with ``WWW-Authenticate``, 413, 403/422 naming each record, 503 with
``Retry-After``), inside :class:`iwscope.admission.Admission` and the request metrics, which
see it as the route it answers for.

Decoding and storing run in the group commit of :mod:`iwscope.trials.writer`: the uploads that
arrive while a group is being stored are checked and stored together, one thread hop, one
database slot and one transaction per group.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import anyio
import orjson
import sqlalchemy.exc
from anyio.lowlevel import RunVar
from fastapi import HTTPException
from fastapi.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from iwprobe import wire
from iwscope.auth.dependencies import Identity, IdentityKind, authenticate, bearer_credential
from iwscope.config import get_settings
from iwscope.dbslots import DatabaseBusy
from iwscope.http import database_busy_response, header, read_body_limited, send_json
from iwscope.metrics import DB_BUSY
from iwscope.probes import schedule_cache
from iwscope.probes import services as probe_services
from iwscope.trials import services, validation, writer
from iwscope.worker_client import queue_join

log = logging.getLogger(__name__)

TRIALS_PATH = wire.TRIALS_BATCH_PATH
OBSERVATIONS_PATH = wire.OBSERVATIONS_BATCH_PATH


@dataclass
class UploadAnswer:
    """What an upload is answered (status and JSON body) and the trials whose join is then asked for."""

    status: int
    body: bytes
    #: Trials whose join to ask for after answering; ``None``: no join (``[]`` still asks the
    #: worker's drain to run, which folds in new path samples).
    join_ids: list[str] | None = None


#: Per upload kind: the identity kind it needs, what checks its body, its metric's record kind.
_KINDS: dict[str, tuple[IdentityKind, writer.Validate, str]] = {
    TRIALS_PATH: ("probe", validation.validate_trial_batch, "trial"),
    OBSERVATIONS_PATH: ("origin", validation.validate_observation_batch, "observation"),
}
#: The paths :func:`answer_upload` answers.
UPLOAD_PATHS = frozenset(_KINDS)


async def store_upload(path: str, identity: Identity, body: bytes) -> UploadAnswer:
    """Check and store one upload's body (all or nothing) with the uploads arriving meanwhile
    (:mod:`iwscope.trials.writer`: one database slot, one thread hop and one commit per group); the answer.

    A refused batch is answered 403/422 with every refused record named and stores nothing;
    :class:`iwscope.dbslots.DatabaseBusy` propagates (the caller answers 503)."""
    _, validate, record_kind = _KINDS[path]
    try:
        result = await writer.group_writer().store(validate, body, identity.id, observations=path == OBSERVATIONS_PATH)
    except validation.BatchRejected as error:
        services.count_rejected(record_kind, max(1, len(error.errors)))
        return UploadAnswer(error.status_code, orjson.dumps({"detail": error.detail()}))
    answer: dict[str, object] = {"batch_id": result.batch_id, "accepted": result.accepted, "duplicates": result.duplicates}
    if path == TRIALS_PATH and result.wire_version is not None:
        answer["schedule_etag"] = await schedule_etag_or_unsaid(identity, result.wire_version)
    # Anything new asks for the worker's drain, whose refresh folds it into the roll-ups; only
    # observations also ask for their trials' join (a trial is joined at write when its
    # observation came first, else by the observation's request: services._STORE_GROUP).
    join_ids = result.new_trial_ids or None
    if path == TRIALS_PATH:
        join_ids = [] if result.accepted else None
    return UploadAnswer(200, orjson.dumps(answer), join_ids)


async def schedule_etag_or_unsaid(probe: Identity, wire_version: int) -> str:
    """:func:`current_schedule_etag`, or ``""`` (not said: the probe polls as before) when the
    schedules' snapshot is being read by another request (:class:`schedule_cache.BeingRead`: no
    upload waits for it) or its read finds the database busy.  The upload is stored by then, so
    it must be answered 200: a 503 would tell the probe its records were not kept while they
    were (the clean-clone run's tiny-pool test caught 300 trials stored behind a 503)."""
    try:
        return await current_schedule_etag(probe, wire_version, wait=False)
    except (schedule_cache.BeingRead, DatabaseBusy, sqlalchemy.exc.TimeoutError) as error:
        log.debug("schedule ETag not said: %r", error)
        return ""


async def current_schedule_etag(probe: Identity, wire_version: int, *, wait: bool = True) -> str:
    """The ETag the probe's schedule has now (what ``GET .../schedule?wire_version=`` would
    answer), sent with each trial upload's answer: a probe whose cached schedule has this ETag
    need not ask (one request of three per probe cycle at the fleet's shape)."""
    settings = get_settings()
    snapshot, now = await schedule_cache.current_snapshot(settings, wait=wait)
    return probe_services.schedule_etag(snapshot, probe, settings.schedule_poll_s, now, wire_version)


async def answer_upload(path: str, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one upload (``path``: :data:`TRIALS_PATH` or :data:`OBSERVATIONS_PATH`) as its
    FastAPI route would, without FastAPI (:class:`iwscope.hotpaths.HotPaths` calls it)."""
    identity_kind = _KINDS[path][0]
    try:
        identity = await authenticate((identity_kind,), bearer_credential(header(scope, b"authorization")))
        body = await read_body_limited(Request(scope, receive))
        answer = await store_upload(path, identity, body)
    except HTTPException as error:
        await send_json(send, error.status_code, orjson.dumps({"detail": error.detail}), error.headers)
        return
    except (DatabaseBusy, sqlalchemy.exc.TimeoutError) as error:
        if isinstance(error, sqlalchemy.exc.TimeoutError):
            DB_BUSY.labels("pool").inc()
            log.warning("answered 503: %s", error)
        busy = database_busy_response(get_settings().retry_after_s)
        await send_json(send, busy.status_code, bytes(busy.body), {"Retry-After": busy.headers["retry-after"]})
        return
    await send_json(send, answer.status, answer.body)
    # After the answer went out (the probe does not wait on the broker): the worker gets IDs.
    if answer.join_ids is not None:
        await ask_join(answer.join_ids)


#: How long the first upload of a window waits for others before asking for their joins in one message.
JOIN_WINDOW_S = 0.05
#: How long a drain asked for without ids (trial uploads: their trials were joined at write, or
#: wait for their observations) waits for other asks: it only folds new trials into the roll-ups.
REFRESH_WINDOW_S = 1.0
#: Trial ids kept for the next window while Redis is down (about 50 bytes each).
JOIN_MAX_KEPT = 200_000


class JoinBatcher:
    """The joins asked for by the uploads of ``window_s``, sent to the worker as one message.

    One Redis round trip (and one thread hop) per upload was 3 % of the API's CPU at the fleet's
    shape; the worker's drain joins whatever is pending in one statement anyway.  The first
    upload of a window waits ``window_s`` after its answer went out, then sends every id added
    meanwhile; the others only append.  Ids Redis did not take (it is down) are kept, at most
    ``max_kept``, and sent with the next window's: after a Redis restart the joins of what was
    stored meanwhile are asked for with the first upload, not at the beat's next sweep (up to a
    minute later).  A process stopped meanwhile finishes the wait (uvicorn lets requests end);
    one killed loses its window, which the beat's sweep makes good.

    An ask without ids (a trial upload: nothing to join, only new trials for the drain's refresh
    of the roll-ups) waits for ``refresh_window_s`` in a task of its own, not in its request,
    and sends its message only if no window with ids sent one meanwhile (any message queues the
    drain).  A 50 ms window for those was a Redis round trip and a thread hop up to 20 times a
    second per process: 9.3 % of py-spy's busy samples of the API at the fleet's shape
    (docs/ingest-throughput.md, 2026-12-02).
    A process stopped within the wait loses the ask; the beat's refresh a minute later folds
    the trials in."""

    def __init__(
        self, window_s: float = JOIN_WINDOW_S, max_kept: int = JOIN_MAX_KEPT, refresh_window_s: float = REFRESH_WINDOW_S
    ) -> None:
        self.window_s = window_s
        self.max_kept = max_kept
        self.refresh_window_s = refresh_window_s
        self._pending: list[str] | None = None
        #: Ids of earlier windows Redis did not take.
        self._kept: list[str] = []
        #: Messages sent (or tried) so far: a refresh ask sends none if another went meanwhile.
        self._messages = 0
        self._refresh: asyncio.Task[None] | None = None

    async def add(self, trial_ids: list[str]) -> None:
        if not trial_ids:
            self._ask_refresh()
            return
        if self._pending is not None:
            self._pending.extend(trial_ids)
            return
        self._pending = list(trial_ids)
        try:
            await anyio.sleep(self.window_s)
        finally:
            pending, self._pending = self._kept + self._pending, None
            self._kept = []
            await self._send(pending)

    def _ask_refresh(self) -> None:
        if self._pending is None and self._refresh is None:  # else a message goes soon anyway
            self._refresh = asyncio.get_running_loop().create_task(self._refresh_later(self._messages))

    async def _refresh_later(self, messages_before: int) -> None:
        try:
            await asyncio.sleep(self.refresh_window_s)
        finally:
            self._refresh = None
        if self._messages == messages_before:
            pending, self._kept = self._kept, []
            await self._send(pending)

    async def _send(self, pending: list[str]) -> None:
        self._messages += 1
        if not await run_in_threadpool(queue_join, pending):
            # Newest kept when over the bound: the sweep joins the rest.
            self._kept = pending[-self.max_kept :] if self.max_kept else []


_JOIN_BATCHER: RunVar[JoinBatcher] = RunVar("iwscope_join_batcher")


async def ask_join(trial_ids: list[str]) -> None:
    """Ask for the join of ``trial_ids`` through this event loop's :class:`JoinBatcher` (after the answer went out)."""
    try:
        batcher = _JOIN_BATCHER.get()
    except LookupError:
        batcher = JoinBatcher()
        _JOIN_BATCHER.set(batcher)
    await batcher.add(trial_ids)


__all__ = [
    "OBSERVATIONS_PATH",
    "REFRESH_WINDOW_S",
    "TRIALS_PATH",
    "UPLOAD_PATHS",
    "JoinBatcher",
    "UploadAnswer",
    "answer_upload",
    "ask_join",
    "store_upload",
]

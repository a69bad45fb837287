"""The two upload routes' hot path: ``POST /api/v1/trials/batch`` and ``/api/v1/observations/batch``
answered by a plain ASGI layer in front of FastAPI's router.

Every probe and origin upload went through FastAPI's per-request machinery -- dependency
solving (the credential check), a ``Response`` object per request, the exception middlewares
-- which a profile at the fleet's shape put at about as much CPU as the records themselves
(docs/ingest-throughput.md).  :class:`UploadFastPath` does the same work with none of it: the
same credential check (:func:`iwscope.auth.dependencies.authenticate`: the cache, else one
database lookup), the same bounded body read, the same validation and store
(:func:`store_upload`, which the FastAPI routes call too, for clients that reach them through a
``root_path``, and which gives the OpenAPI document its two operations), the same answers
byte for byte (401 with ``WWW-Authenticate``, 413, 403/422 naming each record, 503 with
``Retry-After``), and it sits inside :class:`iwscope.admission.Admission` and the request
metrics, which see it as the route it answers for.

Decoding and storing run in one thread hop (:func:`iwscope.dbslots.run_db`): a batch holds a
database slot while it is checked, but no connection -- the connection is taken only to store.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import anyio
import orjson
import sqlalchemy.exc
from anyio.lowlevel import RunVar
from fastapi import HTTPException
from fastapi.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from iwscope.auth.dependencies import Identity, IdentityKind, authenticate, bearer_credential
from iwscope.config import get_settings
from iwscope.db import get_engine
from iwscope.dbslots import DatabaseBusy, run_db
from iwscope.http import database_busy_response, read_body_limited
from iwscope.metrics import DB_BUSY
from iwscope.trials import services, validation
from iwscope.worker_client import queue_join

log = logging.getLogger(__name__)

TRIALS_PATH = "/api/v1/trials/batch"
OBSERVATIONS_PATH = "/api/v1/observations/batch"


@dataclass
class UploadAnswer:
    """What an upload is answered (status and JSON body) and the trials whose join is then asked for."""

    status: int
    body: bytes
    #: Trials whose join to ask for after answering; ``None``: no join (``[]`` still asks the
    #: worker's drain to run, which folds in new path samples).
    join_ids: list[str] | None = None


def _validate_and_store_trials(body: bytes, identity_id: uuid.UUID) -> services.IngestResult:
    batch = validation.validate_trial_batch(body, identity_id)
    return services.store_trial_batch(get_engine(), batch, identity_id)


def _validate_and_store_observations(body: bytes, identity_id: uuid.UUID) -> services.IngestResult:
    batch = validation.validate_observation_batch(body, identity_id)
    return services.store_observation_batch(get_engine(), batch, identity_id)


#: Per upload kind: the identity kind it needs, what checks and stores its body, its metric's record kind.
_KINDS: dict[str, tuple[IdentityKind, Callable[[bytes, uuid.UUID], services.IngestResult], str]] = {
    TRIALS_PATH: ("probe", _validate_and_store_trials, "trial"),
    OBSERVATIONS_PATH: ("origin", _validate_and_store_observations, "observation"),
}


async def store_upload(path: str, identity: Identity, body: bytes) -> UploadAnswer:
    """Check and store one upload's body (all or nothing) in one database slot; the answer.

    A refused batch is answered 403/422 with every refused record named and stores nothing;
    :class:`iwscope.dbslots.DatabaseBusy` propagates (the caller answers 503)."""
    _, store, record_kind = _KINDS[path]
    try:
        result = await run_db(store, body, identity.id)
    except validation.BatchRejected as error:
        services.count_rejected(record_kind, max(1, len(error.errors)))
        return UploadAnswer(error.status_code, orjson.dumps({"detail": error.detail()}))
    # Only new trials (or, for probes, path samples: the drain's refresh folds them in) ask for a join.
    asks_join = result.accepted if path == TRIALS_PATH else bool(result.new_trial_ids)
    return UploadAnswer(
        200,
        orjson.dumps({"batch_id": result.batch_id, "accepted": result.accepted, "duplicates": result.duplicates}),
        result.new_trial_ids if asks_join else None,
    )


async def _send(send: Send, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
    raw_headers = [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
    raw_headers.extend((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in (headers or {}).items())
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


class _RouteLabel:
    """What :class:`iwscope.api.RequestMetrics` reads of ``scope["route"]``: the route template."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path


_LABELS = {path: _RouteLabel(path) for path in _KINDS}


class UploadFastPath:
    """ASGI layer answering the two upload routes itself; every other request goes to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path") if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path") else None
        kind = _KINDS.get(path) if path is not None else None
        if path is None or kind is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = _LABELS[path]
        identity_kind = kind[0]
        try:
            identity = await authenticate((identity_kind,), bearer_credential(_header(scope, b"authorization")))
            body = await read_body_limited(Request(scope, receive))
            answer = await store_upload(path, identity, body)
        except HTTPException as error:
            await _send(send, error.status_code, orjson.dumps({"detail": error.detail}), error.headers)
            return
        except (DatabaseBusy, sqlalchemy.exc.TimeoutError) as error:
            if isinstance(error, sqlalchemy.exc.TimeoutError):
                DB_BUSY.labels("pool").inc()
                log.warning("answered 503: %s", error)
            busy = database_busy_response(get_settings().retry_after_s)
            await _send(send, busy.status_code, bytes(busy.body), {"Retry-After": busy.headers["retry-after"]})
            return
        await _send(send, answer.status, answer.body)
        # After the answer went out (the probe does not wait on the broker): the worker gets IDs.
        if answer.join_ids is not None:
            await ask_join(answer.join_ids)


#: How long the first upload of a window waits for others before asking for their joins in one message.
JOIN_WINDOW_S = 0.05


class JoinBatcher:
    """The joins asked for by the uploads of ``window_s``, sent to the worker as one message.

    One Redis round trip (and one thread hop) per upload was 3 % of the API's CPU at the fleet's
    shape; the worker's drain joins whatever is pending in one statement anyway.  The first
    upload of a window waits ``window_s`` after its answer went out, then sends every id added
    meanwhile; the others only append.  A process stopped meanwhile finishes the wait (uvicorn
    lets requests end); one killed loses the message, which the beat's sweep makes good, as
    when Redis is down (:func:`iwscope.worker_client.queue_join`)."""

    def __init__(self, window_s: float = JOIN_WINDOW_S) -> None:
        self.window_s = window_s
        self._pending: list[str] | None = None

    async def add(self, trial_ids: list[str]) -> None:
        if self._pending is not None:
            self._pending.extend(trial_ids)
            return
        self._pending = list(trial_ids)
        try:
            await anyio.sleep(self.window_s)
        finally:
            pending, self._pending = self._pending, None
            await run_in_threadpool(queue_join, pending)


_JOIN_BATCHER: RunVar[JoinBatcher] = RunVar("iwscope_join_batcher")


async def ask_join(trial_ids: list[str]) -> None:
    """Ask for the join of ``trial_ids`` through this event loop's :class:`JoinBatcher` (after the answer went out)."""
    try:
        batcher = _JOIN_BATCHER.get()
    except LookupError:
        batcher = JoinBatcher()
        _JOIN_BATCHER.set(batcher)
    await batcher.add(trial_ids)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


__all__ = ["OBSERVATIONS_PATH", "TRIALS_PATH", "JoinBatcher", "ask_join", "UploadAnswer", "UploadFastPath", "store_upload"]

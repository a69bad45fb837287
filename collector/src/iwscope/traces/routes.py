"""``POST /api/v1/traces/batch`` (probes and origins upload trial traces) and
``GET /api/v1/trials/{trial_id}/traces`` (a trial's traces with its twins').

The upload is a trial batch's sibling (body limit, all or nothing, 403 for what another agent
captured, idempotent, 503 + ``Retry-After`` when the database is busy) with its own record
limit (``wire.MAX_TRACES_PER_BATCH``: a trace is ~50-100 times a trial).  It takes either
end's credential: a probe uploads what it received, an origin what it sent.  The read is
public like the trials it draws on (``/api/v1/trials.csv``, the analysis routes), within the
readers' share of the database.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from iwprobe import wire
from iwscope.auth.dependencies import ProbeOrOriginDep
from iwscope.db import get_engine, get_sessionmaker
from iwscope.dbslots import run_db
from iwscope.http import read_body_limited
from iwscope.openapi import wire_component_ref
from iwscope.traces import services, validation
from iwscope.traces.schemas import TrialTracesOut
from iwscope.trials.schemas import UploadResultOut
from iwscope.trials.services import count_rejected
from iwscope.trials.validation import BatchRejected

router = APIRouter(prefix="/api/v1", tags=["traces"])

_BATCH_RESPONSES: dict[int | str, dict[str, Any]] = {
    403: {
        "description": "agent_id not the credential's, or traces of the other end of the connection "
        "(a probe uploads receiver traces, an origin sender traces), each named; nothing stored"
    },
    413: {"description": "body over MAX_BODY_BYTES or more than MAX_TRACES_PER_BATCH traces"},
    422: {
        "description": "invalid traces (schema, the trace check's one-line reason, instants), each named by "
        "index and trial; nothing stored"
    },
}


@router.post(
    wire.TRACES_BATCH_PATH.removeprefix("/api/v1"),
    response_model=UploadResultOut,
    responses=_BATCH_RESPONSES,
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": wire_component_ref("TraceBatch")}}}}
    },
)
async def upload_traces(request: Request, agent: ProbeOrOriginDep) -> Any:
    """Store a ``TraceBatch`` of the authenticated probe (receiver side) or origin (sender side):
    all or nothing; a trace of a trial and side stored before is counted as a duplicate and
    never overwritten.  No connection is held while the body streams in, is checked or is
    compressed."""
    body = await read_body_limited(request)
    try:
        rows = await run_in_threadpool(validation.validate_trace_batch, body, agent.kind, agent.id)
    except BatchRejected as error:
        count_rejected("trace", max(1, len(error.errors)))
        return JSONResponse(status_code=error.status_code, content={"detail": error.detail()})
    result = await run_db(services.store_trace_batch, get_engine(), rows)
    return UploadResultOut(batch_id=result.batch_id, accepted=result.accepted, duplicates=result.duplicates)


def _read(trial_id: uuid.UUID) -> TrialTracesOut | None:
    with get_sessionmaker()() as session:  # closed (connection returned) in this thread
        return services.read_trial_traces(session, trial_id)


@router.get(
    "/trials/{trial_id}/traces",
    response_model=TrialTracesOut,
    responses={
        404: {"description": "no such trial"},
        503: {"description": "database busy: retry after Retry-After seconds"},
    },
)
async def get_trial_traces(trial_id: uuid.UUID) -> TrialTracesOut:
    """A trial with its traces (``receiver``: the probe's capture, ``sender``: the origin's)
    and its twins -- the other arms of the same round, size and path -- with theirs, ordered by
    ``arm_iw``; 404 when no such trial was uploaded (its traces alone do not make one)."""
    found = await run_db(_read, trial_id, read=True)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail="no such trial")
    return found

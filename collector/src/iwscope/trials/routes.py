"""``/api/v1/trials/batch``, ``/api/v1/observations/batch``, ``/api/v1/trials.csv``."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, BackgroundTasks, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse

from iwscope.analysis.filters import SINCE_DESCRIPTION, UNTIL_DESCRIPTION, Filters
from iwscope.analysis.raw import FULL_CSV, iter_trials_csv
from iwscope.auth.dependencies import OriginDep, ProbeDep
from iwscope.db import get_engine
from iwscope.dbslots import run_db
from iwscope.http import read_body_limited
from iwscope.openapi import wire_component_ref
from iwscope.streaming import stream_read
from iwscope.trials import services, validation
from iwscope.trials.schemas import UploadResultOut
from iwscope.wiretypes import BIGINT_MAX
from iwscope.worker_client import queue_join

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api/v1", tags=["trials"])

_BATCH_RESPONSES: dict[int | str, dict[str, Any]] = {
    403: {"description": "records of another probe/origin (each named); nothing stored"},
    413: {"description": "body over MAX_BODY_BYTES or more than MAX_BATCH_RECORDS records"},
    422: {"description": "invalid records, each named by section, index, id and field; nothing stored"},
}


def _rejected(error: validation.BatchRejected, kind: str, body_records: int) -> JSONResponse:
    services.count_rejected(kind, body_records)
    return JSONResponse(status_code=error.status_code, content={"detail": error.detail()})


@router.post(
    "/trials/batch",
    response_model=UploadResultOut,
    responses=_BATCH_RESPONSES,
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": wire_component_ref("TrialBatch")}}}}
    },
)
async def upload_trials(request: Request, probe: ProbeDep, background_tasks: BackgroundTasks) -> Any:
    """Store a ``TrialBatch`` (all or nothing; records already stored are skipped as duplicates).

    No connection is held while the body streams in or is validated: authentication returned
    its connection already, and the batch gets a database slot only once it is valid."""
    body = await read_body_limited(request)
    probe_id = probe.id
    try:
        batch = await run_in_threadpool(validation.validate_trial_batch, body, probe_id)
        result = await run_db(services.store_trial_batch, get_engine(), batch, probe_id)
    except validation.BatchRejected as error:
        return _rejected(error, "trial", max(1, len(error.errors)))
    # Only after the commit, and after the answer went out (the probe does not wait on the
    # broker): the worker gets IDs, never objects.
    if result.accepted:  # new trials or path samples (the drain's refresh folds the samples in)
        background_tasks.add_task(queue_join, result.new_trial_ids)
    # An ``UploadResultOut`` (the documented response_model), serialised directly.
    return Response(
        orjson.dumps({"batch_id": result.batch_id, "accepted": result.accepted, "duplicates": result.duplicates}),
        media_type="application/json",
        background=background_tasks,
    )


@router.post(
    "/observations/batch",
    response_model=UploadResultOut,
    responses=_BATCH_RESPONSES,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": wire_component_ref("ObservationBatch")}}},
        }
    },
)
async def upload_observations(request: Request, origin: OriginDep) -> Any:
    """Store an ``ObservationBatch`` from the authenticated origin."""
    body = await read_body_limited(request)
    origin_id = origin.id
    try:
        batch = await run_in_threadpool(validation.validate_observation_batch, body, origin_id)
        result = await run_db(services.store_observation_batch, get_engine(), batch, origin_id)
    except validation.BatchRejected as error:
        return _rejected(error, "observation", max(1, len(error.errors)))
    if result.new_trial_ids:
        await run_in_threadpool(queue_join, result.new_trial_ids)
    return UploadResultOut(batch_id=result.batch_id, accepted=result.accepted, duplicates=result.duplicates)


@router.get(
    "/trials.csv",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/csv": {}}, "description": "trials as CSV, streamed"},
        503: {"description": "database busy: retry after Retry-After seconds"},
    },
)
async def export_trials_csv(
    campaign_id: Annotated[int | None, Query(ge=1, le=BIGINT_MAX)] = None,
    probe_id: uuid.UUID | None = None,
    since: Annotated[dt.datetime | None, Query(description=SINCE_DESCRIPTION)] = None,
    until: Annotated[dt.datetime | None, Query(description=UNTIL_DESCRIPTION)] = None,
) -> StreamingResponse:
    """Trials matching the filters as CSV, every column of ``trials`` (public; streamed, constant
    memory; within the public reads' share of the database, see :mod:`iwscope.streaming`).
    Written by :mod:`iwscope.analysis.raw`, like ``/api/v1/analysis/trials.csv``."""
    filters = Filters(campaign_ids=() if campaign_id is None else (campaign_id,), since=since, until=until)
    return await stream_read(
        lambda session: iter_trials_csv(session, filters, layout=FULL_CSV, probe_id=probe_id),
        "text/csv",
        {"Content-Disposition": 'attachment; filename="trials.csv"'},
    )

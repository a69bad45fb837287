"""``/api/v1/trials/batch``, ``/api/v1/observations/batch``, ``/api/v1/trials.csv``."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Query, Request
from fastapi.responses import Response, StreamingResponse

from iwscope.analysis.filters import SINCE_DESCRIPTION, UNTIL_DESCRIPTION, Filters
from iwscope.analysis.raw import FULL_CSV, iter_trials_csv
from iwscope.auth.dependencies import Identity, OriginDep, ProbeDep
from iwscope.http import read_body_limited
from iwscope.openapi import wire_component_ref
from iwscope.streaming import stream_read
from iwscope.trials import ingest
from iwscope.trials.schemas import TrialUploadResultOut, UploadResultOut
from iwscope.wiretypes import BIGINT_MAX

router = APIRouter(prefix="/api/v1", tags=["trials"])

_BATCH_RESPONSES: dict[int | str, dict[str, Any]] = {
    403: {"description": "records of another probe/origin (each named); nothing stored"},
    413: {"description": "body over MAX_BODY_BYTES or more than MAX_BATCH_RECORDS records"},
    422: {"description": "invalid records, each named by section, index, id and field; nothing stored"},
}


async def _answered(upload: str, request: Request, identity: Identity, background_tasks: BackgroundTasks) -> Response:
    """The FastAPI route's answer: the same :func:`ingest.store_upload` as the fast path."""
    answer = await ingest.store_upload(upload, identity, await read_body_limited(request))
    if answer.join_ids is not None:
        background_tasks.add_task(ingest.ask_join, answer.join_ids)
    return Response(answer.body, status_code=answer.status, media_type="application/json", background=background_tasks)


@router.post(
    "/trials/batch",
    response_model=TrialUploadResultOut,
    responses=_BATCH_RESPONSES,
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": wire_component_ref("TrialBatch")}}}}
    },
)
async def upload_trials(request: Request, probe: ProbeDep, background_tasks: BackgroundTasks) -> Any:
    """Store a ``TrialBatch`` (all or nothing; records already stored are skipped as duplicates).

    Answered by :class:`iwscope.hotpaths.HotPaths` before FastAPI's router; this
    route (the same checks and store) documents it and serves requests under a ``root_path``.
    No connection is held while the body streams in or is validated."""
    return await _answered(ingest.TRIALS_PATH, request, probe, background_tasks)


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
async def upload_observations(request: Request, origin: OriginDep, background_tasks: BackgroundTasks) -> Any:
    """Store an ``ObservationBatch`` from the authenticated origin (answered like the trials)."""
    return await _answered(ingest.OBSERVATIONS_PATH, request, origin, background_tasks)


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

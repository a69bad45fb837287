"""``/api/v1/passive``: uploads of ``iwprobe tap`` servers and reads of what they measured.

The upload is a trial batch's sibling (body and record limits, all or nothing, 403 for another
server's records, idempotent, 503 + ``Retry-After`` when the database is busy).  The reads are
not public like the probes' data: real users of operators' servers are behind them, so they
need a ``read`` (or ``admin``) token.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from iwscope.analysis.filters import SINCE_DESCRIPTION, UNTIL_DESCRIPTION
from iwscope.auth.dependencies import ReaderDep, ServerDep
from iwscope.db import get_engine
from iwscope.dbslots import run_db
from iwscope.exports.columnar import ExportFilters, iter_parquet
from iwscope.exports.routes import PARQUET_MEDIA_TYPE
from iwscope.http import read_body_limited
from iwscope.openapi import wire_component_ref
from iwscope.passive import services, validation
from iwscope.passive.exports import PASSIVE_TABLES
from iwscope.streaming import stream_read
from iwscope.trials.schemas import UploadResultOut
from iwscope.trials.services import count_rejected
from iwscope.trials.validation import BatchRejected
from iwscope.wiretypes import BIGINT_MAX

router = APIRouter(prefix="/api/v1/passive", tags=["passive"])

_BATCH_RESPONSES: dict[int | str, dict[str, Any]] = {
    403: {"description": "records of another server (each named); nothing stored"},
    413: {"description": "body over MAX_BODY_BYTES or more than MAX_BATCH_RECORDS records"},
    422: {
        "description": "invalid records (schema, relations, a campaign that is not a passive campaign of this "
        "server), each named by section, index, id and field; nothing stored"
    },
}


@router.post(
    "/batch",
    response_model=UploadResultOut,
    responses=_BATCH_RESPONSES,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": wire_component_ref("PassiveBatch")}}},
        }
    },
)
async def upload(request: Request, server: ServerDep) -> Any:
    """Store a ``PassiveBatch`` of the authenticated server (all or nothing; records stored
    before are counted as duplicates and never overwritten); its heartbeat updates the fleet
    listing.  No connection is held while the body streams in or is validated."""
    body = await read_body_limited(request)
    try:
        batch = await run_in_threadpool(validation.validate_passive_batch, body, server.id)
        result = await run_db(services.store_passive_batch, get_engine(), batch, server.id)
    except BatchRejected as error:
        count_rejected("passive", max(1, len(error.errors)))
        return JSONResponse(status_code=error.status_code, content={"detail": error.detail()})
    return UploadResultOut(batch_id=result.batch_id, accepted=result.accepted, duplicates=result.duplicates)


@router.get(
    "/{table}.parquet",
    response_class=StreamingResponse,
    responses={
        200: {"content": {PARQUET_MEDIA_TYPE: {}}, "description": "the rows as Parquet, streamed"},
        401: {"description": "no read or admin token"},
        503: {"description": "database busy: retry after Retry-After seconds"},
    },
)
async def export_parquet(
    table: Literal["aggregates", "connections"],
    _reader: ReaderDep,
    campaign_id: Annotated[int | None, Query(ge=1, le=BIGINT_MAX)] = None,
    server_id: uuid.UUID | None = None,
    since: Annotated[dt.datetime | None, Query(description=SINCE_DESCRIPTION)] = None,
    until: Annotated[dt.datetime | None, Query(description=UNTIL_DESCRIPTION)] = None,
) -> StreamingResponse:
    """``passive_aggregates`` (window on ``hour``) or ``passive_connections`` (window on
    ``closed_at``) as one Parquet file, typed as the public exports (``int[]`` histogram arrays
    and ``tcp_info`` as JSON text); needs a ``read`` or ``admin`` token."""
    spec = PASSIVE_TABLES[table]
    filters = ExportFilters(campaign_id=campaign_id, server_id=server_id, since=since, until=until)
    return await stream_read(
        lambda session: iter_parquet(session, spec, filters),
        PARQUET_MEDIA_TYPE,
        {"Content-Disposition": f'attachment; filename="passive_{table}.parquet"'},
    )

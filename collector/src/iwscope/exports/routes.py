"""``GET /api/v1/{trials,observations,path_estimates,campaigns,census,traces}.parquet``: the
tables as Parquet, streamed in row groups (public reads, within the readers' share of the
database, as the CSV export; :mod:`iwscope.exports.columnar` says what each holds, and
:mod:`iwscope.exports.traces` what the traces export does)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import StreamingResponse

from iwscope.analysis.filters import SINCE_DESCRIPTION, UNTIL_DESCRIPTION
from iwscope.exports.columnar import TABLES, ExportFilters, iter_parquet, select_sql
from iwscope.exports.traces import TRACES, iter_traces_parquet
from iwscope.streaming import stream_read
from iwscope.wiretypes import BIGINT_MAX

router = APIRouter(prefix="/api/v1", tags=["exports"])

#: Media type of a Parquet file (IANA registration, 2024).
PARQUET_MEDIA_TYPE = "application/vnd.apache.parquet"
TableName = Literal["trials", "observations", "path_estimates", "campaigns", "census", "traces"]


@router.get(
    "/{table}.parquet",
    response_class=StreamingResponse,
    responses={
        200: {"content": {PARQUET_MEDIA_TYPE: {}}, "description": "the rows as Parquet, streamed"},
        422: {"description": "a filter this table does not have"},
        503: {"description": "database busy: retry after Retry-After seconds"},
    },
)
async def export_parquet(
    table: TableName,
    campaign_id: Annotated[int | None, Query(ge=1, le=BIGINT_MAX)] = None,
    probe_id: uuid.UUID | None = None,
    origin_id: uuid.UUID | None = None,
    since: Annotated[dt.datetime | None, Query(description=SINCE_DESCRIPTION)] = None,
    until: Annotated[dt.datetime | None, Query(description=UNTIL_DESCRIPTION)] = None,
) -> StreamingResponse:
    """A table's rows as one Parquet file (zstd; typed columns, timestamps in UTC, JSON as text).
    ``trials``: the filters of ``/api/v1/trials.csv``; ``observations``: campaign, origin and the
    window on ``request_at``; ``path_estimates``: campaign and probe; ``campaigns``: campaign;
    ``census``: campaign, probe and the window on ``measured_at``; ``traces``: one row per
    trial trace, its packets as ``list<int64>`` columns, filters campaign, probe and origin (the
    trial's) and the window on ``captured_at``."""
    filters = ExportFilters(campaign_id=campaign_id, probe_id=probe_id, origin_id=origin_id, since=since, until=until)
    headers = {"Content-Disposition": f'attachment; filename="{table}.parquet"'}
    if table == TRACES:
        return await stream_read(lambda session: iter_traces_parquet(session, filters), PARQUET_MEDIA_TYPE, headers)
    spec = TABLES[table]
    try:
        select_sql(spec, filters)
    except ValueError as error:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(error)) from None
    return await stream_read(lambda session: iter_parquet(session, spec, filters), PARQUET_MEDIA_TYPE, headers)

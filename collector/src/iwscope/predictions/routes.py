"""``POST /api/v1/campaigns/{campaign_id}/twin-predictions`` (admin: store a lab twin's result)
and ``GET /api/v1/analysis/twin-predictions`` (read, like every analysis route).

The upload is what ``iwscope lab twin`` stores (it writes through the same check,
:class:`~iwscope.predictions.schemas.TwinResultIn`, when it has the campaign's database); the
route is for a twin run elsewhere.  All or nothing: a refused result stores nothing (422 with
the reasons; 404 for a campaign this collector does not have); the same result again is a
duplicate (200, the first one's id).  Every read says ``kind: prediction``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from iwscope.auth.dependencies import AdminDep
from iwscope.campaigns.models import Campaign
from iwscope.campaigns.routes import CampaignIdPath
from iwscope.db import session_scope
from iwscope.dbslots import run_db
from iwscope.http import read_body_limited
from iwscope.predictions import services
from iwscope.predictions.schemas import TwinPredictionsOut, TwinPredictionStored, TwinResultIn
from iwscope.wiretypes import BIGINT_MAX

router = APIRouter(prefix="/api/v1", tags=["predictions"])


def _store(campaign_id: int, result: TwinResultIn) -> TwinPredictionStored | None:
    with session_scope() as session:
        if session.get(Campaign, campaign_id) is None:
            return None
        stored = services.store_twin_result(session, result)
        return TwinPredictionStored(id=stored.id, duplicate=stored.duplicate)


@router.post(
    "/campaigns/{campaign_id}/twin-predictions",
    status_code=status.HTTP_201_CREATED,
    response_model=TwinPredictionStored,
    responses={
        200: {"description": "the same result was stored before: nothing changed", "model": TwinPredictionStored},
        404: {"description": "no such campaign"},
        413: {"description": "body over MAX_BODY_BYTES"},
        422: {
            "description": "not a twin result (schema, intervals, arms, a prediction not marked as one), or its "
            "campaign_id is not the path's; nothing stored"
        },
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TwinResultIn"}}},
        }
    },
)
async def store_twin_prediction(
    campaign_id: CampaignIdPath, request: Request, response: Response, _admin: AdminDep
) -> TwinPredictionStored:
    """Store a lab twin's result (``iwscope lab twin``'s ``twin.json``, a ``TwinResultIn``) for
    the campaign it was fitted to.  The body (at most ``MAX_BODY_BYTES``) is checked in a
    thread: a result of thousands of paths must not stall the event loop (and with it, through
    the admission's lag watch, every other request)."""
    body = await read_body_limited(request)
    try:
        result = await run_in_threadpool(TwinResultIn.model_validate_json, body)
    except ValidationError as error:
        # FastAPI's own 422, as for a body it had validated itself
        errors = error.errors(include_url=False, include_context=False, include_input=False)
        raise RequestValidationError([{**item, "loc": ("body", *item["loc"])} for item in errors]) from None
    if result.campaign_id != campaign_id:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_ENTITY, detail=f"the result is of campaign {result.campaign_id}, not {campaign_id}"
        )
    stored = await run_db(_store, campaign_id, result)
    if stored is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail="no such campaign")
    if stored.duplicate:
        response.status_code = status.HTTP_200_OK
    return stored


def _read(campaign_id: int | None) -> TwinPredictionsOut:
    with session_scope() as session:
        return TwinPredictionsOut(data=services.read_twin_predictions(session, campaign_id))


@router.get(
    "/analysis/twin-predictions",
    response_model=TwinPredictionsOut,
    responses={503: {"description": "database busy: retry after Retry-After seconds"}},
)
async def get_twin_predictions(
    campaign: Annotated[int | None, Query(ge=1, le=BIGINT_MAX, description="the measured campaign; none: every campaign")] = None,
) -> TwinPredictionsOut:
    """Lab-twin predictions (newest first, at most ``MAX_LISTED``): per path and RTT bucket the
    fitted link, the fit check (measured arm beside the twins' run of it), the predicted arms
    and any held-out arm.  Predictions, not measurements: ``kind`` says so, and so does every
    predicted estimate's ``prediction``."""
    return await run_db(_read, campaign, read=True)

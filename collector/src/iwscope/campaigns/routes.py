"""``/api/v1/campaigns`` (admin token): ordinary, census and passive campaigns.

Each route does its database work in one :func:`iwscope.dbslots.run_db` call (a slot, a
thread, a session committed and closed in that thread), like the probes' routes.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, status
from sqlalchemy import select
from sqlalchemy.orm import Session

from iwscope.auth.dependencies import AdminDep
from iwscope.campaigns import services
from iwscope.campaigns.models import Campaign
from iwscope.campaigns.schemas import CampaignIn, CampaignOut, CampaignPatch
from iwscope.db import session_scope
from iwscope.dbslots import run_db
from iwscope.probes import schedule_cache
from iwscope.wiretypes import BIGINT_MAX

router = APIRouter(prefix="/api/v1/campaigns", tags=["campaigns"])

#: A campaign id in a path: a positive PostgreSQL bigint (anything else is a 422).
CampaignIdPath = Annotated[int, Path(ge=1, le=BIGINT_MAX)]


def _out(campaign: Campaign) -> CampaignOut:
    return CampaignOut.model_validate(campaign)


def _get(session: Session, campaign_id: int) -> Campaign:
    campaign = session.get(Campaign, campaign_id)
    if campaign is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail="no such campaign")
    return campaign


def _create(body: CampaignIn) -> CampaignOut:
    with session_scope() as session:
        return _out(services.create_campaign(session, body))


def _list() -> list[CampaignOut]:
    with session_scope() as session:
        return [_out(campaign) for campaign in session.scalars(select(Campaign).order_by(Campaign.id))]


def _read(campaign_id: int) -> CampaignOut:
    with session_scope() as session:
        return _out(_get(session, campaign_id))


def _update(campaign_id: int, body: CampaignPatch) -> CampaignOut:
    with session_scope() as session:
        campaign = services.update_campaign(session, _get(session, campaign_id), body)
        session.flush()
        return _out(campaign)


#: A passive campaign whose window overlaps another's on one of its servers.
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"description": "a server of this passive campaign is in another passive campaign at the same time"}
}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=CampaignOut, responses=_CONFLICT)
async def create(body: CampaignIn, _admin: AdminDep) -> CampaignOut:
    """An ordinary, census or passive campaign (``CampaignIn``); 409 when a passive campaign's
    server is in another passive campaign whose window overlaps."""
    created = await run_db(_create, body)
    schedule_cache.invalidate()  # probes asking this process see it at once
    return created


@router.get("", response_model=list[CampaignOut])
async def list_campaigns(_admin: AdminDep) -> list[CampaignOut]:
    return await run_db(_list)


@router.get("/{campaign_id}", response_model=CampaignOut)
async def get(campaign_id: CampaignIdPath, _admin: AdminDep) -> CampaignOut:
    return await run_db(_read, campaign_id)


@router.patch("/{campaign_id}", response_model=CampaignOut, responses=_CONFLICT)
async def update(campaign_id: CampaignIdPath, body: CampaignPatch, _admin: AdminDep) -> CampaignOut:
    """Change a campaign; a change of a passive campaign's ``passive_arms`` starts its next
    ``phase``; 409 when its new window or servers overlap another passive campaign's."""
    updated = await run_db(_update, campaign_id, body)
    schedule_cache.invalidate()
    return updated

"""``/api/v1/campaigns`` (admin token)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, status
from sqlalchemy import select

from iwscope.auth.dependencies import AdminDep, SessionDep
from iwscope.campaigns import services
from iwscope.campaigns.models import Campaign
from iwscope.campaigns.schemas import CampaignIn, CampaignOut, CampaignPatch
from iwscope.wiretypes import BIGINT_MAX

router = APIRouter(prefix="/api/v1/campaigns", tags=["campaigns"])

#: A campaign id in a path: a positive PostgreSQL bigint (anything else is a 422).
CampaignIdPath = Annotated[int, Path(ge=1, le=BIGINT_MAX)]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=CampaignOut)
def create(body: CampaignIn, session: SessionDep, _admin: AdminDep) -> Campaign:
    campaign = services.create_campaign(session, body)
    session.commit()
    return campaign


@router.get("", response_model=list[CampaignOut])
def list_campaigns(session: SessionDep, _admin: AdminDep) -> list[Campaign]:
    return list(session.scalars(select(Campaign).order_by(Campaign.id)))


def _get(session: SessionDep, campaign_id: int) -> Campaign:
    campaign = session.get(Campaign, campaign_id)
    if campaign is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail="no such campaign")
    return campaign


@router.get("/{campaign_id}", response_model=CampaignOut)
def get(campaign_id: CampaignIdPath, session: SessionDep, _admin: AdminDep) -> Campaign:
    return _get(session, campaign_id)


@router.patch("/{campaign_id}", response_model=CampaignOut)
def update(campaign_id: CampaignIdPath, body: CampaignPatch, session: SessionDep, _admin: AdminDep) -> Campaign:
    campaign = services.update_campaign(session, _get(session, campaign_id), body)
    session.commit()
    return campaign

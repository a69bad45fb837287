"""Campaign creation and updates."""

from __future__ import annotations

from fastapi import HTTPException, status
from sqlalchemy import select
from sqlalchemy.orm import Session

from iwscope.campaigns.models import Campaign
from iwscope.campaigns.schemas import CampaignIn, CampaignPatch
from iwscope.origins.models import Origin


def _unknown_origins(session: Session, campaign: CampaignIn) -> list[str]:
    known = set(session.scalars(select(Origin.id).where(Origin.id.in_(campaign.origin_ids))))
    return [str(origin_id) for origin_id in campaign.origin_ids if origin_id not in known]


def create_campaign(session: Session, campaign: CampaignIn) -> Campaign:
    unknown = _unknown_origins(session, campaign)
    if unknown:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            detail=[{"loc": ["body", "origin_ids"], "msg": f"unknown origins: {', '.join(unknown)}",
                                     "type": "unknown_origin"}])
    row = Campaign(**campaign.model_dump(exclude={"duration_s", "arms"}), arms=campaign.arm_iws,
                   arm_labels=None if campaign.plain_arms_only else campaign.arm_labels)
    session.add(row)
    session.flush()
    return row


def update_campaign(session: Session, campaign: Campaign, patch: CampaignPatch) -> Campaign:
    changes = patch.model_dump(exclude_unset=True)
    starts_at = changes.get("starts_at", campaign.starts_at)
    ends_at = changes.get("ends_at", campaign.ends_at)
    if ends_at is not None and ends_at <= starts_at:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            detail=[{"loc": ["body", "ends_at"], "msg": "ends_at must be after starts_at",
                                     "type": "value_error"}])
    for name, value in changes.items():
        setattr(campaign, name, value)
    session.flush()
    return campaign

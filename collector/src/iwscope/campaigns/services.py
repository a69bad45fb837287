"""Campaign creation and updates.

Passive campaigns (wire v6) are checked here against the database as well: their servers must
exist, be unrevoked and have ports to split, and no server may take part in two passive
campaigns whose windows overlap -- its agent runs one study at a time (one set of arms in the
kernel), so the second would silently not run.  That check and the write it guards run under a
transaction-level advisory lock, so two concurrent creations cannot both pass it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from fastapi import HTTPException, status
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from iwscope.campaigns.models import Campaign
from iwscope.campaigns.schemas import CampaignIn, CampaignPatch
from iwscope.origins.models import Origin
from iwscope.servers.models import Server

#: Key of the advisory lock serialising writes of passive campaigns (any fixed bigint, distinct
#: from the roll-ups' ``0x69777363_6F706531``).
PASSIVE_LOCK_KEY = 0x69777363_70617373  # "iwscpass"
#: Fields of a patch that only a passive campaign takes, and those it does not take.
_PASSIVE_PATCH = frozenset({"server_ids", "passive_arms", "sample_share", "flush_interval_s"})
_NOT_PASSIVE_PATCH = frozenset({"probe_regions", "repetitions", "interval_s"})


def _unprocessable(field: str, message: str, kind: str = "value_error") -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{"loc": ["body", field], "msg": message, "type": kind}])


def _unknown_origins(session: Session, campaign: CampaignIn) -> list[str]:
    known = set(session.scalars(select(Origin.id).where(Origin.id.in_(campaign.origin_ids))))
    return [str(origin_id) for origin_id in campaign.origin_ids if origin_id not in known]


def _check_servers(session: Session, server_ids: list[uuid.UUID], ports: list[int] | None) -> None:
    """422 naming servers that are unknown or revoked, or (without the campaign's own ports)
    that enrolled no port to split."""
    servers = {
        server.id: server
        for server in session.scalars(select(Server).where(Server.id.in_(server_ids), Server.revoked_at.is_(None)))
    }
    unknown = [str(server_id) for server_id in server_ids if server_id not in servers]
    if unknown:
        raise _unprocessable("server_ids", f"unknown or revoked servers: {', '.join(unknown)}", "unknown_server")
    portless = [str(server_id) for server_id in server_ids if not servers[server_id].ports]
    if ports is None and portless:
        raise _unprocessable("passive_ports", f"servers {', '.join(portless)} enrolled no ports: give passive_ports")


def _check_no_overlap(
    session: Session, server_ids: list[uuid.UUID], starts_at: dt.datetime, ends_at: dt.datetime, campaign_id: int | None = None
) -> None:
    """409 when a server of ``server_ids`` is in another passive campaign whose window overlaps
    ``[starts_at, ends_at)``; takes the passive campaigns' advisory lock until the commit."""
    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PASSIVE_LOCK_KEY})
    query = select(Campaign.id, Campaign.server_ids, Campaign.starts_at, Campaign.ends_at).where(
        Campaign.server_ids.overlap(server_ids), Campaign.starts_at < ends_at, Campaign.ends_at > starts_at
    )
    if campaign_id is not None:
        query = query.where(Campaign.id != campaign_id)
    clashes = session.execute(query.order_by(Campaign.id)).all()
    if clashes:
        wanted = set(server_ids)
        described = "; ".join(
            f"server {', '.join(str(server) for server in row.server_ids if server in wanted)} is in passive campaign "
            f"{row.id} from {row.starts_at.isoformat()} to {row.ends_at.isoformat()}"
            for row in clashes
        )
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail=f"passive campaigns of one server must not overlap in time: {described}"
        )


def create_campaign(session: Session, campaign: CampaignIn) -> Campaign:
    unknown = _unknown_origins(session, campaign)
    if unknown:
        raise _unprocessable("origin_ids", f"unknown origins: {', '.join(unknown)}", "unknown_origin")
    values: dict[str, Any] = campaign.model_dump(exclude={"duration_s", "arms"})
    if campaign.passive:
        assert campaign.server_ids is not None and campaign.ends_at is not None
        _check_servers(session, campaign.server_ids, campaign.passive_ports)
        _check_no_overlap(session, campaign.server_ids, campaign.starts_at, campaign.ends_at)
        values.update(calibrate=False, phase=0)
    row = Campaign(**values, arms=campaign.arm_iws, arm_labels=None if campaign.plain_arms_only else campaign.arm_labels)
    session.add(row)
    session.flush()
    return row


def update_campaign(session: Session, campaign: Campaign, patch: CampaignPatch) -> Campaign:
    if campaign.server_ids is not None:
        # Its row locked and read afresh: two share changes at once must make two phases.
        session.refresh(campaign, with_for_update=True)
    changes = patch.model_dump(exclude_unset=True)
    starts_at = changes.get("starts_at", campaign.starts_at)
    ends_at = changes.get("ends_at", campaign.ends_at)
    if ends_at is not None and ends_at <= starts_at:
        raise _unprocessable("ends_at", "ends_at must be after starts_at")
    if changes.get("trace_share") and (campaign.server_ids is not None or campaign.census_urls is not None):
        raise _unprocessable("trace_share", "only an ordinary campaign's trials are traced (not a census or passive campaign)")
    if campaign.server_ids is None:
        passive_only = sorted(_PASSIVE_PATCH & set(changes))
        if passive_only:
            raise _unprocessable(passive_only[0], f"{', '.join(passive_only)}: only a passive campaign takes them")
    else:
        _check_passive_patch(session, campaign, changes, starts_at, ends_at)
    for name, value in changes.items():
        setattr(campaign, name, value)
    session.flush()
    return campaign


def _check_passive_patch(
    session: Session, campaign: Campaign, changes: dict[str, Any], starts_at: dt.datetime, ends_at: dt.datetime | None
) -> None:
    """A patch of a passive campaign: it stays time-boxed, its servers valid and alone in their
    windows; a change of the arms or shares starts the next phase (``changes`` gets it)."""
    refused = sorted(_NOT_PASSIVE_PATCH & set(changes))
    if refused:
        raise _unprocessable(refused[0], f"a passive campaign does not take {', '.join(refused)}")
    if ends_at is None:
        raise _unprocessable("ends_at", "a passive campaign needs a time box: ends_at must not be null")
    server_ids: list[uuid.UUID] = changes.get("server_ids") or list(campaign.server_ids or [])
    if "server_ids" in changes:
        if len(set(server_ids)) != len(server_ids):
            raise _unprocessable("server_ids", "server_ids must not repeat")
        _check_servers(session, server_ids, campaign.passive_ports)
    if {"server_ids", "starts_at", "ends_at"} & set(changes):
        _check_no_overlap(session, server_ids, starts_at, ends_at, campaign.id)
    if "passive_arms" in changes:
        if changes["passive_arms"] != campaign.passive_arms:
            changes["phase"] = (campaign.phase or 0) + 1
        else:
            del changes["passive_arms"]

"""Server enrollment, the configuration a server polls, the fleet listing, heartbeats.

A server's configuration is the passive campaign that names it and is in force now
(``starts_at <= now < ends_at``), if any: unlike a probe, which is told what starts within its
next poll, a server changes its kernel's routing by what it is told, so it is told only what
holds now (and ``ends_at``, at which it removes the arms itself).  Servers are few (operators'
own machines, polling every ``IWSCOPE_SCHEDULE_POLL_S``): one indexed lookup per poll needs no
process-wide snapshot like the probes' schedules.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from iwprobe import wire
from iwscope.auth.services import format_credential, hash_secret, new_secret
from iwscope.campaigns.models import Campaign
from iwscope.passive.privacy import redact_addresses
from iwscope.passive.schemas import PassiveArmIn
from iwscope.servers.models import Server
from iwscope.servers.schemas import PassiveStudyOut, ServerConfigOut, ServerEnrollRequestIn, ServerOut


def enroll_server(session: Session, request: ServerEnrollRequestIn) -> tuple[Server, str]:
    """Create a server; returns it and its credential (the secret is not stored)."""
    secret = new_secret()
    server = Server(
        id=uuid.uuid4(),
        name=request.name,
        region=request.region,
        ports=list(request.ports),
        version=request.version,
        kernel=request.kernel,
        secret_hash=hash_secret(secret),
    )
    session.add(server)
    session.flush()
    return server, format_credential(server.id, secret)


def _study(campaign: Campaign, server_ports: list[int]) -> PassiveStudyOut | None:
    ports = list(campaign.passive_ports or server_ports)
    if not ports or campaign.ends_at is None:  # neither can pass the campaign API's checks
        return None
    return PassiveStudyOut(
        campaign_id=campaign.id,
        name=campaign.name,
        arms=[PassiveArmIn(**arm) for arm in campaign.passive_arms or []],
        ports=ports,
        prefix_v4=campaign.prefix_v4 or wire.DEFAULT_PREFIX_V4,
        prefix_v6=campaign.prefix_v6 or wire.DEFAULT_PREFIX_V6,
        assignment_seed=campaign.assignment_seed or 0,
        starts_at=wire.utc_timestamp(campaign.starts_at),
        ends_at=wire.utc_timestamp(campaign.ends_at),
        sample_share=campaign.sample_share or 0.0,
        flush_interval_s=campaign.flush_interval_s or 60,
        phase=campaign.phase or 0,
    )


def server_config(session: Session, server_id: uuid.UUID, poll_after_s: float, now: dt.datetime) -> tuple[ServerConfigOut, str]:
    """The configuration of ``server_id`` now and its ETag (a hash of everything in it but
    ``generated_at``, so an unchanged study is answered 304)."""
    ports = session.scalar(select(Server.ports).where(Server.id == server_id)) or []
    campaign = session.scalars(
        select(Campaign)
        .where(Campaign.server_ids.contains([server_id]), Campaign.starts_at <= now, Campaign.ends_at > now)
        .order_by(Campaign.starts_at.desc(), Campaign.id.desc())
        .limit(1)
    ).first()
    study = _study(campaign, list(ports)) if campaign is not None else None
    config = ServerConfigOut(
        wire_version=wire.WIRE_VERSION,
        server_id=str(server_id),
        generated_at=wire.utc_timestamp(now),
        poll_after_s=poll_after_s,
        study=study,
    )
    digest = hashlib.sha256(f"{poll_after_s!r}|".encode())
    digest.update(study.model_dump_json().encode() if study is not None else b"null")
    return config, f'"{digest.hexdigest()[:32]}"'


def server_out(server: Server) -> ServerOut:
    return ServerOut(
        id=str(server.id),
        name=server.name,
        region=server.region,
        ports=list(server.ports),
        version=server.version,
        kernel=server.kernel,
        enrolled_at=server.enrolled_at,
        last_seen_at=server.last_seen_at,
        revoked_at=server.revoked_at,
        last_heartbeat=server.last_heartbeat,
    )


def list_servers(session: Session) -> list[ServerOut]:
    return [server_out(server) for server in session.scalars(select(Server).order_by(Server.region, Server.name))]


def heartbeat_values(heartbeat: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    """The ``servers`` columns a heartbeat folded into an upload sets.  Addresses in its error
    text are redacted (:func:`iwscope.passive.privacy.redact_addresses`): the collector stores
    none, and refusing the upload over a log line would cost the server its measurements."""
    stored = {
        **heartbeat,
        "arms_state": redact_addresses(str(heartbeat.get("arms_state", ""))),
        "received_at": wire.utc_timestamp(now),
    }
    return {"last_seen_at": now, "version": heartbeat["version"], "last_heartbeat": stored}

"""Origin enrollment and listing."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from iwscope.auth.services import format_credential, hash_secret, new_secret
from iwscope.origins.models import Origin
from iwscope.origins.schemas import OriginEnrollRequestIn, OriginOut
from iwscope.probes.schemas import ArmPortModel


def enroll_origin(session: Session, request: OriginEnrollRequestIn) -> tuple[Origin, str]:
    secret = new_secret()
    origin = Origin(
        id=uuid.uuid4(),
        name=request.name,
        region=request.region,
        host=request.host,
        arms=[arm.model_dump() for arm in request.arms],
        version=request.version,
        echo_port=request.echo_port,
        tls=request.tls,
        host6=request.host6,
        secret_hash=hash_secret(secret),
    )
    session.add(origin)
    session.flush()
    return origin, format_credential(origin.id, secret)


def origin_out(origin: Origin) -> OriginOut:
    return OriginOut(
        id=str(origin.id),
        name=origin.name,
        region=origin.region,
        host=origin.host,
        arms=[ArmPortModel(**arm) for arm in origin.arms],
        echo_port=origin.echo_port,
        tls=origin.tls,
        host6=origin.host6,
        version=origin.version,
        enrolled_at=origin.enrolled_at,
        last_seen_at=origin.last_seen_at,
        revoked_at=origin.revoked_at,
    )


def list_origins(session: Session) -> list[OriginOut]:
    return [origin_out(origin) for origin in session.scalars(select(Origin).order_by(Origin.region, Origin.name))]

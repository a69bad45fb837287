"""``/api/v1/probes``: enrollment, heartbeat, schedule, fleet listing.

Every route does its database work in one :func:`iwscope.dbslots.run_db` call (a slot, a
thread, a short session closed in that thread): no connection is held while FastAPI reads
the body, authenticates, waits for a thread or sends the answer.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from iwprobe import wire

from iwscope.auth.dependencies import (AdminDep, EnrollTokenDep, ProbeDep, ProbeIdentity, SettingsDep,
                                       forbid_other_identity)
from iwscope.db import session_scope
from iwscope.dbslots import run_db
from iwscope.probes import services
from iwscope.probes.schemas import EnrollRequestIn, EnrollResponseOut, HeartbeatIn, ProbeOut, ScheduleOut

router = APIRouter(prefix="/api/v1/probes", tags=["probes"])


def _enroll(request: EnrollRequestIn) -> EnrollResponseOut:
    with session_scope() as session:
        probe, credential = services.enroll_probe(session, request)
        return EnrollResponseOut(id=str(probe.id), credential=credential)


@router.post("/enroll", status_code=status.HTTP_201_CREATED, response_model=EnrollResponseOut)
async def enroll(request: EnrollRequestIn, _token: EnrollTokenDep) -> EnrollResponseOut:
    return await run_db(_enroll, request)


def _heartbeat(probe_id: uuid.UUID, body: HeartbeatIn) -> None:
    with session_scope() as session:
        services.record_heartbeat(session, probe_id, body)


@router.post("/{probe_id}/heartbeat", status_code=status.HTTP_204_NO_CONTENT)
async def heartbeat(probe_id: uuid.UUID, body: HeartbeatIn, probe: ProbeDep) -> Response:
    forbid_other_identity(probe.id, probe_id)
    await run_db(_heartbeat, probe.id, body)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def _schedule(probe: ProbeIdentity, poll_after_s: float, wire_version: int) -> ScheduleOut:
    with session_scope() as session:
        return services.schedule_for(session, probe, poll_after_s, wire_version=wire_version)


@router.get("/{probe_id}/schedule", response_model=ScheduleOut)
async def schedule(probe_id: uuid.UUID, probe: ProbeDep, settings: SettingsDep,
                   wire_version: Annotated[int, Query(ge=1, le=wire.WIRE_VERSION,
                                                      description="the wire version the probe speaks (absent: 2)")]
                   = services.DEFAULT_PROBE_WIRE_VERSION) -> ScheduleOut:
    forbid_other_identity(probe.id, probe_id)
    return await run_db(_schedule, probe, settings.schedule_poll_s, wire_version)


def _list_probes() -> list[ProbeOut]:
    with session_scope() as session:
        return services.list_probes(session)


@router.get("", response_model=list[ProbeOut])
async def list_probes(_admin: AdminDep) -> list[ProbeOut]:
    return await run_db(_list_probes)

"""``/api/v1/probes``: enrollment, heartbeat, schedule, fleet listing."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response, status

from iwscope.auth.dependencies import (AdminDep, EnrollTokenDep, ProbeDep, SessionDep, SettingsDep,
                                       forbid_other_identity)
from iwscope.probes import services
from iwscope.probes.schemas import EnrollRequestIn, EnrollResponseOut, HeartbeatIn, ProbeOut, ScheduleOut

router = APIRouter(prefix="/api/v1/probes", tags=["probes"])


@router.post("/enroll", status_code=status.HTTP_201_CREATED, response_model=EnrollResponseOut)
def enroll(request: EnrollRequestIn, session: SessionDep, _token: EnrollTokenDep) -> EnrollResponseOut:
    probe, credential = services.enroll_probe(session, request)
    session.commit()
    return EnrollResponseOut(id=str(probe.id), credential=credential)


@router.post("/{probe_id}/heartbeat", status_code=status.HTTP_204_NO_CONTENT)
def heartbeat(probe_id: uuid.UUID, body: HeartbeatIn, probe: ProbeDep, session: SessionDep) -> Response:
    forbid_other_identity(probe.id, probe_id)
    services.record_heartbeat(session, probe, body)
    session.commit()
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{probe_id}/schedule", response_model=ScheduleOut)
def schedule(probe_id: uuid.UUID, probe: ProbeDep, session: SessionDep, settings: SettingsDep) -> ScheduleOut:
    forbid_other_identity(probe.id, probe_id)
    return services.schedule_for(session, probe, settings.schedule_poll_s)


@router.get("", response_model=list[ProbeOut])
def list_probes(session: SessionDep, _admin: AdminDep) -> list[ProbeOut]:
    return services.list_probes(session)

"""``/api/v1/probes``: enrollment, heartbeat, schedule, fleet listing.

Every route does its database work in one :func:`iwscope.dbslots.run_db` call (a slot, a
thread, a short session closed in that thread): no connection is held while FastAPI reads
the body, authenticates, waits for a thread or sends the answer.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response, status

from iwprobe import wire
from iwscope.auth.dependencies import AdminDep, EnrollTokenDep, ProbeDep, SettingsDep, forbid_other_identity
from iwscope.db import session_scope
from iwscope.dbslots import run_db
from iwscope.http import etag_matches
from iwscope.probes import schedule_cache, services
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


#: A probe's ``If-None-Match`` naming the schedule's current ETag is answered 304, no body.
_SCHEDULE_RESPONSES: dict[int | str, dict[str, Any]] = {
    304: {"description": "the schedule is unchanged since the ETag in If-None-Match (no body)"}
}


@router.get("/{probe_id}/schedule", response_model=ScheduleOut, responses=_SCHEDULE_RESPONSES)
async def schedule(
    probe_id: uuid.UUID,
    probe: ProbeDep,
    settings: SettingsDep,
    wire_version: Annotated[
        int, Query(ge=1, le=wire.WIRE_VERSION, description="the wire version the probe speaks (absent: 2)")
    ] = services.DEFAULT_PROBE_WIRE_VERSION,
    if_none_match: Annotated[str | None, Header(max_length=1024)] = None,
) -> Response:
    """The probe's schedule, from this process's snapshot (``iwscope.probes.schedule_cache``);
    with an ``ETag`` (everything but ``generated_at``), and 304 when ``If-None-Match`` has it."""
    forbid_other_identity(probe.id, probe_id)
    snapshot, now = await schedule_cache.current_snapshot(settings)
    body, etag = services.schedule_from(snapshot, probe, settings.schedule_poll_s, now, wire_version)
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if etag_matches(if_none_match, etag):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    return Response(body.model_dump_json().encode(), media_type="application/json", headers=headers)


def _list_probes() -> list[ProbeOut]:
    with session_scope() as session:
        return services.list_probes(session)


@router.get("", response_model=list[ProbeOut])
async def list_probes(_admin: AdminDep) -> list[ProbeOut]:
    return await run_db(_list_probes)

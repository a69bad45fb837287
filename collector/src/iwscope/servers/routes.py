"""``/api/v1/servers``: enrollment of ``iwprobe tap`` agents, their configuration, the fleet listing.

Every route does its database work in one :func:`iwscope.dbslots.run_db` call, like the
probes' routes; the configuration answers 304 to an ``If-None-Match`` naming its ETag, like a
probe's schedule.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Response, status

from iwscope.auth.dependencies import AdminDep, ServerDep, ServerTokenDep, SettingsDep, forbid_other_identity
from iwscope.db import session_scope
from iwscope.dbslots import run_db
from iwscope.http import etag_matches
from iwscope.probes.schemas import EnrollResponseOut
from iwscope.servers import services
from iwscope.servers.schemas import ServerConfigOut, ServerEnrollRequestIn, ServerOut
from iwscope.types import utcnow

router = APIRouter(prefix="/api/v1/servers", tags=["servers"])

_CONFIG_RESPONSES: dict[int | str, dict[str, Any]] = {
    304: {"description": "the configuration is unchanged since the ETag in If-None-Match (no body)"},
    403: {"description": "the credential belongs to another server"},
}


def _enroll(request: ServerEnrollRequestIn) -> EnrollResponseOut:
    with session_scope() as session:
        server, credential = services.enroll_server(session, request)
        return EnrollResponseOut(id=str(server.id), credential=credential)


@router.post("/enroll", status_code=status.HTTP_201_CREATED, response_model=EnrollResponseOut)
async def enroll(request: ServerEnrollRequestIn, _token: ServerTokenDep) -> EnrollResponseOut:
    """Enroll a server (a token of kind ``server``); the answer's credential is shown only once."""
    return await run_db(_enroll, request)


def _config(server_id: uuid.UUID, poll_after_s: float) -> tuple[ServerConfigOut, str]:
    with session_scope() as session:
        return services.server_config(session, server_id, poll_after_s, utcnow())


@router.get("/{server_id}/config", response_model=ServerConfigOut, responses=_CONFIG_RESPONSES)
async def config(
    server_id: uuid.UUID,
    server: ServerDep,
    settings: SettingsDep,
    if_none_match: Annotated[str | None, Header(max_length=1024)] = None,
) -> Response:
    """The passive study in force for this server now (``study: null``: none, the agent removes
    its arms), with an ``ETag`` (everything but ``generated_at``); 304 when ``If-None-Match`` has it."""
    forbid_other_identity(server.id, server_id)
    body, etag = await run_db(_config, server.id, settings.schedule_poll_s)
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if etag_matches(if_none_match, etag):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    return Response(body.model_dump_json().encode(), media_type="application/json", headers=headers)


def _list_servers() -> list[ServerOut]:
    with session_scope() as session:
        return services.list_servers(session)


@router.get("", response_model=list[ServerOut])
async def list_servers(_admin: AdminDep) -> list[ServerOut]:
    """Every server with its ports, versions, last seen and last heartbeat (admin token)."""
    return await run_db(_list_servers)

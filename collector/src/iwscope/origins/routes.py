"""``/api/v1/origins``: enrollment and listing."""

from __future__ import annotations

from fastapi import APIRouter, status

from iwscope.auth.dependencies import AdminDep, OriginTokenDep, SessionDep
from iwscope.origins import services
from iwscope.origins.schemas import OriginEnrollRequestIn, OriginOut
from iwscope.probes.schemas import EnrollResponseOut

router = APIRouter(prefix="/api/v1/origins", tags=["origins"])


@router.post("/enroll", status_code=status.HTTP_201_CREATED, response_model=EnrollResponseOut)
def enroll(request: OriginEnrollRequestIn, session: SessionDep, _token: OriginTokenDep) -> EnrollResponseOut:
    origin, credential = services.enroll_origin(session, request)
    session.commit()
    return EnrollResponseOut(id=str(origin.id), credential=credential)


@router.get("", response_model=list[OriginOut])
def list_origins(session: SessionDep, _admin: AdminDep) -> list[OriginOut]:
    return services.list_origins(session)

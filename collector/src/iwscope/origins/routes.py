"""``/api/v1/origins``: enrollment and listing (database work in one ``run_db`` call each)."""

from __future__ import annotations

from fastapi import APIRouter, status

from iwscope.auth.dependencies import AdminDep, OriginTokenDep
from iwscope.db import session_scope
from iwscope.dbslots import run_db
from iwscope.origins import services
from iwscope.origins.schemas import OriginEnrollRequestIn, OriginOut
from iwscope.probes import schedule_cache
from iwscope.probes.schemas import EnrollResponseOut

router = APIRouter(prefix="/api/v1/origins", tags=["origins"])


def _enroll(request: OriginEnrollRequestIn) -> EnrollResponseOut:
    with session_scope() as session:
        origin, credential = services.enroll_origin(session, request)
        return EnrollResponseOut(id=str(origin.id), credential=credential)


@router.post("/enroll", status_code=status.HTTP_201_CREATED, response_model=EnrollResponseOut)
async def enroll(request: OriginEnrollRequestIn, _token: OriginTokenDep) -> EnrollResponseOut:
    enrolled = await run_db(_enroll, request)
    schedule_cache.invalidate()  # an origin re-enrolling with other arms changes schedules
    return enrolled


def _list_origins() -> list[OriginOut]:
    with session_scope() as session:
        return services.list_origins(session)


@router.get("", response_model=list[OriginOut])
async def list_origins(_admin: AdminDep) -> list[OriginOut]:
    return await run_db(_list_origins)

"""``GET /api/v1/analysis/passive/...``: the real-user study, for holders of a read credential.

What operators' servers measured of their own users is not public like the probes' data: every
route here needs a ``read`` or ``admin`` token (:data:`iwscope.auth.dependencies.ReaderDep`;
anonymous or anything else: the one 401).  Included by :mod:`iwscope.analysis.routes` into the
analysis router (so ``api.py`` needs no change); database work runs in the readers' share of the
database slots like every analysis read.

Filters (query parameters, all optional): ``campaign_id`` (default: the passive campaign that
started last), ``server_id``, ``region`` (repeatable), ``family`` (``ipv4``/``ipv6``), ``since``
and ``until`` (inclusive, on the aggregates' hour), ``include_biased`` (default true),
``phase`` and ``treated_share_bp`` (repeatable), ``baseline`` (an arm label).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.encoders import jsonable_encoder
from pydantic import StringConstraints

from iwprobe import wire
from iwscope.analysis import passive, passive_schemas
from iwscope.analysis.filters import SINCE_DESCRIPTION, UNTIL_DESCRIPTION
from iwscope.analysis.passive_frames import PassiveFilters, as_utc
from iwscope.auth.dependencies import ReaderDep
from iwscope.db import get_sessionmaker
from iwscope.dbslots import run_db
from iwscope.wiretypes import BIGINT_MAX, NO_NUL_PATTERN, NamedFamily

router = APIRouter(prefix="/passive", tags=["passive analysis"])

_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "no read or admin token (the one body of every refused credential)"},
    503: {"description": "database busy: retry after Retry-After seconds"},
}
RegionParam = Annotated[str, StringConstraints(max_length=64, pattern=NO_NUL_PATTERN)]
PhaseParam = Annotated[int, Query(ge=0, le=2**31 - 1)]
ShareParam = Annotated[int, Query(ge=0, le=wire.PASSIVE_SHARE_SCALE)]


def passive_filters(
    campaign_id: Annotated[
        int | None, Query(ge=1, le=BIGINT_MAX, description="a passive campaign; default: the one that started last")
    ] = None,
    server_id: Annotated[uuid.UUID | None, Query(description="one server's aggregates only")] = None,
    region: Annotated[list[RegionParam] | None, Query(max_length=64, description="client regions (repeatable)")] = None,
    family: Annotated[NamedFamily | None, Query(description="the clients' IP version")] = None,
    since: Annotated[dt.datetime | None, Query(description=SINCE_DESCRIPTION + "; on the aggregates' hour")] = None,
    until: Annotated[dt.datetime | None, Query(description=UNTIL_DESCRIPTION + "; on the aggregates' hour")] = None,
    include_biased: Annotated[
        bool,
        Query(
            description="count connections with a bias flag in latency and retransmissions (the biased shares always count them)"
        ),
    ] = True,
    phase: Annotated[list[PhaseParam] | None, Query(max_length=64, description="phases (repeatable)")] = None,
    treated_share_bp: Annotated[list[ShareParam] | None, Query(max_length=64, description="treated shares, basis points")] = None,
    baseline: Annotated[
        str | None,
        Query(pattern=wire.PASSIVE_ARM_PATTERN, description="the baseline arm; default: 'default', else the smallest IW"),
    ] = None,
) -> PassiveFilters:
    return PassiveFilters(
        campaign_id=campaign_id,
        server_ids=(str(server_id),) if server_id else (),
        regions=tuple(dict.fromkeys(region or ())),
        family=family or "",
        since=as_utc(since),
        until=as_utc(until),
        include_biased=include_biased,
        phases=tuple(sorted(set(phase or ()))),
        treated_shares_bp=tuple(sorted(set(treated_share_bp or ()))),
        baseline=baseline or "",
    )


PassiveFiltersDep = Annotated[PassiveFilters, Depends(passive_filters)]


def _json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable_encoder(dataclasses.asdict(value))
    if isinstance(value, list):
        return [_json(item) for item in value]
    return jsonable_encoder(value)


def _query(function: Callable[..., Any], *args: Any) -> Any:
    with get_sessionmaker()() as session:
        return _json(function(session, *args))


async def _run(function: Callable[..., Any], *args: Any) -> dict[str, Any]:
    return {"data": await run_db(_query, function, *args, read=True)}


@router.get("/campaigns", response_model=passive_schemas.PassiveCampaignsOut, responses=_RESPONSES)
async def get_campaigns(_reader: ReaderDep) -> dict[str, Any]:
    """Every passive campaign with its arms and shares, and what its servers uploaded."""
    return await _run(passive.passive_campaigns)


@router.get("/summary", response_model=passive_schemas.PassiveSummaryOut, responses=_RESPONSES)
async def get_summary(_reader: ReaderDep, filters: PassiveFiltersDep) -> dict[str, Any]:
    """The IETF 78 table per arm (n, avg, p50, p75, p90, p99 of the first-response latency; per
    treated arm the improvement over the baseline in ms and %), retransmissions per arm and their
    increase, and the biased shares; every number with its 95 % cluster-bootstrap interval."""
    return await _run(passive.passive_summary, filters)


@router.get("/buckets", response_model=passive_schemas.PassiveBucketsOut, responses=_RESPONSES)
async def get_buckets(
    _reader: ReaderDep, filters: PassiveFiltersDep, dimension: Literal["rtt", "bandwidth", "bdp"] = "rtt"
) -> dict[str, Any]:
    """Figure 5 of the real users: mean and median per arm and their improvement over the
    baseline per bucket of the connection's own min RTT, delivery rate or BDP."""
    return await _run(passive.passive_buckets, filters, dimension)


@router.get("/regions", response_model=passive_schemas.PassiveRegionsOut, responses=_RESPONSES)
async def get_regions(_reader: ReaderDep, filters: PassiveFiltersDep) -> dict[str, Any]:
    """The percentile table per client region."""
    return await _run(passive.passive_regions, filters)


@router.get("/days", response_model=passive_schemas.PassiveDaysOut, responses=_RESPONSES)
async def get_days(_reader: ReaderDep, filters: PassiveFiltersDep) -> dict[str, Any]:
    """Per UTC day: mean and median per arm and their improvement over the baseline."""
    return await _run(passive.passive_days, filters)


@router.get("/share-sweep", response_model=passive_schemas.PassiveShareSweepOut, responses=_RESPONSES)
async def get_share_sweep(_reader: ReaderDep, filters: PassiveFiltersDep) -> dict[str, Any]:
    """The default arm's latency and retransmissions per treated share (phase and share filters
    do not apply), with each share's change against the smallest."""
    return await _run(passive.passive_share_sweep, filters)


@router.get("/load", response_model=passive_schemas.PassiveLoadOut, responses=_RESPONSES)
async def get_load(_reader: ReaderDep, filters: PassiveFiltersDep) -> dict[str, Any]:
    """Per server and UTC day: rows and bytes of aggregates against raw connection records."""
    return await _run(passive.passive_load, filters)

"""``GET /api/v1/analysis/...``: the analysis functions as public JSON (and CSV) endpoints.

Every endpoint reads the filter parameters of :meth:`Filters.from_query` (``campaign``,
``since``, ``until``, ``region``, ``smin``, ``smax``, ``base``, ``treat``, ``metric``);
malformed values fall back to defaults, exactly like the dashboard's URLs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session

from iwscope.analysis import queries
from iwscope.analysis.filters import Filters
from iwscope.db import get_sessionmaker
from iwscope.wiretypes import BIGINT_MAX

router = APIRouter(prefix="/api/v1/analysis", tags=["analysis"])

Result = TypeVar("Result")


def _session() -> Iterator[Session]:
    session = get_sessionmaker()()
    try:
        yield session
    finally:
        session.close()


def _filters(request: Request) -> Filters:
    return Filters.from_query(dict(request.query_params))


SessionDep = Annotated[Session, Depends(_session)]
FiltersDep = Annotated[Filters, Depends(_filters)]


def _json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable_encoder(dataclasses.asdict(value))
    if isinstance(value, list):
        return [_json(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _json(item) for key, item in value.items()}
    return jsonable_encoder(value)


def _run(session: Session, function: Callable[..., Result], *args: Any) -> Any:
    return {"data": _json(function(session, *args))}


@router.get("/filters")
def get_filters(filters: FiltersDep) -> dict[str, Any]:
    """The parsed filter state (what the other endpoints will use) and its canonical query."""
    return {"filters": jsonable_encoder(dataclasses.asdict(filters)), "query": filters.to_query()}


@router.get("/compare")
def get_compare(session: SessionDep, filters: FiltersDep,
                dimension: Literal["rtt", "bandwidth", "bdp", "region", "loss", "size"] = "rtt") -> dict[str, Any]:
    """Treatment vs baseline per bucket of ``dimension`` (Figure 5 buckets for rtt/bandwidth/bdp)."""
    return _run(session, queries.compare_by, filters, dimension)


@router.get("/percentiles")
def get_percentiles(session: SessionDep, filters: FiltersDep,
                    group_by: Literal["region", "none"] = "none") -> dict[str, Any]:
    """Percentile tables (avg, p50, p75, p90, p99) with retransmission rates, per region or overall."""
    return _run(session, queries.percentile_table, filters, "region" if group_by == "region" else None)


@router.get("/latency-vs-iw")
def get_latency_vs_iw(session: SessionDep, filters: FiltersDep) -> dict[str, Any]:
    return _run(session, queries.latency_vs_iw, filters)


@router.get("/cdf")
def get_cdf(session: SessionDep, filters: FiltersDep) -> dict[str, Any]:
    return _run(session, queries.latency_cdf, filters)


@router.get("/headline")
def get_headline(session: SessionDep, filters: FiltersDep) -> dict[str, Any]:
    return _run(session, queries.headline, filters)


@router.get("/regions")
def get_regions(session: SessionDep, filters: FiltersDep) -> dict[str, Any]:
    return _run(session, queries.region_summary, filters)


@router.get("/loss")
def get_loss(session: SessionDep, filters: FiltersDep) -> dict[str, Any]:
    return _run(session, queries.loss_summary, filters)


@router.get("/fairness")
def get_fairness(session: SessionDep, filters: FiltersDep) -> dict[str, Any]:
    return _run(session, queries.fairness, filters)


@router.get("/fleet")
def get_fleet(session: SessionDep) -> dict[str, Any]:
    return {"data": _json(queries.fleet(session))}


@router.get("/options")
def get_options(session: SessionDep) -> dict[str, Any]:
    return {"data": _json(queries.filter_options(session))}


@router.get("/trials")
def get_trials(session: SessionDep, filters: FiltersDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
               offset: Annotated[int, Query(ge=0, le=BIGINT_MAX)] = 0) -> dict[str, Any]:
    """Raw trials (exact filters), newest first; ``total`` is capped (see ``TRIALS_COUNT_CAP``)."""
    rows, total = queries.trials_page(session, filters, limit, offset)
    return {"data": jsonable_encoder(rows), "total": total, "limit": limit, "offset": offset}


@router.get("/trials.csv", response_class=StreamingResponse,
            responses={200: {"content": {"text/csv": {}}, "description": "filtered trials as CSV, streamed"}})
def get_trials_csv(filters: FiltersDep) -> StreamingResponse:
    def chunks() -> Iterator[str]:
        session = get_sessionmaker()()
        try:
            yield from queries.iter_trials_csv(session, filters)
        finally:
            session.close()

    return StreamingResponse(chunks(), media_type="text/csv",
                             headers={"Content-Disposition": 'attachment; filename="iwscope-trials.csv"'})

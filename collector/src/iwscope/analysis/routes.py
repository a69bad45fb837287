"""``GET /api/v1/analysis/...``: the analysis functions as public JSON (and CSV) endpoints.

Every endpoint reads the filter parameters of :meth:`Filters.from_query` (``campaign``,
``since``, ``until``, ``region``, ``smin``, ``smax``, ``base``, ``treat``, ``metric``, ``family``,
``cost``: ``cost=1`` puts cost-experiment trials into the benefit figures; ``send``: the origin's
send path, applied by the routes that read raw trials -- ``/trials``, ``/trials.csv``, ``/tls``,
``/iw-check``, ``/cost``, ``/fairness`` -- and not by the roll-ups' figures, see ``Filters.send_path``;
``proto``: ``tcp`` or ``quic``, applied by the same routes and the census, while the roll-ups'
figures, which hold TCP's plain arms only, answer nothing for ``quic``, see ``Filters.protocol``);
malformed values fall back to defaults, exactly like the dashboard's URLs.

Database work runs in the readers' share of the database slots (``run_db(..., read=True)``): public
reads, however many or slow, leave half the connections to probes and origins, and wait at
most ``IWSCOPE_DB_POOL_TIMEOUT_S`` before a 503 + ``Retry-After``.  The CSV export holds its
slot (and its server-side cursor) until the last chunk is sent or the client goes away
(:mod:`iwscope.streaming`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import StreamingResponse

from iwscope.analysis import iwcheck, modelfit, offered_load, passive_routes, protocols, queries, raw, schemas, tls
from iwscope.analysis.cost import cost
from iwscope.analysis.filters import SINCE_DESCRIPTION, UNTIL_DESCRIPTION, Filters, resolve_family
from iwscope.db import get_sessionmaker
from iwscope.dbslots import run_db
from iwscope.model import CongestionControl
from iwscope.streaming import stream_read
from iwscope.wiretypes import BIGINT_MAX

router = APIRouter(prefix="/api/v1/analysis", tags=["analysis"])


def _filters(request: Request) -> Filters:
    return Filters.from_query(dict(request.query_params))


FiltersDep = Annotated[Filters, Depends(_filters)]

#: The raw routes' window parameters in the OpenAPI document (``_filters`` reads them, with the
#: other filter keys, from the query string: a malformed value falls back to its default).
_WINDOW_PARAMETERS: dict[str, Any] = {
    "parameters": [
        {"name": "since", "in": "query", "required": False, "description": SINCE_DESCRIPTION, "schema": {"type": "string"}},
        {"name": "until", "in": "query", "required": False, "description": UNTIL_DESCRIPTION, "schema": {"type": "string"}},
    ]
}


def _json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable_encoder(dataclasses.asdict(value))
    if isinstance(value, list):
        return [_json(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _json(item) for key, item in value.items()}
    return jsonable_encoder(value)


def _read(function: Callable[..., Any], *args: Any) -> Any:
    """``function(session, *args)`` on a read session closed before the thread ends."""
    with get_sessionmaker()() as session:
        return function(session, *(resolve_family(session, arg) if isinstance(arg, Filters) else arg for arg in args))


def _query(function: Callable[..., Any], *args: Any) -> Any:
    """:func:`_read`, as JSON."""
    return _json(_read(function, *args))


async def _run(function: Callable[..., Any], *args: Any) -> dict[str, Any]:
    return {"data": await run_db(_query, function, *args, read=True)}


@router.get("/filters", response_model=schemas.FiltersOut)
def get_filters(filters: FiltersDep) -> dict[str, Any]:
    """The parsed filter state (what the other endpoints will use) and its canonical query."""
    return {"filters": jsonable_encoder(dataclasses.asdict(filters)), "query": filters.to_query()}


@router.get("/compare", response_model=schemas.ComparisonsOut)
async def get_compare(
    filters: FiltersDep, dimension: Literal["rtt", "bandwidth", "bdp", "region", "loss", "size"] = "rtt"
) -> dict[str, Any]:
    """Treatment vs baseline per bucket of ``dimension`` (Figure 5 buckets for rtt/bandwidth/bdp)."""
    return await _run(queries.compare_by, filters, dimension)


@router.get("/percentiles", response_model=schemas.PercentilesOut)
async def get_percentiles(filters: FiltersDep, group_by: Literal["region", "none"] = "none") -> dict[str, Any]:
    """Percentile tables (avg, p50, p75, p90, p99) with retransmission rates, per region or overall."""
    return await _run(queries.percentile_table, filters, "region" if group_by == "region" else None)


@router.get("/latency-vs-iw", response_model=schemas.ArmStatsOut)
async def get_latency_vs_iw(filters: FiltersDep) -> dict[str, Any]:
    return await _run(queries.latency_vs_iw, filters)


@router.get("/cdf", response_model=schemas.CdfOut)
async def get_cdf(filters: FiltersDep) -> dict[str, Any]:
    return await _run(queries.latency_cdf, filters)


@router.get("/headline", response_model=schemas.HeadlineOut)
async def get_headline(filters: FiltersDep) -> dict[str, Any]:
    return await _run(queries.headline, filters)


@router.get("/regions", response_model=schemas.RegionsOut)
async def get_regions(filters: FiltersDep) -> dict[str, Any]:
    return await _run(queries.region_summary, filters)


@router.get("/loss", response_model=schemas.LossOut)
async def get_loss(filters: FiltersDep) -> dict[str, Any]:
    return await _run(queries.loss_summary, filters)


@router.get("/tls", response_model=schemas.ComparisonsOut)
async def get_tls(filters: FiltersDep) -> dict[str, Any]:
    """TLS handshake time of the two arms per bucket of the server's first flight (bytes), with
    the paired improvement (``metric=client``: the probe's handshake; ``server``: the origin's)."""
    return await _run(tls.tls_by_flight, filters)


@router.get("/protocols", response_model=schemas.ComparisonsOut)
async def get_protocols(filters: FiltersDep) -> dict[str, Any]:
    """HTTP/3 (wire v9): per size octave, TCP arm ``N`` against QUIC arm ``Nq`` for ``N`` in
    ``base`` and ``treat`` (``dimension`` ``tcp-vs-quic``; baseline TCP), then QUIC arm
    ``<base>q`` against ``<treat>q`` (``quic-arms``), paired on (path, round, size) with 95 %
    intervals; ``metric=client``: the probe's total, handshakes included."""
    return await _run(protocols.protocol_comparisons, filters)


@router.get("/fairness", response_model=schemas.FairnessOut)
async def get_fairness(filters: FiltersDep) -> dict[str, Any]:
    return await _run(offered_load.fairness, filters)


@router.get("/cost", response_model=schemas.CostOut)
async def get_cost(filters: FiltersDep) -> dict[str, Any]:
    """Cost campaigns (phases) matching the filters: flows per role and arm, the interactive
    flow's delay and loss, and the A/B-vs-total interference estimates."""
    return await _run(cost, filters)


@router.get("/census", response_model=schemas.CensusTargetsOut)
async def get_census(filters: FiltersDep) -> dict[str, Any]:
    """The IW of servers iwscope does not run, from census campaigns (``campaign``, ``since``,
    ``until`` on the measurement time, ``region`` of the probes): the modal determined IW per
    target with its share and 95 % interval, every value seen, "n too small" below 3 records."""
    return await _run(iwcheck.census_targets, filters)


@router.get("/census/series", response_model=schemas.CensusSeriesOut)
async def get_census_series(filters: FiltersDep) -> dict[str, Any]:
    """The census per target and UTC day (the "over time" view)."""
    return await _run(iwcheck.census_series, filters)


@router.get("/iw-check", response_model=schemas.IwCheckOut)
async def get_iw_check(filters: FiltersDep) -> dict[str, Any]:
    """Per probe and origin: the server IW each trial's probe inferred from its own capture
    against the arm it asked for and the origin's own window (a split-TCP proxy or a cache on
    the path disagrees while the origin had the arm)."""
    return await _run(iwcheck.iw_check, filters)


@router.get("/model-fit", response_model=schemas.ModelFitOut)
async def get_model_fit(
    filters: FiltersDep,
    cc: Annotated[
        CongestionControl,
        Query(description="the origin's congestion control, as the model plays it (origins do not report theirs)"),
    ] = "cubic",
) -> dict[str, Any]:
    """Per probe x origin path and RTT bucket: the paired improvement of ``treat`` over ``base``
    beside what the model with loss predicts from the path's own estimates (min RTT, bottleneck,
    the baseline's retransmitted share, the client's window), the residual, and the paths that
    disagree ("odd") with what their trials show (receive window, proxy, shallow buffer,
    policer).  Fewer than 20 pairs on a path: "n too small", no prediction."""
    # The trials within a readers' database slot; the model's Monte-Carlo (CPU, no database)
    # after the slot is given back, so it never keeps a reader or a probe's upload waiting.
    trials = await run_db(_read, modelfit.read_model_trials, filters, read=True)
    fitted = await anyio.to_thread.run_sync(modelfit.fit_model, trials, cc)
    return {"data": _json(fitted)}


@router.get("/fleet", response_model=schemas.FleetOut)
async def get_fleet() -> dict[str, Any]:
    return await _run(queries.fleet)


@router.get("/options", response_model=schemas.OptionsOut)
async def get_options() -> dict[str, Any]:
    return await _run(queries.filter_options)


@router.get("/trials", response_model=schemas.TrialsPageOut, openapi_extra=_WINDOW_PARAMETERS)
async def get_trials(
    filters: FiltersDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100, offset: Annotated[int, Query(ge=0, le=BIGINT_MAX)] = 0
) -> dict[str, Any]:
    """Raw trials (exact filters), newest first; ``total`` is capped (see ``TRIALS_COUNT_CAP``)."""
    rows, total = await run_db(_query, raw.trials_page, filters, limit, offset, read=True)
    return {"data": rows, "total": total, "limit": limit, "offset": offset}


@router.get(
    "/trials.csv",
    response_class=StreamingResponse,
    openapi_extra=_WINDOW_PARAMETERS,
    responses={
        200: {"content": {"text/csv": {}}, "description": "filtered trials as CSV, streamed"},
        503: {"description": "database busy: retry after Retry-After seconds"},
    },
)
async def get_trials_csv(filters: FiltersDep) -> StreamingResponse:
    """The trials page's columns as CSV (:mod:`iwscope.analysis.raw`, like ``/api/v1/trials.csv``)."""
    return await stream_read(
        lambda session: raw.iter_trials_csv(session, resolve_family(session, filters)),
        "text/csv",
        {"Content-Disposition": 'attachment; filename="iwscope-trials.csv"'},
    )


# The real-user study, behind a read credential: ``/api/v1/analysis/passive/...``
# (:mod:`iwscope.analysis.passive_routes`).  Included here, after every public route, so the
# application's router list (``api.py``) stays as it is.
router.include_router(passive_routes.router)

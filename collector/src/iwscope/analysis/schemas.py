"""Response models of ``/api/v1/analysis/...``: every route's answer is typed, so the published
OpenAPI has a ``$ref`` schema for it and clients generated from it see real fields.

The analysis functions return frozen dataclasses (:mod:`results`, :mod:`cost`, :mod:`iwcheck`);
pydantic documents and checks them as they are, so each model here is a thin envelope:
``{"data": ...}`` (plus paging for the trials page)."""

from __future__ import annotations

import datetime as dt
import uuid

from pydantic import BaseModel, Field

from iwscope.analysis.cost import CostReport
from iwscope.analysis.iwcheck import CensusDay, CensusTarget, PathIwCheck
from iwscope.analysis.modelfit_results import ModelFit
from iwscope.analysis.results import (
    ArmStats,
    BucketComparison,
    FairnessPoint,
    FilterOptions,
    Headline,
    LossBucket,
    PercentileTable,
    ProbeRow,
    RegionSummary,
)


class FilterStateOut(BaseModel):
    """The filters as parsed (what the other routes use) -- see ``analysis.filters.Filters``."""

    campaign_ids: list[int]
    since: dt.datetime | None
    until: dt.datetime | None
    regions: list[str]
    size_min: int | None
    size_max: int | None
    baseline_iw: int
    treatment_iw: int
    metric: str
    family: str
    include_cost: bool
    send_path: str
    protocol: str


class FiltersOut(BaseModel):
    """``GET /analysis/filters``: the parsed filter state and its canonical query."""

    filters: FilterStateOut
    query: dict[str, str]


class ComparisonsOut(BaseModel):
    """Treatment vs baseline per bucket (``/compare``, ``/tls``, ``/protocols``)."""

    data: list[BucketComparison]


class PercentilesOut(BaseModel):
    """``/percentiles``: the IETF slides' tables, overall or per region."""

    data: list[PercentileTable]


class ArmStatsOut(BaseModel):
    """``/latency-vs-iw``: per IW, n, mean, median and quartiles (ms)."""

    data: list[ArmStats]


class CdfOut(BaseModel):
    """``/cdf``: per IW, the latency CDF as (ms, cumulative share) points."""

    data: dict[int, list[tuple[float, float]]]


class HeadlineOut(BaseModel):
    data: Headline


class RegionsOut(BaseModel):
    data: list[RegionSummary]


class LossOut(BaseModel):
    data: list[LossBucket]


class FairnessOut(BaseModel):
    data: list[FairnessPoint]


class CostOut(BaseModel):
    """``GET /analysis/cost``: the cost report (see :mod:`iwscope.analysis.cost`)."""

    data: CostReport


class FleetOut(BaseModel):
    data: list[ProbeRow]


class OptionsOut(BaseModel):
    data: FilterOptions


class TrialRowOut(BaseModel):
    """One raw trial as the trials page shows it (``raw.TRIAL_COLUMNS``; ``region`` is the probe's)."""

    trial_id: uuid.UUID
    started_at: dt.datetime
    campaign_id: int | None
    probe_id: uuid.UUID
    region: str | None
    origin_id: uuid.UUID | None
    arm_iw: int
    #: The trial's transport as stored (wire v9): ``tcp``, ``quic``, or None: not said (TCP).
    protocol: str | None
    object_size: int
    total_us: int | None
    ttfb_us: int | None
    server_latency_us: int | None
    #: How the origin wrote the response (wire v8; ``""``: not said, None: no observation).
    send_path: str | None
    http_status: int | None
    error_kind: str | None
    tcpi_total_retrans: int | None
    tcpi_min_rtt_us: int | None
    server_total_retrans: int | None
    server_bytes_retrans: int | None
    server_bytes_sent: int | None


class TrialsPageOut(BaseModel):
    """``/trials``: a page of raw trials, newest first; ``total`` stops at the count cap + 1."""

    data: list[TrialRowOut]
    total: int = Field(description="matches, counted up to raw.TRIALS_COUNT_CAP (then the cap + 1)")
    limit: int
    offset: int


class CensusTargetsOut(BaseModel):
    """``/census``: per census target, the IW over all records and per region."""

    data: list[CensusTarget]


class CensusSeriesOut(BaseModel):
    """``/census/series``: per census target and UTC day."""

    data: list[CensusDay]


class IwCheckOut(BaseModel):
    """``/iw-check``: per probe and origin, the client-side inferences against the arms."""

    data: list[PathIwCheck]


class ModelFitOut(BaseModel):
    """``/model-fit``: per path and RTT bucket, the measured improvement beside the model's
    prediction from the path's own estimates (``predicted_*``: a prediction, not a measurement),
    the residual, and the odd paths with what their trials show."""

    data: ModelFit

"""What each page's data callback reads, as plain functions of (session, filters).

The Dash callbacks call these and turn the results into figures; benchmarks
(``python -m iwscope_dashboard.timing``) time exactly the same functions, without a browser.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from sqlalchemy.orm import Session

from iwscope.analysis import (
    ArmStats,
    BucketComparison,
    CensusDay,
    CensusTarget,
    CostReport,
    Filters,
    Headline,
    LossBucket,
    ModelFit,
    PathIwCheck,
    PercentileTable,
    ProbeRow,
    RegionSummary,
    census_series,
    census_targets,
    compare_by,
    cost,
    fleet,
    headline,
    iw_check,
    latency_cdf,
    latency_vs_iw,
    loss_summary,
    model_fit,
    percentile_table,
    region_summary,
    tls_by_flight,
    trial_near,
    trials_page,
)
from iwscope.analysis.protocols import QUIC_ARMS, TCP_VS_QUIC, protocol_comparisons
from iwscope.predictions.schemas import TwinPredictionOut
from iwscope.predictions.services import read_twin_predictions
from iwscope.traces.schemas import TrialTracesOut
from iwscope.traces.services import read_trial_traces

OverviewDimension = Literal["rtt", "bandwidth", "bdp"]
OVERVIEW_DIMENSIONS: tuple[OverviewDimension, ...] = ("rtt", "bandwidth", "bdp")


@dataclass(frozen=True)
class OverviewHeadline:
    headline: Headline
    #: n per IW, to name an arm that has no trial under the filters.
    arms: list[ArmStats]


@dataclass(frozen=True)
class RegionsTables:
    overall: list[PercentileTable]
    per_region: list[PercentileTable]


def overview_headline(session: Session, filters: Filters) -> OverviewHeadline:
    return OverviewHeadline(headline(session, filters), latency_vs_iw(session, filters))


def overview_dimension(session: Session, filters: Filters, dimension: OverviewDimension) -> list[BucketComparison]:
    """One Figure 5 panel; the overview runs one callback per panel, in parallel."""
    return compare_by(session, filters, dimension)


def latency_means(session: Session, filters: Filters) -> list[ArmStats]:
    return latency_vs_iw(session, filters)


def latency_cdfs(session: Session, filters: Filters) -> dict[int, list[tuple[float, float]]]:
    return latency_cdf(session, filters)


def sizes_data(session: Session, filters: Filters) -> list[BucketComparison]:
    return compare_by(session, filters, "size")


def tls_data(session: Session, filters: Filters) -> list[BucketComparison]:
    return tls_by_flight(session, filters)


def protocol_data(session: Session, filters: Filters) -> list[BucketComparison]:
    """The HTTP/3 page: TCP against QUIC at both IWs, and the two QUIC arms (``dimension`` says which)."""
    return protocol_comparisons(session, filters)


def split_protocol_comparisons(
    comparisons: list[BucketComparison], iw: int
) -> tuple[list[BucketComparison], list[BucketComparison]]:
    """(TCP against QUIC at ``iw``, QUIC's two arms) of :func:`protocol_data`'s answer."""
    tcp_quic = [c for c in comparisons if c.dimension == TCP_VS_QUIC and c.baseline.iw == iw]
    return tcp_quic, [c for c in comparisons if c.dimension == QUIC_ARMS]


def model_data(session: Session, filters: Filters) -> ModelFit:
    """The "Model vs measured" page: per path and RTT bucket, the model with loss beside the
    measured improvement (the origin's congestion control taken as CUBIC, Linux's default)."""
    return model_fit(session, filters)


def twin_data(session: Session, filters: Filters) -> TwinPredictionOut | None:
    """The Model page's lab-twin section: the newest stored twin prediction of the one campaign
    the filters select, or of any campaign when they select none or several (the page names it)."""
    campaign = filters.campaign_ids[0] if len(filters.campaign_ids) == 1 else None
    newest = read_twin_predictions(session, campaign, limit=1)
    return newest[0] if newest else None


def regions_map(session: Session, filters: Filters) -> list[RegionSummary]:
    return region_summary(session, filters)


def regions_tables(session: Session, filters: Filters) -> RegionsTables:
    return RegionsTables(percentile_table(session, filters, None), percentile_table(session, filters, "region"))


def loss_data(session: Session, filters: Filters) -> list[LossBucket]:
    return loss_summary(session, filters)


def cost_data(session: Session, filters: Filters) -> CostReport:
    """The Cost page: phases, flows per role and arm, the interactive flow, interference."""
    return cost(session, filters)


@dataclass(frozen=True)
class WildData:
    """The "IW in the wild" page: the census per target, per day, and the client-side check."""

    targets: list[CensusTarget]
    days: list[CensusDay]
    checks: list[PathIwCheck]


def wild_data(session: Session, filters: Filters) -> WildData:
    return WildData(census_targets(session, filters), census_series(session, filters), iw_check(session, filters))


def probes_data(session: Session, filters: Filters | None = None) -> list[ProbeRow]:
    """The fleet ignores the analysis filters (every probe is listed)."""
    return fleet(session)


def trials_data(session: Session, filters: Filters, limit: int = 50, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    return trials_page(session, filters, limit, offset)


def trial_near_data(session: Session, filters: Filters, iw: int, latency_ms: float) -> uuid.UUID | None:
    """Where a click on the latency CDF leads: a trial of that arm near that latency."""
    return trial_near(session, filters, iw, latency_ms)


def trial_traces_data(session: Session, filters: Filters | None, trial_id: uuid.UUID) -> TrialTracesOut | None:
    """The Trials page's inspector: one trial, its twins and their stored traces; None for an
    unknown trial.  The filters do not apply: a link to a trial opens it whatever they select."""
    return read_trial_traces(session, trial_id)


#: Every data callback's body, by page prefix (the overview has one per panel), for benchmarks.
PAGE_DATA: dict[str, Callable[[Session, Filters], Any]] = {
    "overview-headline": overview_headline,
    **{f"overview-{d}": partial(overview_dimension, dimension=d) for d in OVERVIEW_DIMENSIONS},
    "latency-iw": latency_means,
    "latency-cdf": latency_cdfs,
    "sizes": sizes_data,
    "regions-map": regions_map,
    "regions-tables": regions_tables,
    "loss": loss_data,
    "cost": cost_data,
    "wild": wild_data,
    "model": model_data,
    "model-twin": twin_data,
    "probes": probes_data,
    "trials": trials_data,
}

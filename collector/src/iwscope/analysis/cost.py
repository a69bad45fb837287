"""The cost side: what an IW policy does to the flow itself and to everyone sharing its path.

Cost campaigns (any campaign with Poisson arrivals, a background flow, the interactive flow,
page loads, arm shares or labelled arms) are *phases* of an experiment on one bottleneck (the
probe's access link; one region per bottleneck in the lab).  Per phase this module reports:

* **flows** (:class:`CostFlows`): per flow role x arm, completion time (median with its
  order-statistic 95 % interval, mean with a t interval, p90), throughput, retransmissions.
  Page loads count *pages*: a page's time runs from its first connection's start to its last
  connection's end.
* **interactive** (:class:`CostInteractive`): the competing interactive flow's queueing delay
  (round-trip time above the bottleneck's base, the lowest RTT any interactive packet of the
  region saw) at p50 and p99 and its loss.  Consecutive packets see the same queue, so their
  samples are not independent: intervals come from a moving-block bootstrap (blocks of one
  second of packets, whole interactive flows kept apart), not from formulas for independent
  samples.
* **interference** (:class:`CostInterference`): in a region, a mixed phase (two arms sharing
  the short flows) against the two pure phases with the same arrival rate, sizes and flows:
  the A/B estimate (treatment minus baseline mean completion time *within* the mixed phase)
  and the total effect (all-treatment phase minus all-baseline phase); their difference is the
  interference bias of an A/B test on a shared bottleneck (Spang et al., IMC 2021).  Intervals
  by bootstrap of flows within each phase.

Fewer than :data:`MIN_FLOWS` flows (pages) or :data:`MIN_DELAY_SAMPLES` packets give no
number, only ``n``: the dashboard and the report say "n too small".
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis.filters import Filters
from iwscope.analysis.stats import median_interval, proportion_interval, t_quantile

#: Fewest flows (pages) a completion-time number is shown for.
MIN_FLOWS = 6
#: Fewest interactive packets a delay percentile is shown for.
MIN_DELAY_SAMPLES = 50
#: Bootstrap replicates (seeded: the same data give the same intervals).
BOOTSTRAP_REPLICATES = 2000
#: Block length of the interactive flow's moving-block bootstrap, seconds of packets.
DELAY_BLOCK_S = 1.0

_COST_CAMPAIGN_SQL = """(c.arrival_rate_per_s IS NOT NULL OR c.background_bytes IS NOT NULL
    OR c.interactive_interval_us IS NOT NULL OR c.page_connections IS NOT NULL OR c.arm_shares IS NOT NULL
    OR c.arm_labels IS NOT NULL)"""


@dataclass(frozen=True)
class CostCampaign:
    """One phase: the campaign's design and the bottleneck (probe region) it ran on."""

    campaign_id: int
    name: str
    region: str
    #: Arm labels with their share of the short flows (``None``: every arm every size).
    arms: list[str]
    shares: list[float] | None
    arrival_rate_per_s: float | None
    background_bytes: int | None
    interactive: bool
    page_connections: int | None
    #: e.g. ``"10"``, ``"10 75% + 32 25%"``.
    mix: str


@dataclass(frozen=True)
class CostFlows:
    """Flows of one role and arm in one phase (``n``: flows, or pages for ``page-load``)."""

    campaign_id: int
    region: str
    role: str
    arm: str
    iw: int
    #: The arm's share of the phase's short flows (``None`` in the paired design).
    share: float | None
    n: int
    errors: int
    fct_p50_ms: float | None
    fct_p50_ci_ms: tuple[float, float] | None
    fct_mean_ms: float | None
    fct_mean_ci_ms: tuple[float, float] | None
    fct_p90_ms: float | None
    throughput_bps: float | None
    retrans_flow_share: float | None
    bytes_retrans_share: float | None
    joined_flows: int


@dataclass(frozen=True)
class CostInteractive:
    """The interactive flow of one phase."""

    campaign_id: int
    region: str
    flows: int
    sent: int
    received: int
    loss_share: float | None
    loss_ci: tuple[float, float] | None
    #: Lowest RTT of any interactive packet in the region (the bottleneck's empty-queue RTT).
    base_rtt_ms: float | None
    samples: int
    delay_p50_ms: float | None
    delay_p50_ci_ms: tuple[float, float] | None
    delay_p99_ms: float | None
    delay_p99_ci_ms: tuple[float, float] | None


@dataclass(frozen=True)
class CostInterference:
    """A/B estimate in a mixed phase against the total effect of the pure phases."""

    region: str
    baseline: str
    treatment: str
    treatment_share: float
    mixed_campaign_id: int
    all_baseline_campaign_id: int
    all_treatment_campaign_id: int
    #: Mean completion time, treatment minus baseline, within the mixed phase (ms).
    ab_ms: float | None
    ab_ci_ms: tuple[float, float] | None
    #: All-treatment phase minus all-baseline phase (ms).
    total_ms: float | None
    total_ci_ms: tuple[float, float] | None
    #: ``ab_ms - total_ms``: what an A/B test on this bottleneck gets wrong.
    bias_ms: float | None
    bias_ci_ms: tuple[float, float] | None
    #: Flows: mixed baseline, mixed treatment, all-baseline, all-treatment.
    n: tuple[int, int, int, int]


@dataclass(frozen=True)
class CostReport:
    campaigns: list[CostCampaign] = field(default_factory=list)
    flows: list[CostFlows] = field(default_factory=list)
    interactive: list[CostInteractive] = field(default_factory=list)
    interference: list[CostInterference] = field(default_factory=list)


# ---- statistics ---------------------------------------------------------------------------------

def _rng() -> np.random.Generator:
    return np.random.default_rng(20261124)


def mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """Student t interval of a mean (``None`` below :data:`MIN_FLOWS` values)."""
    n = len(values)
    if n < MIN_FLOWS:
        return None
    array = np.asarray(values, dtype=float)
    half = t_quantile(0.5 + level / 2, n - 1) * float(array.std(ddof=1)) / math.sqrt(n)
    mean = float(array.mean())
    return mean - half, mean + half


def _bootstrap_mean_difference(groups: Sequence[Sequence[float]], signs: Sequence[int],
                               rng: np.random.Generator) -> tuple[float, float] | None:
    """Percentile interval of ``sum(sign * mean(group))``, resampling each group on its own."""
    if any(len(group) < MIN_FLOWS for group in groups):
        return None
    total = np.zeros(BOOTSTRAP_REPLICATES)
    for group, sign in zip(groups, signs, strict=True):
        array = np.asarray(group, dtype=float)
        picks = rng.integers(0, len(array), size=(BOOTSTRAP_REPLICATES, len(array)))
        total += sign * array[picks].mean(axis=1)
    low, high = np.percentile(total, [2.5, 97.5])
    return float(low), float(high)


def block_bootstrap(series: Sequence[np.ndarray], block: int, statistic: Any,
                    rng: np.random.Generator) -> tuple[float, float] | None:
    """Moving-block bootstrap interval of ``statistic(values)`` over several series (the
    interactive flows of a phase): each replicate draws ``ceil(len / block)`` blocks of
    ``block`` consecutive values from each series, so within-block dependence is kept."""
    pieces = [np.asarray(values, dtype=float) for values in series if len(values)]
    if not pieces:
        return None
    estimates = np.empty(BOOTSTRAP_REPLICATES // 4)
    for replicate in range(len(estimates)):
        drawn = []
        for values in pieces:
            length = min(block, len(values))
            starts = rng.integers(0, len(values) - length + 1, size=math.ceil(len(values) / length))
            drawn.append(np.concatenate([values[start:start + length] for start in starts])[:len(values)])
        estimates[replicate] = statistic(np.concatenate(drawn))
    estimates = estimates[np.isfinite(estimates)]
    if not len(estimates):
        return None
    low, high = np.percentile(estimates, [2.5, 97.5])
    return float(low), float(high)


# ---- queries ------------------------------------------------------------------------------------

def _where(filters: Filters) -> tuple[str, dict[str, Any]]:
    clauses = [_COST_CAMPAIGN_SQL]
    params: dict[str, Any] = {}
    if filters.campaign_ids:
        clauses.append("t.campaign_id = ANY(:campaign_ids)")
        params["campaign_ids"] = list(filters.campaign_ids)
    if filters.since is not None:
        clauses.append("t.started_at >= :since")
        params["since"] = filters.since
    if filters.until is not None:
        clauses.append("t.started_at <= :until")
        params["until"] = filters.until
    if filters.regions:
        clauses.append("p.region = ANY(:regions)")
        params["regions"] = list(filters.regions)
    return " AND ".join(clauses), params


_FROM = "FROM trials AS t JOIN campaigns AS c ON c.id = t.campaign_id JOIN probes AS p ON p.id = t.probe_id"


def _mix(arms: Sequence[str], shares: Sequence[float] | None) -> str:
    if not shares:
        return " + ".join(arms)
    return " + ".join(f"{arm} {share * 100:.0f}%" for arm, share in zip(arms, shares, strict=True) if share > 0)


def _completion_stats(times_us: Sequence[float]) -> dict[str, Any]:
    times_ms = sorted(value / 1000.0 for value in times_us)
    n = len(times_ms)
    if n < MIN_FLOWS:
        return {"fct_p50_ms": None, "fct_p50_ci_ms": None, "fct_mean_ms": None, "fct_mean_ci_ms": None,
                "fct_p90_ms": None}
    return {"fct_p50_ms": float(np.median(times_ms)), "fct_p50_ci_ms": median_interval(times_ms),
            "fct_mean_ms": float(np.mean(times_ms)), "fct_mean_ci_ms": mean_interval(times_ms),
            "fct_p90_ms": float(np.percentile(times_ms, 90))}


def cost(session: Session, filters: Filters) -> CostReport:
    """The cost report of the cost campaigns matching ``filters`` (campaigns, time, regions)."""
    where, params = _where(filters)
    campaign_rows = session.execute(text(f"""
        SELECT c.id, c.name, min(p.region) AS region, c.arms, c.arm_labels, c.arm_shares, c.arrival_rate_per_s,
               c.background_bytes, c.interactive_interval_us, c.page_connections
        {_FROM} WHERE {where}
        GROUP BY c.id ORDER BY c.id"""), params).all()
    campaigns: dict[int, CostCampaign] = {}
    for row in campaign_rows:
        arms = list(row.arm_labels) if row.arm_labels else [str(iw) for iw in row.arms]
        shares = list(row.arm_shares) if row.arm_shares else None
        campaigns[int(row.id)] = CostCampaign(
            campaign_id=int(row.id), name=row.name, region=row.region, arms=arms, shares=shares,
            arrival_rate_per_s=row.arrival_rate_per_s, background_bytes=row.background_bytes,
            interactive=row.interactive_interval_us is not None, page_connections=row.page_connections,
            mix=_mix(arms, shares))
    if not campaigns:
        return CostReport()
    flows = _flows(session, where, params, campaigns)
    interactive = _interactive(session, where, params, campaigns)
    interference = _interference(session, where, params, campaigns)
    return CostReport(campaigns=list(campaigns.values()), flows=flows, interactive=interactive,
                      interference=interference)


def _flows(session: Session, where: str, params: dict[str, Any],
           campaigns: dict[int, CostCampaign]) -> list[CostFlows]:
    rows = session.execute(text(f"""
        WITH units AS (
            SELECT t.campaign_id, t.role, COALESCE(t.arm, t.arm_iw::text) AS arm, t.arm_iw,
                   COALESCE(t.page_id, t.trial_id) AS unit,
                   bool_or(t.error_kind IS NOT NULL) AS failed,
                   sum(t.object_size) AS bytes,
                   (extract(epoch FROM max(t.started_at + t.total_us * interval '1 microsecond')
                                       - min(t.started_at)) * 1e6)::float8 AS unit_us,
                   bool_or(t.server_total_retrans > 0) AS retransmitted,
                   bool_and(t.server_total_retrans IS NOT NULL) AS joined,
                   sum(t.server_bytes_retrans) AS bytes_retrans, sum(t.server_bytes_sent) AS bytes_sent
            {_FROM} WHERE {where} AND t.role <> 'interactive'
            GROUP BY 1, 2, 3, 4, 5)
        SELECT campaign_id, role, arm, arm_iw, count(*) AS n, count(*) FILTER (WHERE failed) AS errors,
               array_agg(unit_us) FILTER (WHERE NOT failed AND unit_us > 0) AS times_us,
               (avg(bytes * 8.0e6 / unit_us) FILTER (WHERE NOT failed AND unit_us > 0))::float8 AS throughput_bps,
               count(*) FILTER (WHERE joined) AS joined_units,
               count(*) FILTER (WHERE joined AND retransmitted) AS retrans_units,
               sum(bytes_retrans) FILTER (WHERE joined) AS bytes_retrans,
               sum(bytes_sent) FILTER (WHERE joined) AS bytes_sent
        FROM units GROUP BY campaign_id, role, arm, arm_iw ORDER BY campaign_id, role, arm_iw, arm"""), params).all()
    points: list[CostFlows] = []
    for row in rows:
        campaign = campaigns.get(int(row.campaign_id))
        if campaign is None:
            continue
        share = None
        if campaign.shares and row.role in ("short", "page-load") and row.arm in campaign.arms:
            share = campaign.shares[campaign.arms.index(row.arm)]
        joined = int(row.joined_units)
        points.append(CostFlows(
            campaign_id=campaign.campaign_id, region=campaign.region, role=row.role, arm=row.arm, iw=int(row.arm_iw),
            share=share, n=int(row.n), errors=int(row.errors), **_completion_stats(row.times_us or []),
            throughput_bps=float(row.throughput_bps) if row.throughput_bps is not None else None,
            retrans_flow_share=int(row.retrans_units) / joined if joined else None,
            bytes_retrans_share=(float(row.bytes_retrans) / float(row.bytes_sent)
                                 if joined and row.bytes_sent else None),
            joined_flows=joined))
    return points


def _interactive(session: Session, where: str, params: dict[str, Any],
                 campaigns: dict[int, CostCampaign]) -> list[CostInteractive]:
    rows = session.execute(text(f"""
        SELECT t.campaign_id, t.echo {_FROM}
        WHERE {where} AND t.role = 'interactive' AND t.echo IS NOT NULL
        ORDER BY t.campaign_id, t.started_at"""), params).all()
    per_campaign: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        per_campaign[int(row.campaign_id)].append(row.echo)
    base_by_region: dict[str, float] = {}
    for campaign_id, echoes in per_campaign.items():
        region = campaigns[campaign_id].region if campaign_id in campaigns else ""
        for echo in echoes:
            received = [value for value in echo["rtt_us"] if value is not None]
            if received:
                base_by_region[region] = min(base_by_region.get(region, math.inf), float(min(received)))
    rng = _rng()
    points: list[CostInteractive] = []
    for campaign_id, echoes in sorted(per_campaign.items()):
        campaign = campaigns.get(campaign_id)
        if campaign is None:
            continue
        base_us = base_by_region.get(campaign.region)
        sent = sum(int(echo["sent"]) for echo in echoes)
        received = sum(int(echo["received"]) for echo in echoes)
        delays = [np.asarray([value - base_us for value in echo["rtt_us"] if value is not None], dtype=float) / 1000.0
                  for echo in echoes] if base_us is not None else []
        lost = [np.asarray([value is None for value in echo["rtt_us"]], dtype=float) for echo in echoes]
        samples = sum(len(values) for values in delays)
        block = max(1, round(DELAY_BLOCK_S * 1e6 / max(1, int(echoes[0]["interval_us"]))))
        enough = samples >= MIN_DELAY_SAMPLES
        pooled = np.concatenate(delays) if delays and samples else np.empty(0)
        points.append(CostInteractive(
            campaign_id=campaign_id, region=campaign.region, flows=len(echoes), sent=sent, received=received,
            loss_share=(sent - received) / sent if sent else None,
            loss_ci=(block_bootstrap(lost, block, np.mean, rng) if sent >= MIN_DELAY_SAMPLES
                     else proportion_interval(sent - received, sent)),
            base_rtt_ms=base_us / 1000.0 if base_us is not None else None, samples=samples,
            delay_p50_ms=float(np.percentile(pooled, 50)) if enough else None,
            delay_p50_ci_ms=block_bootstrap(delays, block, lambda v: np.percentile(v, 50), rng) if enough else None,
            delay_p99_ms=float(np.percentile(pooled, 99)) if enough else None,
            delay_p99_ci_ms=block_bootstrap(delays, block, lambda v: np.percentile(v, 99), rng) if enough else None))
    return points


def _same_design(one: CostCampaign, other: CostCampaign) -> bool:
    return (one.region == other.region and one.background_bytes == other.background_bytes
            and one.page_connections == other.page_connections and one.interactive == other.interactive
            and (one.arrival_rate_per_s is None) == (other.arrival_rate_per_s is None)
            and (one.arrival_rate_per_s is None or other.arrival_rate_per_s is None
                 or math.isclose(one.arrival_rate_per_s, other.arrival_rate_per_s, rel_tol=0.02)))


def _arm_order(label: str) -> tuple[int, int, str]:
    """Baseline first: the smaller IW; at equal IW the plain arm, then paced, then learned."""
    if label == "learned":
        return (10**6, 2, label)
    return (int(label.rstrip("p")), 1 if label.endswith("p") else 0, label)


def _interference(session: Session, where: str, params: dict[str, Any],
                  campaigns: dict[int, CostCampaign]) -> list[CostInterference]:
    mixed = [campaign for campaign in campaigns.values()
             if campaign.shares and sum(share > 0 for share in campaign.shares) == 2]
    if not mixed:
        return []
    rows = session.execute(text(f"""
        SELECT t.campaign_id, COALESCE(t.arm, t.arm_iw::text) AS arm, array_agg(t.total_us) AS times_us
        {_FROM} WHERE {where} AND t.role = 'short' AND t.error_kind IS NULL AND t.total_us > 0
        GROUP BY t.campaign_id, 2"""), params).all()
    times = {(int(row.campaign_id), row.arm): [value / 1000.0 for value in row.times_us] for row in rows}
    rng = _rng()
    results: list[CostInterference] = []
    for phase in mixed:
        used = [arm for arm, share in zip(phase.arms, phase.shares or [], strict=True) if share > 0]
        baseline, treatment = sorted(used, key=_arm_order)
        share = (phase.shares or [])[phase.arms.index(treatment)]

        def pure(arm: str) -> CostCampaign | None:
            candidates = [c for c in campaigns.values() if _same_design(c, phase)
                          and [a for a, s in zip(c.arms, c.shares or [1.0] * len(c.arms), strict=True) if s > 0] == [arm]]
            return max(candidates, key=lambda c: c.campaign_id) if candidates else None

        all_baseline, all_treatment = pure(baseline), pure(treatment)
        if all_baseline is None or all_treatment is None:
            continue
        groups = [times.get((phase.campaign_id, baseline), []), times.get((phase.campaign_id, treatment), []),
                  times.get((all_baseline.campaign_id, baseline), []),
                  times.get((all_treatment.campaign_id, treatment), [])]
        enough = all(len(group) >= MIN_FLOWS for group in groups)
        means = [float(np.mean(group)) if group else math.nan for group in groups]
        ab = means[1] - means[0] if enough else None
        total = means[3] - means[2] if enough else None
        results.append(CostInterference(
            region=phase.region, baseline=baseline, treatment=treatment, treatment_share=share,
            mixed_campaign_id=phase.campaign_id, all_baseline_campaign_id=all_baseline.campaign_id,
            all_treatment_campaign_id=all_treatment.campaign_id,
            ab_ms=ab, ab_ci_ms=_bootstrap_mean_difference(groups[:2], (-1, 1), rng) if enough else None,
            total_ms=total, total_ci_ms=_bootstrap_mean_difference(groups[2:], (-1, 1), rng) if enough else None,
            bias_ms=ab - total if ab is not None and total is not None else None,
            bias_ci_ms=_bootstrap_mean_difference(groups, (-1, 1, 1, -1), rng) if enough else None,
            n=(len(groups[0]), len(groups[1]), len(groups[2]), len(groups[3]))))
    return results


__all__ = ["CostCampaign", "CostFlows", "CostInteractive", "CostInterference", "CostReport", "cost",
           "mean_interval", "block_bootstrap", "MIN_FLOWS", "MIN_DELAY_SAMPLES"]

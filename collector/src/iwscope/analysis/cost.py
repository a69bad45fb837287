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
  samples are not independent: intervals come from a moving-block bootstrap (blocks of
  :data:`DELAY_BLOCK_S` of packets, longer than one burst's queue episode at either lab
  buffer; whole interactive flows kept apart), and need :data:`MIN_BLOCKS` blocks (with fewer,
  no quantile is shown: never a number without its interval).  A p99 needs
  :data:`MIN_P99_SAMPLES` packets: fewer cannot bracket it (the sample maximum is below the
  99th percentile with more than 2.5 % probability).
* **interference** (:class:`CostInterference`): in a region, a mixed phase (two arms sharing
  the short flows) against the two pure phases with the same arrival rate, sizes and flows:
  the A/B estimate (treatment minus baseline mean completion time *within* the mixed phase)
  and the total effect (all-treatment phase minus all-baseline phase); their difference is the
  interference bias of an A/B test on a shared bottleneck (Spang et al., IMC 2021).  Intervals
  by bootstrap of flows within each phase.

Fewer than :data:`MIN_FLOWS` flows (pages) or :data:`MIN_DELAY_SAMPLES` packets give no
number, only ``n``: the dashboard and the report say "n too small".  That includes the bulk
flow's throughput: one bulk flow per round, so a phase needs :data:`MIN_FLOWS` rounds for it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwprobe import wire
from iwscope.analysis.filters import COST_CAMPAIGN_SQL, Filters, trial_where
from iwscope.analysis.stats import (
    BOOTSTRAP_REPLICATES,
    BOOTSTRAP_SEED,
    block_bootstrap,
    mean_interval,
    median_interval,
    multinomial_weights,
    proportion_interval,
)

#: Fewest flows (pages) a completion-time, throughput or retransmission number is shown for.
MIN_FLOWS = 6
#: Fewest interactive packets a median delay or a loss share is shown for.
MIN_DELAY_SAMPLES = 50
#: Fewest packets a p99 is shown for: the smallest n with ``1 - 0.99 ** n >= 0.975``.
MIN_P99_SAMPLES = math.ceil(math.log(0.025) / math.log(0.99))
#: Block length of the interactive flow's moving-block bootstrap, seconds of packets.
DELAY_BLOCK_S = 0.2
#: Fewest blocks a block-bootstrap interval is drawn from.
MIN_BLOCKS = 10


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
    #: Mean over flows of bytes x 8 / completion time, with a t interval.
    throughput_bps: float | None
    throughput_ci_bps: tuple[float, float] | None
    #: Share of joined flows (pages) the origin retransmitted in (Wilson interval).
    retrans_flow_share: float | None
    retrans_flow_share_ci: tuple[float, float] | None
    #: Retransmitted over sent bytes of the joined flows (bootstrap over flows).
    bytes_retrans_share: float | None
    bytes_retrans_share_ci: tuple[float, float] | None
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
    return np.random.default_rng(BOOTSTRAP_SEED)


def _bootstrap_mean_difference(
    groups: Sequence[Sequence[float]], signs: Sequence[int], rng: np.random.Generator
) -> tuple[float, float] | None:
    """Percentile interval of ``sum(sign * mean(group))``, resampling each group on its own."""
    if any(len(group) < MIN_FLOWS for group in groups):
        return None
    total = np.zeros(BOOTSTRAP_REPLICATES)
    for group, sign in zip(groups, signs, strict=True):
        total += sign * (multinomial_weights(rng, BOOTSTRAP_REPLICATES, len(group)) @ np.asarray(group, float)) / len(group)
    low, high = np.percentile(total, [2.5, 97.5])
    return float(low), float(high)


def _bootstrap_ratio(
    numerator: Sequence[float], denominator: Sequence[float], rng: np.random.Generator
) -> tuple[float, float] | None:
    """Percentile interval of ``sum(numerator) / sum(denominator)``, resampling the units."""
    if len(numerator) < MIN_FLOWS:
        return None
    weights = multinomial_weights(rng, BOOTSTRAP_REPLICATES, len(numerator))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = (weights @ np.asarray(numerator, float)) / (weights @ np.asarray(denominator, float))
    ratios = ratios[np.isfinite(ratios)]
    if len(ratios) < 10 or not np.any(np.asarray(numerator, float)):
        return None  # nothing retransmitted: resampling cannot show the uncertainty (see the flow share)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


# ---- queries ------------------------------------------------------------------------------------


def _where(filters: Filters) -> tuple[str, dict[str, Any]]:
    """Cost campaigns matching the campaign, time and region filters (sizes and arms are not
    applied: a phase's flows are shown whole)."""
    where, params = trial_where(replace(filters, size_min=None, size_max=None))
    return f"{COST_CAMPAIGN_SQL} AND {where}", params


_FROM = "FROM trials AS t JOIN campaigns AS c ON c.id = t.campaign_id JOIN probes AS p ON p.id = t.probe_id"


def _mix(arms: Sequence[str], shares: Sequence[float] | None) -> str:
    if not shares:
        return " + ".join(arms)
    return " + ".join(f"{arm} {share * 100:.0f}%" for arm, share in zip(arms, shares, strict=True) if share > 0)


def _completion_stats(times_us: npt.ArrayLike) -> dict[str, Any]:
    times_ms = sorted(float(value) / 1000.0 for value in np.asarray(times_us, dtype=float))
    n = len(times_ms)
    if n < MIN_FLOWS:
        return {"fct_p50_ms": None, "fct_p50_ci_ms": None, "fct_mean_ms": None, "fct_mean_ci_ms": None, "fct_p90_ms": None}
    return {
        "fct_p50_ms": float(np.median(times_ms)),
        "fct_p50_ci_ms": median_interval(times_ms),
        "fct_mean_ms": float(np.mean(times_ms)),
        "fct_mean_ci_ms": mean_interval(times_ms, min_n=MIN_FLOWS),
        "fct_p90_ms": float(np.percentile(times_ms, 90)),
    }


def cost(session: Session, filters: Filters) -> CostReport:
    """The cost report of the cost campaigns matching ``filters`` (campaigns, time, regions)."""
    where, params = _where(filters)
    campaign_rows = session.execute(
        text(f"""
        SELECT c.id, c.name, min(p.region) AS region, c.arms, c.arm_labels, c.arm_shares, c.arrival_rate_per_s,
               c.background_bytes, c.interactive_interval_us, c.page_connections
        {_FROM} WHERE {where}
        GROUP BY c.id ORDER BY c.id"""),
        params,
    ).all()
    campaigns: dict[int, CostCampaign] = {}
    for row in campaign_rows:
        arms = list(row.arm_labels) if row.arm_labels else [str(iw) for iw in row.arms]
        shares = list(row.arm_shares) if row.arm_shares else None
        campaigns[int(row.id)] = CostCampaign(
            campaign_id=int(row.id),
            name=row.name,
            region=row.region,
            arms=arms,
            shares=shares,
            arrival_rate_per_s=row.arrival_rate_per_s,
            background_bytes=row.background_bytes,
            interactive=row.interactive_interval_us is not None,
            page_connections=row.page_connections,
            mix=_mix(arms, shares),
        )
    if not campaigns:
        return CostReport()
    rng = _rng()
    flows, short_times = _flows(session, where, params, campaigns, rng)
    return CostReport(
        campaigns=list(campaigns.values()),
        flows=flows,
        interactive=_interactive(session, where, params, campaigns, rng),
        interference=_interference(campaigns, short_times, rng),
    )


#: Completion times (ms) of the successful short flows per (campaign, arm): the interference input.
ShortTimes = dict[tuple[int, str], list[float]]


def _flows(
    session: Session, where: str, params: dict[str, Any], campaigns: dict[int, CostCampaign], rng: np.random.Generator
) -> tuple[list[CostFlows], ShortTimes]:
    rows = session.execute(
        text(f"""
        WITH units AS (
            SELECT t.campaign_id, t.role, COALESCE(t.arm, t.arm_iw::text) AS arm, t.arm_iw,
                   COALESCE(t.page_id, t.trial_id) AS unit,
                   bool_or(t.error_kind IS NOT NULL) AS failed,
                   sum(t.object_size)::float8 AS bytes,
                   (extract(epoch FROM max(t.started_at + t.total_us * interval '1 microsecond')
                                       - min(t.started_at)) * 1e6)::float8 AS unit_us,
                   bool_or(t.server_total_retrans > 0) AS retransmitted,
                   bool_and(t.server_total_retrans IS NOT NULL) AS joined,
                   sum(t.server_bytes_retrans)::float8 AS bytes_retrans,
                   sum(t.server_bytes_sent)::float8 AS bytes_sent
            {_FROM} WHERE {where} AND t.role <> 'interactive'
            GROUP BY 1, 2, 3, 4, 5)
        SELECT campaign_id, role, arm, arm_iw, count(*) AS n, count(*) FILTER (WHERE failed) AS errors,
               array_agg(unit_us) FILTER (WHERE NOT failed AND unit_us > 0) AS times_us,
               array_agg(bytes) FILTER (WHERE NOT failed AND unit_us > 0) AS bytes,
               count(*) FILTER (WHERE joined) AS joined_units,
               count(*) FILTER (WHERE joined AND retransmitted) AS retrans_units,
               array_agg(bytes_retrans) FILTER (WHERE joined) AS bytes_retrans,
               array_agg(bytes_sent) FILTER (WHERE joined) AS bytes_sent
        FROM units GROUP BY campaign_id, role, arm, arm_iw ORDER BY campaign_id, role, arm_iw, arm"""),
        params,
    ).all()
    points: list[CostFlows] = []
    short_times: ShortTimes = {}
    for row in rows:
        campaign = campaigns.get(int(row.campaign_id))
        if campaign is None:
            continue
        share = None
        if campaign.shares and row.role in ("short", "page-load") and row.arm in campaign.arms:
            share = campaign.shares[campaign.arms.index(row.arm)]
        times_us = np.asarray(row.times_us or [], dtype=float)
        if row.role == "short":
            short_times[(campaign.campaign_id, row.arm)] = list(times_us / 1000.0)
        rates = np.asarray(row.bytes or [], dtype=float) * 8e6 / times_us if len(times_us) else np.empty(0)
        joined = int(row.joined_units)
        enough_joined = joined >= MIN_FLOWS
        sent = float(sum(row.bytes_sent)) if enough_joined else 0.0
        points.append(
            CostFlows(
                campaign_id=campaign.campaign_id,
                region=campaign.region,
                role=row.role,
                arm=row.arm,
                iw=int(row.arm_iw),
                share=share,
                n=int(row.n),
                errors=int(row.errors),
                **_completion_stats(times_us),
                throughput_bps=float(rates.mean()) if len(rates) >= MIN_FLOWS else None,
                throughput_ci_bps=mean_interval(rates, min_n=MIN_FLOWS),
                retrans_flow_share=int(row.retrans_units) / joined if enough_joined else None,
                retrans_flow_share_ci=proportion_interval(int(row.retrans_units), joined) if enough_joined else None,
                bytes_retrans_share=float(sum(row.bytes_retrans)) / sent if sent else None,
                bytes_retrans_share_ci=_bootstrap_ratio(row.bytes_retrans, row.bytes_sent, rng) if sent else None,
                joined_flows=joined,
            )
        )
    return points, short_times


def _loss_interval(lost: Sequence[np.ndarray], block: int) -> tuple[float, float] | None:
    """Wilson interval of the loss share over packets (``lost``: one 0/1 array per interactive
    flow) with the sample size shrunk by the design effect of bursty losses: the variance of
    the means of blocks of ``block`` consecutive packets (batch means) over the variance
    independent packets would give.  With fewer than :data:`MIN_BLOCKS` blocks the effect is
    taken as ``block`` (every block one unit).  Unlike a bootstrap it does not collapse to
    [0, 0] when nothing was lost (the design effect is then 1)."""
    sent = sum(len(flags) for flags in lost)
    if not sent:
        return None
    share = sum(float(flags.sum()) for flags in lost) / sent
    means = [
        float(flags[start : start + block].mean())
        for flags in lost
        for start in range(0, len(flags), block)
        if len(flags[start : start + block]) == block
    ]
    if len(means) < MIN_BLOCKS:
        effect = float(block)
    elif 0 < share < 1:
        effect = max(1.0, float(np.var(means, ddof=1)) / len(means) / (share * (1 - share) / sent))
    else:
        effect = 1.0
    return proportion_interval(share * sent / effect, sent / effect)


def _delay_quantiles(
    delays: Sequence[np.ndarray], block: int, rng: np.random.Generator
) -> tuple[float | None, tuple[float, float] | None, float | None, tuple[float, float] | None]:
    """p50 and p99 of the pooled delays with their block-bootstrap intervals (one resampling for
    both): a p50 needs :data:`MIN_DELAY_SAMPLES` packets, a p99 :data:`MIN_P99_SAMPLES`, and
    either needs its interval (:data:`MIN_BLOCKS` blocks): a quantile is never shown alone."""
    samples = sum(len(values) for values in delays)
    if samples < MIN_DELAY_SAMPLES:
        return None, None, None, None
    intervals = block_bootstrap(delays, block, lambda values: np.percentile(values, [50, 99]), rng, min_blocks=MIN_BLOCKS)
    if intervals is None:
        return None, None, None, None
    p50, p99 = (float(value) for value in np.percentile(np.concatenate(delays), [50, 99]))
    p50_ci = (float(intervals[0][0]), float(intervals[0][1]))
    if samples < MIN_P99_SAMPLES:
        return p50, p50_ci, None, None
    return p50, p50_ci, p99, (float(intervals[1][0]), float(intervals[1][1]))


def _interactive(
    session: Session, where: str, params: dict[str, Any], campaigns: dict[int, CostCampaign], rng: np.random.Generator
) -> list[CostInteractive]:
    rows = session.execute(
        text(f"""
        SELECT t.campaign_id, t.echo {_FROM}
        WHERE {where} AND t.role = 'interactive' AND t.echo IS NOT NULL
        ORDER BY t.campaign_id, t.started_at"""),
        params,
    ).all()
    per_campaign: dict[int, list[np.ndarray]] = defaultdict(list)  # RTT per packet sent, NaN = lost
    interval_us: dict[int, int] = {}
    for row in rows:
        if int(row.campaign_id) in campaigns:
            per_campaign[int(row.campaign_id)].append(
                np.asarray([np.nan if rtt is None else rtt for rtt in row.echo["rtt_us"]], dtype=float)
            )
            interval_us[int(row.campaign_id)] = int(row.echo["interval_us"])
    base_by_region: dict[str, float] = {}
    for campaign_id, flows in per_campaign.items():
        region = campaigns[campaign_id].region
        lowest = min((np.nanmin(rtts) for rtts in flows if np.isfinite(rtts).any()), default=math.inf)
        base_by_region[region] = min(base_by_region.get(region, math.inf), lowest)
    points: list[CostInteractive] = []
    for campaign_id, flows in sorted(per_campaign.items()):
        campaign = campaigns[campaign_id]
        base_us = base_by_region[campaign.region]
        delays = [(rtts[np.isfinite(rtts)] - base_us) / 1000.0 for rtts in flows]
        lost = [np.isnan(rtts).astype(float) for rtts in flows]
        sent = sum(len(rtts) for rtts in flows)
        samples = sum(len(values) for values in delays)
        block = max(1, round(DELAY_BLOCK_S * 1e6 / max(1, interval_us[campaign_id])))
        p50, p50_ci, p99, p99_ci = _delay_quantiles(delays, block, rng)
        enough_sent = sent >= MIN_DELAY_SAMPLES
        points.append(
            CostInteractive(
                campaign_id=campaign_id,
                region=campaign.region,
                flows=len(flows),
                sent=sent,
                received=samples,
                loss_share=(sent - samples) / sent if enough_sent else None,
                loss_ci=_loss_interval(lost, block) if enough_sent else None,
                base_rtt_ms=base_us / 1000.0 if math.isfinite(base_us) else None,
                samples=samples,
                delay_p50_ms=p50,
                delay_p50_ci_ms=p50_ci,
                delay_p99_ms=p99,
                delay_p99_ci_ms=p99_ci,
            )
        )
    return points


def _same_design(one: CostCampaign, other: CostCampaign) -> bool:
    return (
        one.region == other.region
        and one.background_bytes == other.background_bytes
        and one.page_connections == other.page_connections
        and one.interactive == other.interactive
        and (one.arrival_rate_per_s is None) == (other.arrival_rate_per_s is None)
        and (
            one.arrival_rate_per_s is None
            or other.arrival_rate_per_s is None
            or math.isclose(one.arrival_rate_per_s, other.arrival_rate_per_s, rel_tol=0.02)
        )
    )


def arm_order(label: str) -> tuple[int, int, str]:
    """Baseline first: the smaller IW; at equal IW the plain arm, then paced, then learned (a QUIC
    arm, ``10q``/``10pq``, right after its TCP arm)."""
    kind = 2 if label == "learned" else 1 if wire.tcp_arm_label(label).endswith("p") else 0
    return (10**6 if kind == 2 else wire.arm_label_iw(label), kind, label)


def _pure_phase(campaigns: dict[int, CostCampaign], like: CostCampaign, arm: str) -> CostCampaign | None:
    """The latest phase of ``like``'s design whose short flows all use ``arm``."""
    candidates = [campaign for campaign in campaigns.values() if _same_design(campaign, like) and used_arms(campaign) == [arm]]
    return max(candidates, key=lambda campaign: campaign.campaign_id, default=None)


def used_arms(campaign: CostCampaign) -> list[str]:
    """The arms a phase's short flows used (a share of 0 leaves an arm out)."""
    return [arm for arm, share in zip(campaign.arms, campaign.shares or [1.0] * len(campaign.arms), strict=True) if share > 0]


def _interference(campaigns: dict[int, CostCampaign], times: ShortTimes, rng: np.random.Generator) -> list[CostInterference]:
    results: list[CostInterference] = []
    for phase in campaigns.values():
        used = used_arms(phase)
        if not phase.shares or len(used) != 2:
            continue
        baseline, treatment = sorted(used, key=arm_order)
        all_baseline, all_treatment = _pure_phase(campaigns, phase, baseline), _pure_phase(campaigns, phase, treatment)
        if all_baseline is None or all_treatment is None:
            continue
        groups = [
            times.get((phase.campaign_id, baseline), []),
            times.get((phase.campaign_id, treatment), []),
            times.get((all_baseline.campaign_id, baseline), []),
            times.get((all_treatment.campaign_id, treatment), []),
        ]
        enough = all(len(group) >= MIN_FLOWS for group in groups)
        means = [float(np.mean(group)) if enough else math.nan for group in groups]
        ab = means[1] - means[0] if enough else None
        total = means[3] - means[2] if enough else None
        results.append(
            CostInterference(
                region=phase.region,
                baseline=baseline,
                treatment=treatment,
                treatment_share=phase.shares[phase.arms.index(treatment)],
                mixed_campaign_id=phase.campaign_id,
                all_baseline_campaign_id=all_baseline.campaign_id,
                all_treatment_campaign_id=all_treatment.campaign_id,
                ab_ms=ab,
                ab_ci_ms=_bootstrap_mean_difference(groups[:2], (-1, 1), rng),
                total_ms=total,
                total_ci_ms=_bootstrap_mean_difference(groups[2:], (-1, 1), rng),
                bias_ms=ab - total if ab is not None and total is not None else None,
                bias_ci_ms=_bootstrap_mean_difference(groups, (-1, 1, 1, -1), rng),
                n=(len(groups[0]), len(groups[1]), len(groups[2]), len(groups[3])),
            )
        )
    return results


__all__ = [
    "CostCampaign",
    "CostFlows",
    "CostInteractive",
    "CostInterference",
    "CostReport",
    "cost",
    "arm_order",
    "used_arms",
    "MIN_FLOWS",
    "MIN_DELAY_SAMPLES",
    "MIN_P99_SAMPLES",
    "MIN_BLOCKS",
    "DELAY_BLOCK_S",
]

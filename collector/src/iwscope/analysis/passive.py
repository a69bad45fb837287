"""The passive, real-user study: what ``iwprobe tap`` servers measured of their users.

The IETF 78 design of the IW10 authors on an operator's own server: client prefixes are split
by a keyed hash into arms (e.g. 90 % ``default`` -- the server's own IW --, 5 % IW16, 5 % IW32),
every connection is measured passively, and the server uploads hourly mergeable aggregates
(``passive_aggregates``) and a sampled share of raw connections (``passive_connections``).

Public functions (each takes a session first and returns frozen dataclasses of
:mod:`iwscope.analysis.passive_results`):

* :func:`passive_summary`: the seed's percentile table per arm (n, avg, p50, p75, p90, p99 of the
  first-response latency, and per treated arm "Impr." in ms and "% Impr."), the retransmission
  rate per arm with its increase over the baseline, and the biased shares per arm;
* :func:`passive_buckets`: the Figure 5 trio -- mean and median per arm and their improvement
  over the baseline per RTT, bandwidth or BDP bucket of the connection's own measurements;
* :func:`passive_regions`, :func:`passive_days`: the table per client region, the mean and
  median improvement per UTC day;
* :func:`passive_share_sweep`: the default arm's latency and retransmissions per treated share
  (the interference an A/B split hides: Spang et al., IMC 2021);
* :func:`passive_campaigns`, :func:`passive_load`: the passive campaigns, and what aggregates
  cost the collector against raw records per server and day.

Statistics: :mod:`iwscope.analysis.passive_stats` (cluster bootstrap over the 32 prefix
clusters, independently per arm; "n too small" thresholds; histogram resolution +-1 %).
The baseline arm is ``default`` when the campaign has one, else the smallest IW (or the
filters' ``baseline``).
"""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import text
from sqlalchemy.orm import Session

from iwprobe import wire
from iwscope.analysis.buckets import BANDWIDTH_BUCKETS, BDP_BUCKETS, RTT_BUCKETS, Bucket
from iwscope.analysis.passive_frames import (
    PassiveCampaignRef,
    PassiveFilters,
    aggregate_where,
    arm_order,
    arm_windows,
    as_utc,
    choose_baseline,
    hour_range,
    load_groups,
    resolve_campaign,
)
from iwscope.analysis.passive_results import (
    PassiveArmBias,
    PassiveArmCentre,
    PassiveArmPercentiles,
    PassiveArmRetrans,
    PassiveArmShare,
    PassiveBuckets,
    PassiveCampaign,
    PassiveGroupRow,
    PassiveLoadDay,
    PassiveMethod,
    PassiveOptions,
    PassivePercentileTable,
    PassiveSharePoint,
    PassiveShareSweep,
    PassiveSummary,
)
from iwscope.analysis.passive_stats import (
    HIST_RESOLUTION_PCT,
    LATENCY_KEYS,
    MIN_CLUSTERS,
    MIN_CONNECTIONS,
    MIN_RESPONSES,
    PASSIVE_REPLICATES,
    PASSIVE_SEED,
    ClusterSums,
    Value,
    count_too_small,
    empty_sums,
    improvement,
    latency_estimate,
    paired_change,
    paired_latency,
    paired_rate,
    paired_rate_change,
    paired_weights,
    rate_difference,
    rate_estimate,
    stable_key,
)

PassiveDimension = Literal["rtt", "bandwidth", "bdp"]
PASSIVE_DIMENSIONS: tuple[PassiveDimension, ...] = ("rtt", "bandwidth", "bdp")
_BUCKETS: dict[str, list[Bucket]] = {"rtt": RTT_BUCKETS, "bandwidth": BANDWIDTH_BUCKETS, "bdp": BDP_BUCKETS}
#: How a client region the server could not tell is shown.
UNKNOWN_REGION = "unknown"


def method(filters: PassiveFilters) -> PassiveMethod:
    return PassiveMethod(
        replicates=PASSIVE_REPLICATES,
        seed=PASSIVE_SEED,
        clusters=wire.PASSIVE_CLUSTER_GROUPS,
        min_responses=MIN_RESPONSES,
        min_connections=MIN_CONNECTIONS,
        min_clusters=MIN_CLUSTERS,
        hist_resolution_pct=HIST_RESOLUTION_PCT,
        include_biased=filters.include_biased,
    )


class _Context:
    """The campaign, its arms and the baseline an analysis of ``filters`` is about."""

    def __init__(self, session: Session, filters: PassiveFilters) -> None:
        self.filters = filters
        self.campaign: PassiveCampaignRef | None = resolve_campaign(session, filters)
        self.windows: dict[str, int | None] = {}
        self.arms: list[str] = []
        self.baseline: str | None = None
        if self.campaign is None:
            return
        self.where, self.params = aggregate_where(filters, self.campaign.campaign_id)
        self.windows = arm_windows(session, *aggregate_where(filters, self.campaign.campaign_id, biased=True, sweep=True))
        arms = {arm for arm, _ in self.campaign.arms} | set(self.windows)
        self.baseline = choose_baseline(sorted(arms), filters.baseline)
        self.arms = arm_order(sorted(arms), self.baseline)

    def iw(self, arm: str) -> int | None:
        return int(arm) if arm.isdigit() else self.windows.get(arm)


# ---- tables ---------------------------------------------------------------------------------------


def _percentile_table(context: _Context, group: str, data: dict[str, ClusterSums]) -> PassivePercentileTable:
    estimates = {arm: latency_estimate(data.get(arm) or empty_sums(), stable_key("latency", group, arm)) for arm in context.arms}
    rows = []
    for arm in context.arms:
        estimate = estimates[arm]
        improvement_ms: dict[str, Value] | None = None
        improvement_pct: dict[str, Value] | None = None
        if arm != context.baseline and context.baseline is not None:
            pairs = {key: improvement(estimates[context.baseline], estimate, key) for key in LATENCY_KEYS}
            improvement_ms = {key: pair[0] for key, pair in pairs.items()}
            improvement_pct = {key: pair[1] for key, pair in pairs.items()}
        rows.append(
            PassiveArmPercentiles(
                arm=arm,
                iw=context.iw(arm),
                baseline=arm == context.baseline,
                connections=int((data.get(arm) or empty_sums()).total("connections")),
                responses=estimate.responses,
                clusters=estimate.clusters,
                too_small=estimate.too_small,
                latency_ms={key: estimate.value(key) for key in LATENCY_KEYS},
                improvement_ms=improvement_ms,
                improvement_pct=improvement_pct,
            )
        )
    return PassivePercentileTable(group=group, baseline_arm=context.baseline, arms=rows)


def _retransmissions(context: _Context, data: dict[str, ClusterSums]) -> list[PassiveArmRetrans]:
    rates = {
        arm: rate_estimate(data.get(arm) or empty_sums(), "total_retrans", "data_segs_out", stable_key("retrans-rate", arm))
        for arm in context.arms
    }
    shares = {
        arm: rate_estimate(data.get(arm) or empty_sums(), "retrans_connections", "connections", stable_key("retrans-share", arm))
        for arm in context.arms
    }
    rows = []
    for arm in context.arms:
        sums = data.get(arm) or empty_sums()
        treated = arm != context.baseline and context.baseline is not None
        rows.append(
            PassiveArmRetrans(
                arm=arm,
                iw=context.iw(arm),
                baseline=not treated,
                connections=int(sums.total("connections")),
                clusters=sums.size,
                data_segs_out=int(sums.total("data_segs_out")),
                total_retrans=int(sums.total("total_retrans")),
                retrans_connections=int(sums.total("retrans_connections")),
                too_small=count_too_small(sums.total("connections"), sums.size),
                retrans_rate=rates[arm].value(),
                retrans_conn_share=shares[arm].value(),
                rate_increase_pp=rate_difference(rates[str(context.baseline)], rates[arm]) if treated else None,
                conn_share_increase_pp=rate_difference(shares[str(context.baseline)], shares[arm]) if treated else None,
            )
        )
    return rows


def _biased(context: _Context, data: dict[str, ClusterSums]) -> list[PassiveArmBias]:
    rows = []
    for arm in context.arms:
        sums = data.get(arm) or empty_sums()

        def share(name: str, sums: ClusterSums = sums, arm: str = arm) -> Value:
            return rate_estimate(sums, name, "connections", stable_key("bias", name, arm)).value()

        rows.append(
            PassiveArmBias(
                arm=arm,
                iw=context.iw(arm),
                connections=int(sums.total("connections")),
                clusters=sums.size,
                too_small=count_too_small(sums.total("connections"), sums.size),
                biased_connections=int(sums.total("biased_connections")),
                biased_share=share("biased_connections"),
                syn_retrans=int(sums.total("syn_retrans")),
                syn_retrans_share=share("syn_retrans"),
                rwnd_limited=int(sums.total("rwnd_limited")),
                rwnd_limited_share=share("rwnd_limited"),
                reused_after_idle=int(sums.total("reused_after_idle")),
                reused_after_idle_share=share("reused_after_idle"),
                tls=int(sums.total("tls")),
                tls_share=share("tls"),
            )
        )
    return rows


def _by_arm(groups: dict[tuple[str, str], ClusterSums], group: str) -> dict[str, ClusterSums]:
    return {arm: sums for (arm, key), sums in groups.items() if key == group}


def passive_summary(session: Session, filters: PassiveFilters) -> PassiveSummary:
    """The percentile table per arm, retransmissions per arm and biased shares per arm."""
    context = _Context(session, filters)
    if context.campaign is None:
        return PassiveSummary(
            campaign_id=filters.campaign_id,
            campaign_name=None,
            baseline_arm=None,
            first_hour=None,
            last_hour=None,
            method=method(filters),
            overall=PassivePercentileTable(group="all", baseline_arm=None),
        )
    data = _by_arm(load_groups(session, context.where, context.params, "all"), "")
    if filters.include_biased:
        everything = data
    else:
        where, params = aggregate_where(filters, context.campaign.campaign_id, biased=True)
        everything = _by_arm(load_groups(session, where, params, "all"), "")
    first, last = hour_range(session, context.where, context.params)
    return PassiveSummary(
        campaign_id=context.campaign.campaign_id,
        campaign_name=context.campaign.name,
        baseline_arm=context.baseline,
        first_hour=first,
        last_hour=last,
        method=method(filters),
        overall=_percentile_table(context, "all", data),
        retransmissions=_retransmissions(context, data),
        biased=_biased(context, everything),
    )


# ---- grouped views --------------------------------------------------------------------------------


def _centres(context: _Context, group: str, data: dict[str, ClusterSums]) -> list[PassiveArmCentre]:
    estimates = {
        arm: latency_estimate(data.get(arm) or empty_sums(), stable_key("centre", group, arm), ("p50",)) for arm in context.arms
    }
    rows = []
    for arm in context.arms:
        estimate = estimates[arm]
        treated = arm != context.baseline and context.baseline is not None
        mean: tuple[Value | None, Value | None] = (None, None)
        median: tuple[Value | None, Value | None] = (None, None)
        if treated:
            mean = improvement(estimates[str(context.baseline)], estimate, "avg")
            median = improvement(estimates[str(context.baseline)], estimate, "p50")
        rows.append(
            PassiveArmCentre(
                arm=arm,
                iw=context.iw(arm),
                baseline=not treated,
                connections=int((data.get(arm) or empty_sums()).total("connections")),
                responses=estimate.responses,
                clusters=estimate.clusters,
                too_small=estimate.too_small,
                mean_ms=estimate.value("avg"),
                median_ms=estimate.value("p50"),
                mean_improvement_ms=mean[0],
                mean_improvement_pct=mean[1],
                median_improvement_ms=median[0],
                median_improvement_pct=median[1],
            )
        )
    return rows


def passive_buckets(session: Session, filters: PassiveFilters, dimension: PassiveDimension) -> PassiveBuckets:
    """Figure 5 of the real users: per bucket of the connection's own min RTT (ms), delivery
    rate (bit/s) or BDP (bytes), the arms' mean and median and their improvement over the
    baseline; buckets without data are left out, unknown buckets counted apart."""
    context = _Context(session, filters)
    if context.campaign is None:
        return PassiveBuckets(dimension=dimension, baseline_arm=None)
    groups = load_groups(session, context.where, context.params, dimension)
    buckets = _BUCKETS[dimension]
    rows = []
    unknown = 0
    for key in sorted({group for _, group in groups}, key=int):
        data = _by_arm(groups, key)
        index = int(key)
        if not 0 <= index < len(buckets):
            unknown += int(sum(sums.total("connections") for sums in data.values()))
            continue
        bucket = buckets[index]
        rows.append(
            PassiveGroupRow(
                group=bucket.label,
                order=bucket.order,
                lower=bucket.lower,
                upper=bucket.upper,
                arms=_centres(context, f"{dimension}:{key}", data),
            )
        )
    return PassiveBuckets(dimension=dimension, baseline_arm=context.baseline, rows=rows, unknown_connections=unknown)


def passive_regions(session: Session, filters: PassiveFilters) -> list[PassivePercentileTable]:
    """The percentile table per client region (``unknown``: the server's map did not say)."""
    context = _Context(session, filters)
    if context.campaign is None:
        return []
    groups = load_groups(session, context.where, context.params, "region")
    return [
        _percentile_table(context, region or UNKNOWN_REGION, _by_arm(groups, region))
        for region in sorted({group for _, group in groups}, key=lambda name: (name == "", name))
    ]


def passive_days(session: Session, filters: PassiveFilters) -> list[PassiveGroupRow]:
    """Per UTC day (of the aggregates' hours): the arms' mean and median and their improvement."""
    context = _Context(session, filters)
    if context.campaign is None:
        return []
    groups = load_groups(session, context.where, context.params, "day")
    return [
        PassiveGroupRow(
            group=day, order=order, lower=None, upper=None, arms=_centres(context, f"day:{day}", _by_arm(groups, day))
        )
        for order, day in enumerate(sorted({group for _, group in groups}))
    ]


# ---- the share sweep ------------------------------------------------------------------------------


def passive_share_sweep(session: Session, filters: PassiveFilters) -> PassiveShareSweep:
    """The ``default`` arm (else the baseline) at every treated share the campaign ran (all its
    phases; the phase and share filters do not apply): mean and median latency and retransmission
    rate, and each share's change against the smallest, from paired cluster resamples."""
    context = _Context(session, filters)
    if context.campaign is None:
        return PassiveShareSweep(arm=None, reference_share_bp=None)
    arm = wire.DEFAULT_ARM if wire.DEFAULT_ARM in context.arms else context.baseline
    if arm is None:
        return PassiveShareSweep(arm=None, reference_share_bp=None)
    where, params = aggregate_where(filters, context.campaign.campaign_id, sweep=True)
    where, params = f"{where} AND a.arm = :arm", {**params, "arm": arm}
    groups = load_groups(session, where, params, "share")
    shares = sorted({int(group) for _, group in groups})
    if not shares:
        return PassiveShareSweep(arm=arm, reference_share_bp=None)
    levels = [groups[(arm, str(share))] for share in shares]
    union, weights = paired_weights(levels, stable_key("share-sweep", arm))
    latencies = [paired_latency(level, union, weights) for level in levels]
    rates = [paired_rate(level, union, weights, "total_retrans", "data_segs_out") for level in levels]
    spans = {
        int(row.share): row
        for row in session.execute(
            text(f"""
        SELECT a.treated_share_bp AS share, array_agg(DISTINCT a.phase ORDER BY a.phase) AS phases,
               min(a.hour) AS first_hour, max(a.hour) AS last_hour
          FROM passive_aggregates a WHERE {where} GROUP BY 1"""),
            params,
        )
    }
    points = []
    for index, share in enumerate(shares):
        latency, rate, level, span = latencies[index], rates[index], levels[index], spans.get(share)
        reference = index > 0
        points.append(
            PassiveSharePoint(
                treated_share_bp=share,
                phases=[int(phase) for phase in span.phases] if span else [],
                first_hour=span.first_hour if span else None,
                last_hour=span.last_hour if span else None,
                connections=int(level.total("connections")),
                responses=latency.responses,
                clusters=latency.clusters,
                too_small=latency.too_small,
                mean_ms=latency.value("avg"),
                median_ms=latency.value("p50"),
                retrans_rate=rate.value(),
                mean_change_ms=paired_change(latency, latencies[0], "avg") if reference else None,
                median_change_ms=paired_change(latency, latencies[0], "p50") if reference else None,
                retrans_change_pp=paired_rate_change(rate, rates[0]) if reference else None,
            )
        )
    return PassiveShareSweep(arm=arm, reference_share_bp=shares[0], points=points, iw=context.iw(arm))


# ---- campaigns and the collector's load -------------------------------------------------------------


def passive_campaigns(session: Session) -> list[PassiveCampaign]:
    """Every passive campaign, the one that started last first, with what was uploaded for it."""
    rows = session.execute(
        text("""
        SELECT c.id, c.name, c.server_ids, c.passive_arms, c.phase, c.starts_at, c.ends_at,
               a.rows, a.connections, a.responses, a.first_hour, a.last_hour, r.rows AS raw_rows
          FROM campaigns c
          LEFT JOIN LATERAL (SELECT count(*) AS rows, COALESCE(sum(connections), 0) AS connections,
                                    COALESCE(sum(responses), 0) AS responses, min(hour) AS first_hour,
                                    max(hour) AS last_hour
                               FROM passive_aggregates WHERE campaign_id = c.id) a ON TRUE
          LEFT JOIN LATERAL (SELECT count(*) AS rows FROM passive_connections WHERE campaign_id = c.id) r ON TRUE
         WHERE c.server_ids IS NOT NULL
         ORDER BY c.starts_at DESC, c.id DESC""")
    ).all()
    return [
        PassiveCampaign(
            campaign_id=int(row.id),
            name=row.name,
            server_ids=[str(server) for server in row.server_ids or []],
            arms=[
                PassiveArmShare(str(arm.get("arm")), int(arm.get("share_bp", 0)))
                for arm in (row.passive_arms or [])
                if isinstance(arm, dict)
            ],
            phase=row.phase,
            starts_at=row.starts_at,
            ends_at=row.ends_at,
            aggregate_rows=int(row.rows),
            connections=int(row.connections),
            responses=int(row.responses),
            raw_records=int(row.raw_rows),
            first_hour=row.first_hour,
            last_hour=row.last_hour,
        )
        for row in rows
    ]


def passive_load(session: Session, filters: PassiveFilters) -> list[PassiveLoadDay]:
    """Per server and UTC day: rows and bytes of aggregates against raw connection records (the
    campaign, server and time filters apply; a campaign of ``None``: the latest)."""
    campaign = resolve_campaign(session, filters)
    if campaign is None:
        return []
    params: dict[str, Any] = {
        "campaign": campaign.campaign_id,
        "servers": list(filters.server_ids) or None,
        "since": as_utc(filters.since),
        "until": as_utc(filters.until),
    }

    def condition(alias: str, column: str) -> str:
        parts = [f"{alias}.campaign_id = :campaign"]
        if params["servers"]:
            parts.append(f"{alias}.server_id = ANY(CAST(:servers AS uuid[]))")
        if params["since"] is not None:
            parts.append(f"{alias}.{column} >= :since")
        if params["until"] is not None:
            parts.append(f"{alias}.{column} <= :until")
        return " AND ".join(parts)

    rows = session.execute(
        text(f"""
        WITH agg AS (
            SELECT a.server_id, (a.hour AT TIME ZONE 'UTC')::date AS day, count(*) AS rows,
                   sum(pg_column_size(a.*))::bigint AS bytes, sum(a.connections)::bigint AS connections
              FROM passive_aggregates a WHERE {condition("a", "hour")} GROUP BY 1, 2),
        raw AS (
            SELECT c.server_id, (c.closed_at AT TIME ZONE 'UTC')::date AS day, count(*) AS rows,
                   sum(pg_column_size(c.*))::bigint AS bytes
              FROM passive_connections c WHERE {condition("c", "closed_at")} GROUP BY 1, 2)
        SELECT COALESCE(agg.server_id, raw.server_id) AS server_id, COALESCE(agg.day, raw.day) AS day,
               COALESCE(agg.rows, 0) AS agg_rows, COALESCE(agg.bytes, 0) AS agg_bytes,
               COALESCE(agg.connections, 0) AS connections, COALESCE(raw.rows, 0) AS raw_rows,
               COALESCE(raw.bytes, 0) AS raw_bytes, s.name
          FROM agg FULL JOIN raw ON raw.server_id = agg.server_id AND raw.day = agg.day
          LEFT JOIN servers s ON s.id = COALESCE(agg.server_id, raw.server_id)
         ORDER BY 2, 1"""),
        params,
    ).all()
    return [
        PassiveLoadDay(
            server_id=str(row.server_id),
            server_name=row.name,
            day=row.day,
            aggregate_rows=int(row.agg_rows),
            aggregate_bytes=int(row.agg_bytes),
            connections=int(row.connections),
            raw_rows=int(row.raw_rows),
            raw_bytes=int(row.raw_bytes),
            aggregate_bytes_per_connection=int(row.agg_bytes) / int(row.connections) if row.connections else None,
            raw_bytes_per_record=int(row.raw_bytes) / int(row.raw_rows) if row.raw_rows else None,
            raw_share=int(row.raw_rows) / int(row.connections) if row.connections else None,
        )
        for row in rows
    ]


def passive_filter_options(session: Session, filters: PassiveFilters) -> PassiveOptions:
    """The regions, phases, treated shares and hours the campaign of ``filters`` has data for."""
    campaign = resolve_campaign(session, filters)
    if campaign is None:
        return PassiveOptions(campaign_id=None)
    row = session.execute(
        text("""
        SELECT array_agg(DISTINCT region ORDER BY region) AS regions, array_agg(DISTINCT phase ORDER BY phase) AS phases,
               array_agg(DISTINCT treated_share_bp ORDER BY treated_share_bp) AS shares, min(hour) AS first_hour,
               max(hour) AS last_hour
          FROM passive_aggregates WHERE campaign_id = :campaign"""),
        {"campaign": campaign.campaign_id},
    ).one()
    return PassiveOptions(
        campaign_id=campaign.campaign_id,
        regions=list(row.regions or []),
        phases=[int(phase) for phase in row.phases or []],
        treated_shares_bp=[int(share) for share in row.shares or []],
        first_hour=row.first_hour,
        last_hour=row.last_hour,
    )


__all__ = [
    "PASSIVE_DIMENSIONS",
    "PassiveDimension",
    "PassiveFilters",
    "UNKNOWN_REGION",
    "passive_buckets",
    "passive_campaigns",
    "passive_days",
    "passive_filter_options",
    "passive_load",
    "passive_regions",
    "passive_share_sweep",
    "passive_summary",
]

"""Offered-load / fairness campaigns read from the raw trials: what the short flows of each IW
gained and what the competing long-lived flow paid (the dashboard's Cost page, section "Bulk flows")."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis.filters import Filters, trial_where
from iwscope.analysis.results import FairnessPoint
from iwscope.analysis.stats import median_interval, proportion_interval, share

#: The flow roles of the fairness experiment (wire v1/v2 fragments were mapped to ``role`` on ingest).
_FLOW_ROLE_SQL = "t.role"


def fairness(session: Session, filters: Filters) -> list[FairnessPoint]:
    """Offered-load / fairness campaigns (those with an arrival rate or a background flow),
    per campaign x flow role x IW: what the short flows gained and what the competing
    long-lived flow paid.  Filters: campaigns, time window, regions (sizes and arms are not
    applied: the background flow is large by design and every arm of a mix is shown)."""
    where, params = trial_where(replace(filters, size_min=None, size_max=None))
    rows = session.execute(
        text(f"""
        SELECT t.campaign_id, c.name, c.arms, c.arrival_rate_per_s, {_FLOW_ROLE_SQL} AS flow, t.arm_iw,
               count(*) AS n, count(t.error_kind) AS errors,
               avg(t.object_size) FILTER (WHERE t.error_kind IS NULL) AS mean_bytes,
               avg(t.object_size * 8.0e6 / t.total_us) FILTER (WHERE t.error_kind IS NULL AND t.total_us > 0)
                   AS throughput_bps,
               avg(t.total_us) FILTER (WHERE t.error_kind IS NULL) / 1000.0 AS fct_mean_ms,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY t.total_us) FILTER (WHERE t.error_kind IS NULL)
                   / 1000.0 AS fct_p50_ms,
               percentile_cont(0.9) WITHIN GROUP (ORDER BY t.total_us) FILTER (WHERE t.error_kind IS NULL)
                   / 1000.0 AS fct_p90_ms,
               array_agg(t.total_us ORDER BY t.total_us) FILTER (WHERE t.error_kind IS NULL) AS totals_us,
               count(*) FILTER (WHERE t.server_total_retrans > 0) AS retrans_flows,
               count(t.server_total_retrans) AS joined_flows,
               sum(t.server_bytes_retrans) AS bytes_retrans, sum(t.server_bytes_sent) AS bytes_sent
        FROM trials AS t JOIN campaigns AS c ON c.id = t.campaign_id LEFT JOIN probes AS p ON p.id = t.probe_id
        WHERE (c.arrival_rate_per_s IS NOT NULL OR c.background_bytes IS NOT NULL)
          AND t.role IN ('short', 'background', 'background-alone') AND t.arm IS NULL AND {where}
        GROUP BY t.campaign_id, c.name, c.arms, c.arrival_rate_per_s, flow, t.arm_iw
        ORDER BY t.campaign_id, flow, t.arm_iw"""),
        params,
    ).all()
    if not rows:
        return []
    campaign_ids = sorted({int(row.campaign_id) for row in rows})
    bottleneck: dict[int, float | None] = dict(
        session.execute(
            text("""
        SELECT t.campaign_id, avg(e.bottleneck_bps)
        FROM (SELECT DISTINCT campaign_id, probe_id, origin_id FROM trials WHERE campaign_id = ANY(:ids)) AS t
        JOIN path_estimates AS e ON e.probe_id = t.probe_id AND e.origin_id = t.origin_id
        WHERE e.bottleneck_bps > 0 GROUP BY t.campaign_id"""),
            {"ids": campaign_ids},
        ).all()
    )
    short_bytes: dict[int, tuple[float, float]] = {}
    for row in rows:
        if row.flow == "short" and row.mean_bytes is not None:
            total, count = short_bytes.get(row.campaign_id, (0.0, 0.0))
            ok = row.n - row.errors
            short_bytes[row.campaign_id] = (total + float(row.mean_bytes) * ok, count + ok)
    points: list[FairnessPoint] = []
    for row in rows:
        p50_ci = median_interval(row.totals_us or [])
        rate = float(row.arrival_rate_per_s) if row.arrival_rate_per_s is not None else None
        load = None
        total, count = short_bytes.get(row.campaign_id, (0.0, 0.0))
        link = bottleneck.get(row.campaign_id)
        if rate is not None and count and link:
            load = rate * (total / count) * 8 / float(link)
        points.append(
            FairnessPoint(
                campaign_id=int(row.campaign_id),
                campaign_name=row.name,
                mix="+".join(str(iw) for iw in sorted(row.arms)),
                arrival_rate_per_s=rate,
                offered_load=load,
                flow=row.flow,
                iw=int(row.arm_iw),
                n=int(row.n),
                errors=int(row.errors),
                mean_bytes=_float(row.mean_bytes),
                throughput_bps=_float(row.throughput_bps),
                fct_mean_ms=_float(row.fct_mean_ms),
                fct_p50_ms=_float(row.fct_p50_ms),
                fct_p90_ms=_float(row.fct_p90_ms),
                retrans_flow_share=share(float(row.retrans_flows), float(row.joined_flows)),
                bytes_retrans_share=(
                    share(float(row.bytes_retrans), float(row.bytes_sent))
                    if row.bytes_sent is not None and row.bytes_retrans is not None
                    else None
                ),
                fct_p50_ci_ms=(p50_ci[0] / 1000.0, p50_ci[1] / 1000.0) if p50_ci else None,
                retrans_flows=int(row.retrans_flows),
                joined_flows=int(row.joined_flows),
                retrans_flow_share_ci=proportion_interval(int(row.retrans_flows), int(row.joined_flows)),
            )
        )
    return points


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None

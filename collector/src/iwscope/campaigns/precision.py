"""Adaptive campaigns: which probes have measured enough.

A campaign with ``target_ci_ms`` runs until its time box ends, but each probe stops as soon
as every RTT and bandwidth bucket (Figure 5's) that its paths fall into holds a paired
improvement whose 95 % interval is at most +- ``target_ci_ms`` wide, for every arm against
the campaign's smallest one.  Fast paths thus contribute many rounds, slow paths as many as
fit, and a bucket nobody can make precise keeps its probes measuring until the time is up.

:func:`update_done` runs in the worker (beat, every ``IWSCOPE_PRECISION_CHECK_S``) and
records such probes in ``campaign_probe_done``; the schedule leaves those campaigns out for
them (``probes.services.schedule_for``), so a probe running ``--once`` exits after its round.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

import numpy as np
from sqlalchemy import or_, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from iwscope.analysis import buckets as bk
from iwscope.analysis import compare_many
from iwscope.analysis.filters import Filters
from iwscope.campaigns.models import Campaign, CampaignProbeDone
from iwscope.types import utcnow

#: The dimensions whose buckets must be precise (Figure 5's RTT and bandwidth panels).
DIMENSIONS: tuple[str, ...] = ("rtt", "bandwidth")


@dataclass(frozen=True)
class ProbePrecision:
    """How precise the buckets a probe feeds are: ``None`` while one has no interval yet."""

    probe_id: uuid.UUID
    widest_half_ci_ms: float | None

    def reached(self, target_ms: float) -> bool:
        return self.widest_half_ci_ms is not None and self.widest_half_ci_ms <= target_ms


def _bucket_labels(dimension: str, values: list[float | None]) -> list[str | None]:
    array = np.array([np.nan if value is None else float(value) for value in values])
    if dimension == "rtt":
        index, labels = bk.rtt_index(array), bk.RTT_BUCKETS
    else:
        index, labels = bk.bandwidth_index(array), bk.BANDWIDTH_BUCKETS
    return [labels[i].label if i >= 0 else None for i in index.tolist()]


def precision_by_probe(session: Session, campaign: Campaign) -> list[ProbePrecision]:
    """Per probe of ``campaign``: the widest half interval among the buckets its paths feed."""
    # The campaign's paths from its month roll-ups (a few rows per path), not from every trial.
    paths = session.execute(
        text("""
        SELECT DISTINCT r.probe_id, pe.min_rtt_us::float8, pe.bottleneck_bps::float8
        FROM analysis_rollups AS r
        LEFT JOIN path_estimates AS pe ON pe.probe_id = r.probe_id AND pe.origin_id = r.origin_id
        WHERE r.campaign_id = :campaign AND r.grain = 1"""),
        {"campaign": campaign.id},
    ).all()
    if not paths:
        return []
    baseline = min(campaign.arms)
    half_width: dict[tuple[str, str], float | None] = {}
    for treatment in sorted(set(campaign.arms) - {baseline}):
        # include_cost: the campaign's own trials, whatever kind of campaign it is
        filters = Filters(campaign_ids=(campaign.id,), baseline_iw=baseline, treatment_iw=treatment, include_cost=True)
        for dimension, results in compare_many(session, filters, DIMENSIONS).items():
            for result in results:
                key = (dimension, result.bucket)
                if result.too_small or result.abs_ci_low is None or result.abs_ci_high is None:
                    half = None
                else:
                    half = (result.abs_ci_high - result.abs_ci_low) / 2
                previous = half_width.get(key, 0.0)
                half_width[key] = None if half is None or previous is None else max(previous, half)
    widest: dict[uuid.UUID, float | None] = {}
    for dimension, column in (("rtt", 1), ("bandwidth", 2)):
        labels = _bucket_labels(dimension, [row[column] for row in paths])
        for row, label in zip(paths, labels, strict=True):
            probe = row[0]
            half = half_width.get((dimension, label)) if label is not None else None
            current = widest.get(probe, 0.0)
            widest[probe] = None if half is None or current is None else max(current, half)
    return [ProbePrecision(probe, value) for probe, value in sorted(widest.items(), key=lambda item: str(item[0]))]


def update_done(session: Session, now: dt.datetime | None = None) -> dict[int, int]:
    """Mark the probes of running adaptive campaigns that reached the target; returns newly
    marked probes per campaign."""
    now = now or utcnow()
    campaigns = session.scalars(
        select(Campaign).where(
            Campaign.target_ci_ms.is_not(None), Campaign.starts_at <= now, or_(Campaign.ends_at.is_(None), Campaign.ends_at > now)
        )
    ).all()
    marked: dict[int, int] = {}
    for campaign in campaigns:
        target = float(campaign.target_ci_ms or 0.0)
        done = [precision for precision in precision_by_probe(session, campaign) if precision.reached(target)]
        if not done:
            continue
        inserted = session.execute(
            insert(CampaignProbeDone)
            .values(
                [
                    {"campaign_id": campaign.id, "probe_id": precision.probe_id, "widest_half_ci_ms": precision.widest_half_ci_ms}
                    for precision in done
                ]
            )
            .on_conflict_do_nothing()
            .returning(CampaignProbeDone.probe_id)
        ).all()
        if inserted:
            marked[campaign.id] = len(inserted)
    return marked

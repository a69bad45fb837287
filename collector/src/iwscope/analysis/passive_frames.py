"""Reading the passive study: its filters, the campaign it is about, and per-cluster sums.

``passive_aggregates`` holds one row per upload interval of a key (campaign x phase x hour x arm
x family x port kind x region x cluster x buckets x size octave x bias); every reader here sums
the selected rows in SQL, per arm x group x cluster, and merges their histograms with
``unnest(latency_bins, latency_counts)`` -- so what crosses to Python grows with arms, groups and
clusters (at most 32 per arm), not with the uploads.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwprobe import wire
from iwscope.analysis.passive_stats import SUM_NAMES, ClusterSums
from iwscope.wiretypes import BIGINT_MAX, NAMED_FAMILIES

#: What a passive analysis groups by (besides arm and cluster).
Grouping = Literal["all", "region", "day", "rtt", "bandwidth", "bdp", "share"]
_GROUP_SQL: dict[str, str] = {
    "all": "''",
    "region": "a.region",
    "day": "to_char(a.hour AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
    "rtt": "a.rtt_bucket::text",
    "bandwidth": "a.bandwidth_bucket::text",
    "bdp": "a.bdp_bucket::text",
    "share": "a.treated_share_bp::text",
}
#: Query-string keys of :class:`PassiveFilters` (the dashboard's URLs).
_KEYS = {
    "campaign_id": "campaign",
    "server_ids": "server",
    "regions": "region",
    "family": "family",
    "since": "since",
    "until": "until",
    "include_biased": "biased",
    "phases": "phase",
    "treated_shares_bp": "share",
    "baseline": "base",
}
_MAX_PHASE = 2**31 - 1


@dataclass(frozen=True)
class PassiveFilters:
    """Which aggregates a passive analysis reads.

    ``campaign_id`` ``None``: the latest passive campaign (the one that started last).
    ``since``/``until``: inclusive, on the aggregates' ``hour`` (the start of the UTC hour the
    connections closed in).  ``include_biased`` ``False`` leaves out the rows whose connections
    carry a bias flag (SYN or SYN-ACK retransmitted, first flight limited by the client's receive
    window); the biased shares themselves always count every connection.  ``baseline`` ``""``:
    the ``default`` arm, else the smallest IW.
    """

    campaign_id: int | None = None
    server_ids: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    family: str = ""
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    include_biased: bool = True
    phases: tuple[int, ...] = ()
    treated_shares_bp: tuple[int, ...] = ()
    baseline: str = ""

    def to_query(self) -> dict[str, str]:
        """URL parameters; defaults are left out."""
        query: dict[str, str] = {}
        for name, key in _KEYS.items():
            value = getattr(self, name)
            if value == getattr(PassiveFilters(), name):
                continue
            if isinstance(value, tuple):
                query[key] = ",".join(str(item) for item in value)
            elif isinstance(value, dt.datetime):
                query[key] = value.isoformat()
            elif isinstance(value, bool):
                query[key] = "include" if value else "exclude"
            else:
                query[key] = str(value)
        return query

    @classmethod
    def from_query(cls, query: Mapping[str, Any]) -> PassiveFilters:
        """Parse URL parameters; a missing or malformed value falls back to its default."""

        def raw(name: str) -> str:
            value = query.get(_KEYS[name])
            if isinstance(value, (list, tuple)):
                value = value[0] if value else None
            return str(value).strip() if value is not None else ""

        def numbers(name: str, high: int) -> tuple[int, ...]:
            found: list[int] = []
            for item in raw(name).split(","):
                try:
                    number = int(item)
                except ValueError:
                    continue
                if 0 <= number <= high and number not in found:
                    found.append(number)
            return tuple(found)

        def moment(name: str) -> dt.datetime | None:
            value = raw(name)
            try:
                parsed = dt.datetime.fromisoformat(value.replace(" ", "+", 1) if "T" in value else value)
            except ValueError:
                return None
            return as_utc(parsed)

        campaign = numbers("campaign_id", BIGINT_MAX)
        base = raw("baseline")
        return cls(
            campaign_id=campaign[0] if campaign and campaign[0] >= 1 else None,
            server_ids=tuple(item for item in dict.fromkeys(raw("server_ids").split(",")) if _is_uuid(item)),
            regions=tuple(
                dict.fromkeys(item.strip() for item in raw("regions").split(",") if item.strip() and "\x00" not in item)
            ),
            family=raw("family") if raw("family") in NAMED_FAMILIES else "",
            since=moment("since"),
            until=moment("until"),
            include_biased=raw("include_biased") != "exclude",
            phases=numbers("phases", _MAX_PHASE),
            treated_shares_bp=numbers("treated_shares_bp", wire.PASSIVE_SHARE_SCALE),
            baseline=base if _is_arm(base) else "",
        )


def _is_uuid(text_value: str) -> bool:
    try:
        uuid.UUID(text_value)
    except ValueError:
        return False
    return True


def _is_arm(label: str) -> bool:
    return bool(re.fullmatch(wire.PASSIVE_ARM_PATTERN, label))


def as_utc(moment: dt.datetime | None) -> dt.datetime | None:
    """``moment`` as an aware UTC datetime (naive: taken as UTC); out of range: clamped."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=dt.UTC)
    try:
        return moment.astimezone(dt.UTC)
    except OverflowError:
        return dt.datetime.min.replace(tzinfo=dt.UTC) if moment.year < 2 else dt.datetime.max.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class PassiveCampaignRef:
    """The passive campaign an analysis is about: its id, name and configured arms."""

    campaign_id: int
    name: str
    arms: list[tuple[str, int]]


def resolve_campaign(session: Session, filters: PassiveFilters) -> PassiveCampaignRef | None:
    """The campaign ``filters`` name (``None`` when it is not a passive campaign), or the
    passive campaign that started last."""
    condition = "id = :campaign" if filters.campaign_id is not None else "TRUE"
    row = session.execute(
        text(f"""
        SELECT id, name, passive_arms FROM campaigns
         WHERE server_ids IS NOT NULL AND {condition}
         ORDER BY starts_at DESC, id DESC LIMIT 1"""),
        {"campaign": filters.campaign_id},
    ).first()
    if row is None:
        return None
    arms = [(str(arm.get("arm")), int(arm.get("share_bp", 0))) for arm in (row.passive_arms or []) if isinstance(arm, dict)]
    return PassiveCampaignRef(int(row.id), str(row.name), arms)


def aggregate_where(
    filters: PassiveFilters, campaign_id: int, *, biased: bool | None = None, sweep: bool = False
) -> tuple[str, dict[str, Any]]:
    """The filters as a condition on ``passive_aggregates a`` and its parameters.  ``biased``
    overrides ``include_biased`` (``True``: every row, for the biased shares); ``sweep`` leaves
    the phase and share filters out (the share sweep compares the phases)."""
    include_biased = filters.include_biased if biased is None else biased
    conditions: list[tuple[str, str, Any]] = [
        ("campaign", "a.campaign_id = :campaign", campaign_id),
        ("servers", "a.server_id = ANY(CAST(:servers AS uuid[]))", list(filters.server_ids) or None),
        ("regions", "a.region = ANY(:regions)", list(filters.regions) or None),
        ("family", "a.family = :family", filters.family or None),
        ("since", "a.hour >= :since", as_utc(filters.since)),
        ("until", "a.hour <= :until", as_utc(filters.until)),
        ("phases", "a.phase = ANY(:phases)", None if sweep else list(filters.phases) or None),
        ("shares", "a.treated_share_bp = ANY(:shares)", None if sweep else list(filters.treated_shares_bp) or None),
    ]
    given = [(name, clause, value) for name, clause, value in conditions if value is not None]
    where = " AND ".join(clause for _, clause, _ in given)
    if not include_biased:
        where += " AND NOT a.biased"
    return where, {name: value for name, _, value in given}


_SUMS_SELECT = ", ".join(f"sum(a.{name})::float8 AS {name}" for name in SUM_NAMES if name != "biased_connections")


def load_groups(session: Session, where: str, params: dict[str, Any], grouping: Grouping) -> dict[tuple[str, str], ClusterSums]:
    """Per (arm, group): the sums and merged histograms of every cluster with rows."""
    group = _GROUP_SQL[grouping]
    sums = session.execute(
        text(f"""
        SELECT a.arm, {group} AS g, a.cluster, {_SUMS_SELECT},
               COALESCE(sum(a.connections) FILTER (WHERE a.biased), 0)::float8 AS biased_connections
          FROM passive_aggregates a WHERE {where}
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"""),
        params,
    ).all()
    hists = session.execute(
        text(f"""
        WITH bins AS (
            SELECT a.arm, {group} AS g, a.cluster, u.bin, sum(u.count)::float8 AS count
              FROM passive_aggregates a CROSS JOIN LATERAL unnest(a.latency_bins, a.latency_counts) AS u(bin, count)
             WHERE {where}
             GROUP BY 1, 2, 3, 4)
        SELECT arm, g, cluster, array_agg(bin ORDER BY bin) AS bins, array_agg(count ORDER BY bin) AS counts
          FROM bins GROUP BY 1, 2, 3"""),
        params,
    ).all()
    histograms: dict[tuple[str, str, int], tuple[list[int], list[float]]] = {
        (row.arm, row.g, int(row.cluster)): (list(row.bins), list(row.counts)) for row in hists
    }
    grouped: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for row in sums:
        grouped[(row.arm, row.g)].append(row)
    out: dict[tuple[str, str], ClusterSums] = {}
    for key, rows in grouped.items():
        clusters = np.asarray([int(row.cluster) for row in rows], dtype=np.int64)
        arrays = {name: np.asarray([float(getattr(row, name)) for row in rows]) for name in SUM_NAMES}
        pieces = [histograms.get((key[0], key[1], int(row.cluster)), ([], [])) for row in rows]
        occupied = [bin_ for bins, _ in pieces for bin_ in bins]
        lo = min(occupied) if occupied else 0
        hist = np.zeros((len(rows), (max(occupied) - lo + 1) if occupied else 0))
        for index, (bins, counts) in enumerate(pieces):
            if bins:
                hist[index, np.asarray(bins, dtype=np.int64) - lo] = counts
        out[key] = ClusterSums(clusters, arrays, hist, lo)
    return out


def arm_windows(session: Session, where: str, params: dict[str, Any]) -> dict[str, int | None]:
    """The IW each arm gave: the commonest known ``arm_iw`` of its connections."""
    rows = session.execute(
        text(f"""
        SELECT a.arm, a.arm_iw, sum(a.connections) AS n FROM passive_aggregates a
         WHERE {where} GROUP BY 1, 2 ORDER BY 1, 3 DESC, 2"""),
        params,
    ).all()
    windows: dict[str, int | None] = {}
    for row in rows:
        if row.arm_iw is not None and windows.get(row.arm) is None:
            windows[row.arm] = int(row.arm_iw)
        windows.setdefault(row.arm, None)
    return windows


def hour_range(session: Session, where: str, params: dict[str, Any]) -> tuple[dt.datetime | None, dt.datetime | None]:
    row = session.execute(text(f"SELECT min(a.hour), max(a.hour) FROM passive_aggregates a WHERE {where}"), params).one()
    return row[0], row[1]


def arm_sort_key(arm: str) -> tuple[int, int]:
    """``default`` first, then IWs ascending."""
    return (0, 0) if arm == wire.DEFAULT_ARM else (1, int(arm) if arm.isdigit() else 1 << 30)


def choose_baseline(arms: list[str], wanted: str) -> str | None:
    """The baseline arm: ``wanted`` when present, else ``default``, else the smallest IW."""
    if not arms:
        return None
    if wanted and wanted in arms:
        return wanted
    return sorted(arms, key=arm_sort_key)[0]


def arm_order(arms: list[str], baseline: str | None) -> list[str]:
    """The baseline first, then the others (``default``, then IWs ascending)."""
    return sorted(arms, key=lambda arm: (arm != baseline, *arm_sort_key(arm)))


def with_campaign(filters: PassiveFilters, campaign: PassiveCampaignRef) -> PassiveFilters:
    return replace(filters, campaign_id=campaign.campaign_id)

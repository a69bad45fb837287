"""The analysis functions: every figure's data, read from the roll-ups (raw path noted).

Each public function takes a SQLAlchemy ``Session`` and a :class:`Filters` and returns frozen
dataclasses (JSON-serialisable with ``dataclasses.asdict``).  Units: latencies in
milliseconds; ``pct`` values in percent (12.0 = 12 %); shares (``retrans_share``, ...) as
fractions 0..1; ``retrans_increase_pp`` in percentage points.  Improvement = baseline -
treatment (positive = the treatment arm is faster).

One SQL statement per call fetches the matching roll-up rows joined with ``probes`` (region)
and ``path_estimates`` (RTT, bandwidth, BDP, loss); grouping into buckets, histogram merges,
percentiles and bootstrap intervals happen in numpy.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis import buckets as bk
from iwscope.analysis.filters import Filters, trial_where
from iwscope.analysis.paired import Cells, PairedEstimate, cell_estimate
from iwscope.analysis.stats import (MIN_CLUSTERS, Interval, histogram_cdf, histogram_quantiles, mean_std_ms,
                                    median_interval, merge_pieces, proportion_interval, quantile_difference_intervals)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# ---- result types (the public surface) -------------------------------------------------------

@dataclass(frozen=True)
class ArmStats:
    """One arm's trials: count, mean and standard deviation (exact), median and quartiles (from
    the histogram, +-1 %).  Latencies are skewed: draw median and quartiles, never mean +- std
    (which reaches below zero)."""

    iw: int
    n: int
    mean_ms: float | None
    median_ms: float | None
    std_ms: float | None
    p25_ms: float | None = None
    p75_ms: float | None = None


@dataclass(frozen=True)
class BucketComparison:
    """Treatment vs baseline in one bucket.

    ``baseline`` / ``treatment`` describe every trial of each arm.  The improvement (``abs_ms``,
    ``pct`` and their 95 % intervals) is the paired one (analysis/paired.py): within-path,
    within-size differences over ``n_pairs`` pairs on ``n_paths`` paths; ``method`` says how
    the interval was made (``cluster``: resampling paths; ``within-path``: resampling each
    cell's trials, about the measured paths only).  ``too_small``: fewer pairs than
    ``paired.MIN_PAIRS``: the improvement fields are ``None`` ("n too small"); ``note`` says
    what an interval does not cover, or why there is no number.
    """

    dimension: str
    bucket: str
    order: int
    lower: float | None
    upper: float | None
    baseline: ArmStats
    treatment: ArmStats
    abs_ms: float | None
    abs_ci_low: float | None
    abs_ci_high: float | None
    pct: float | None
    pct_ci_low: float | None
    pct_ci_high: float | None
    n_pairs: int = 0
    n_paths: int = 0
    method: str | None = None
    too_small: bool = True
    note: str | None = None


@dataclass(frozen=True)
class ArmPercentiles:
    iw: int
    n: int
    avg: float | None
    p50: float | None
    p75: float | None
    p90: float | None
    p99: float | None
    retrans_share: float | None
    retrans_bytes_share: float | None


@dataclass(frozen=True)
class PercentileTable:
    """The IETF slides' table for one group.  ``improvement["avg"]`` is the paired estimate (as in
    :class:`BucketComparison`); the percentile improvements are differences of the arms'
    percentiles.  ``*_ci`` hold ``[low, high]`` 95 % bounds per key (paths resampled, or each
    arm's trials with fewer than 5 paths).  ``too_small``: fewer than ``paired.MIN_PAIRS``
    pairs: the improvement rows are ``None`` ("n too small")."""

    group: str
    arms: list[ArmPercentiles]
    improvement: dict[str, float | None]
    pct_improvement: dict[str, float | None]
    retrans_increase_pp: float | None
    improvement_ci: dict[str, list[float | None]] = field(default_factory=dict)
    pct_improvement_ci: dict[str, list[float | None]] = field(default_factory=dict)
    n_pairs: int = 0
    n_paths: int = 0
    too_small: bool = True
    note: str | None = None


@dataclass(frozen=True)
class Headline:
    n_trials: int
    n_probes: int
    n_regions: int
    baseline_iw: int
    treatment_iw: int
    abs_ms: float | None
    pct: float | None
    pct_ci_low: float | None
    pct_ci_high: float | None
    retrans_increase_pp: float | None
    abs_ci_low: float | None = None
    abs_ci_high: float | None = None
    n_pairs: int = 0
    n_paths: int = 0
    too_small: bool = True
    note: str | None = None


@dataclass(frozen=True)
class RegionSummary:
    region: str
    lat: float | None
    lon: float | None
    n: int
    abs_ms: float | None
    pct: float | None
    baseline_mean_ms: float | None
    treatment_mean_ms: float | None
    abs_ci_low: float | None = None
    abs_ci_high: float | None = None
    pct_ci_low: float | None = None
    pct_ci_high: float | None = None
    n_baseline: int = 0
    n_treatment: int = 0
    n_pairs: int = 0
    n_paths: int = 0
    too_small: bool = True
    note: str | None = None


@dataclass(frozen=True)
class LossBucket:
    bucket: str
    order: int
    comparison: BucketComparison
    retrans_share_baseline: float | None
    retrans_share_treatment: float | None
    retrans_increase_pp: float | None


@dataclass(frozen=True)
class ProbeRow:
    probe_id: str
    name: str
    region: str
    country: str | None
    version: str
    last_seen_at: dt.datetime | None
    trials_total: int
    trials_per_day: float
    error_share: float | None
    spool_backlog: int | None


@dataclass(frozen=True)
class FilterOptions:
    campaigns: list[tuple[int, str]]
    regions: list[str]
    arms: list[int]
    size_min: int | None
    size_max: int | None


@dataclass(frozen=True)
class FairnessPoint:
    """One flow role x IW of one offered-load / fairness campaign (a phase of the experiment).

    ``flow`` is ``short`` (the Poisson-arriving trials), ``background`` (the long-lived flow
    running alongside them) or ``background-alone`` (the same flow just before each round:
    the uncontended baseline).  Times are of successful flows; throughput is the mean over
    flows of ``bytes * 8 / total time``; ``retrans_flow_share`` is the share of joined flows
    the origin retransmitted anything in (``retrans_flows`` of ``joined_flows``, with a Wilson
    95 % interval), ``bytes_retrans_share`` the origin's retransmitted bytes over bytes sent;
    ``fct_p50_ci_ms`` the order-statistic 95 % interval of the median completion time
    (``None`` below 6 flows).  ``offered_load`` is ``arrival rate x mean short-flow bytes x 8 /
    bottleneck`` (the bottleneck from the campaign's path estimates), ``None`` when unknown.
    """

    campaign_id: int
    campaign_name: str
    #: The campaign's short-flow arms, e.g. ``"3"``, ``"10"``, ``"3+10"`` (the phase's IW mix).
    mix: str
    arrival_rate_per_s: float | None
    offered_load: float | None
    flow: str
    iw: int
    n: int
    errors: int
    mean_bytes: float | None
    throughput_bps: float | None
    fct_mean_ms: float | None
    fct_p50_ms: float | None
    fct_p90_ms: float | None
    retrans_flow_share: float | None
    bytes_retrans_share: float | None
    fct_p50_ci_ms: tuple[float, float] | None = None
    retrans_flows: int = 0
    joined_flows: int = 0
    retrans_flow_share_ci: tuple[float, float] | None = None


#: A representative centroid (lat, lon) per region name, for the world map.  Names are
#: matched case-insensitively with ``_``/space folded to ``-``.
REGION_CENTROIDS: dict[str, tuple[float, float]] = {
    "africa": (2.0, 21.0), "north-africa": (27.0, 17.0), "west-africa": (10.0, -2.0),
    "east-africa": (0.0, 36.0), "southern-africa": (-25.0, 25.0), "central-africa": (0.0, 20.0),
    "europe": (50.0, 10.0), "western-europe": (48.0, 4.0), "eastern-europe": (50.0, 28.0),
    "northern-europe": (60.0, 15.0), "southern-europe": (41.0, 12.0),
    "asia": (34.0, 100.0), "east-asia": (35.0, 115.0), "south-asia": (22.0, 79.0),
    "southeast-asia": (5.0, 110.0), "central-asia": (45.0, 68.0), "middle-east": (29.0, 45.0),
    "north-america": (45.0, -100.0), "central-america": (15.0, -88.0), "caribbean": (18.0, -72.0),
    "south-america": (-15.0, -60.0), "oceania": (-25.0, 140.0), "australia": (-25.0, 134.0),
    "us-east": (38.0, -78.0), "us-west": (38.0, -121.0), "eu-west": (51.0, -2.0),
    "eu-central": (50.0, 9.0), "ap-southeast": (1.3, 103.8), "ap-northeast": (35.7, 139.7),
    "sa-east": (-23.5, -46.6), "af-south": (-33.9, 18.4), "me-south": (26.0, 50.5),
    "lab": (0.0, 0.0),
}


def region_centroid(region: str) -> tuple[float | None, float | None]:
    lat_lon = REGION_CENTROIDS.get(region.strip().lower().replace("_", "-").replace(" ", "-"))
    return lat_lon if lat_lon is not None else (None, None)


# ---- loading roll-ups ------------------------------------------------------------------------

@dataclass
class _Frame:
    """Roll-up rows matching the filters, summed over days in SQL, as numpy columns.

    One entry per (probe, origin, arm, size octave).  Histograms stay as the packed pieces of
    the daily rows: piece ``j`` belongs to entry ``piece_row[j]``, starts at bin ``piece_lo[j]``
    and holds ``piece_len[j]`` int32 counts in ``blob``.
    """

    path: IntArray            # 0-based code of (probe_id, origin_id), in that sort order
    probe: IntArray           # 0-based code of probe_id
    arm: IntArray
    size_bucket: IntArray
    region: IntArray          # index into region_names
    region_names: list[str]
    min_rtt_us: FloatArray
    bottleneck_bps: FloatArray
    bdp_bytes: FloatArray
    loss_rate: FloatArray
    n_trials: FloatArray
    n: FloatArray
    sum_us: FloatArray
    sumsq: FloatArray
    retrans_n: FloatArray
    retrans_trials: FloatArray
    bytes_retrans: FloatArray
    bytes_sent: FloatArray
    piece_row: IntArray
    piece_lo: IntArray
    piece_len: IntArray
    blob: bytes

    @property
    def size(self) -> int:
        return int(self.arm.size)


def _month_start(day: dt.date) -> dt.date:
    return day.replace(day=1)


def _next_month(day: dt.date) -> dt.date:
    return (day.replace(day=28) + dt.timedelta(days=4)).replace(day=1)


def _time_clause(filters: Filters, params: dict[str, Any]) -> str:
    """Month rows for the whole months inside the range, day rows for the days at its edges.

    The range is whole UTC days ``[since's day, until's day]``; an open end extends to the
    first / last month with data.
    """
    if filters.since is None and filters.until is None:
        return "r.grain = 1"
    first_day = filters.since.astimezone(dt.timezone.utc).date() if filters.since else dt.date(1970, 1, 1)
    last_day = filters.until.astimezone(dt.timezone.utc).date() if filters.until else dt.date(9999, 11, 30)
    # whole months inside [first_day, last_day]: [months_from, months_to)
    months_from = first_day if first_day.day == 1 else _next_month(first_day)
    months_to = _month_start(last_day + dt.timedelta(days=1))
    if months_to <= months_from:
        params.update(first_day=first_day, last_day=last_day)
        return "(r.grain = 0 AND r.day BETWEEN :first_day AND :last_day)"
    params.update(first_day=first_day, last_day=last_day, months_from=months_from, months_to=months_to)
    return ("((r.grain = 1 AND r.day >= :months_from AND r.day < :months_to)"
            " OR (r.grain = 0 AND r.day BETWEEN :first_day AND :last_day"
            " AND NOT (r.day >= :months_from AND r.day < :months_to)))")


def _where(filters: Filters, arms: Sequence[int] | None) -> tuple[str, dict[str, Any]]:
    clauses: list[str] = []
    params: dict[str, Any] = {}
    if filters.campaign_ids:
        clauses.append("r.campaign_id = ANY(:campaign_ids)")
        params["campaign_ids"] = list(filters.campaign_ids)
    clauses.append(_time_clause(filters, params))
    if filters.regions:
        clauses.append("r.probe_id IN (SELECT id FROM probes WHERE region = ANY(:regions))")
        params["regions"] = list(filters.regions)
    if filters.size_min is not None or filters.size_max is not None:
        first, last = bk.size_buckets_overlapping(filters.size_min, filters.size_max)
        clauses.append("r.size_bucket BETWEEN :size_first AND :size_last")
        params.update(size_first=first, size_last=last)
    if arms is not None:
        clauses.append("r.arm_iw = ANY(:arms)")
        params["arms"] = list(arms)
    return (" AND ".join(clauses) or "TRUE"), params


_NUMERIC_COLUMNS = 16


def _load(session: Session, filters: Filters, arms: Sequence[int] | None, with_hist: bool) -> _Frame:
    metric = "server" if filters.metric == "server" else "client"
    where, params = _where(filters, arms)
    # The three aggregates see a group's rows in the same order (one pass), so piece i of
    # ``los``/``lens`` describes the i-th piece of ``blob``; the order itself does not matter.
    hist_aggregates = (f""",
               array_agg(r.{metric}_hist_lo) AS los, array_agg(length(r.{metric}_hist) / 4) AS lens,
               string_agg(r.{metric}_hist, ''::bytea) AS blob"""
                       if with_hist else ", NULL::int[] AS los, NULL::int[] AS lens, NULL::bytea AS blob")
    statement = text(f"""
        WITH g AS (
            SELECT r.probe_id, r.origin_id, r.arm_iw, r.size_bucket,
                   sum(r.n_trials) AS n_trials, sum(r.{metric}_n) AS n, sum(r.{metric}_sum_us) AS sum_us,
                   sum(r.{metric}_sumsq_us2) AS sumsq, sum(r.retrans_n) AS retrans_n,
                   sum(r.retrans_trials) AS retrans_trials, sum(r.bytes_retrans) AS bytes_retrans,
                   sum(r.bytes_sent) AS bytes_sent{hist_aggregates}
            FROM analysis_rollups AS r WHERE {where}
            GROUP BY r.probe_id, r.origin_id, r.arm_iw, r.size_bucket)
        SELECT dense_rank() OVER (ORDER BY g.probe_id, g.origin_id) - 1, dense_rank() OVER (ORDER BY g.probe_id) - 1,
               g.arm_iw, g.size_bucket,
               COALESCE(pe.min_rtt_us::float8, 'NaN'), COALESCE(pe.bottleneck_bps::float8, 'NaN'),
               COALESCE(pe.bdp_bytes::float8, 'NaN'), COALESCE(pe.loss_rate, 'NaN'),
               g.n_trials::float8, g.n::float8, g.sum_us::float8, g.sumsq::float8, g.retrans_n::float8,
               g.retrans_trials::float8, g.bytes_retrans::float8, g.bytes_sent::float8,
               COALESCE(p.region, 'unknown'), g.los, g.lens, g.blob
        FROM g LEFT JOIN probes AS p ON p.id = g.probe_id
        LEFT JOIN path_estimates AS pe ON pe.probe_id = g.probe_id AND pe.origin_id = g.origin_id""")
    rows = session.execute(statement, params).all()
    count = len(rows)
    numeric = (np.array([row[:_NUMERIC_COLUMNS] for row in rows], dtype=np.float64) if count
               else np.zeros((0, _NUMERIC_COLUMNS)))
    region_codes: dict[str, int] = {}
    region = np.fromiter((region_codes.setdefault(row[16], len(region_codes)) for row in rows),
                         dtype=np.int64, count=count)
    if with_hist and count:
        piece_counts = np.fromiter((len(row[17]) for row in rows), dtype=np.int64, count=count)
        piece_lo = np.fromiter(itertools.chain.from_iterable(row[17] for row in rows), dtype=np.int64)
        piece_len = np.fromiter(itertools.chain.from_iterable(row[18] for row in rows), dtype=np.int64)
        piece_row = np.repeat(np.arange(count, dtype=np.int64), piece_counts)
        blob = b"".join(bytes(row[19]) for row in rows if row[19])
    else:
        piece_lo = piece_len = piece_row = np.zeros(0, dtype=np.int64)
        blob = b""
    ints = numeric[:, :4].astype(np.int64)
    return _Frame(
        path=ints[:, 0], probe=ints[:, 1], arm=ints[:, 2], size_bucket=ints[:, 3],
        region=region, region_names=list(region_codes),
        min_rtt_us=numeric[:, 4], bottleneck_bps=numeric[:, 5], bdp_bytes=numeric[:, 6], loss_rate=numeric[:, 7],
        n_trials=numeric[:, 8], n=numeric[:, 9], sum_us=numeric[:, 10], sumsq=numeric[:, 11],
        retrans_n=numeric[:, 12], retrans_trials=numeric[:, 13], bytes_retrans=numeric[:, 14],
        bytes_sent=numeric[:, 15], piece_row=piece_row, piece_lo=piece_lo, piece_len=piece_len, blob=blob)


# ---- grouping helpers ------------------------------------------------------------------------

def _group_sum(values: FloatArray, groups: IntArray, n_groups: int) -> FloatArray:
    if n_groups == 0:
        return np.zeros(0)
    return np.bincount(groups, weights=values, minlength=n_groups)[:n_groups]


def _histograms(frame: _Frame, groups: IntArray, n_groups: int) -> IntArray:
    """Merged histograms per group (``groups`` has one entry per frame row; negative = ignored)."""
    return merge_pieces(groups[frame.piece_row], frame.piece_lo, frame.piece_len, frame.blob, n_groups)


def _arm_stats(iw: int, n: float, sum_us: float, sumsq: float, hist: IntArray | None) -> ArmStats:
    count = int(n)
    mean, std = mean_std_ms(count, sum_us, sumsq)
    p25, median, p75 = (histogram_quantiles(hist, [0.25, 0.5, 0.75]) if hist is not None and count > 0
                        else (None, None, None))
    return ArmStats(iw=iw, n=count, mean_ms=mean, median_ms=median, std_ms=std, p25_ms=p25, p75_ms=p75)


def _share(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


#: Size-octave slots per path in a cell key (octaves -1 .. 34 fit).
_SIZE_SLOTS = 64


def _paired(frame: _Frame, rows: IntArray, filters: Filters) -> PairedEstimate:
    """The paired estimate of roll-up rows ``rows``: cells are (path, size octave)."""
    arm = frame.arm[rows]
    is_treat = arm == filters.treatment_iw
    # size octaves run from -1 (empty objects) to 34 (16 GiB): shifted by one, 64 slots per path
    key = frame.path[rows] * _SIZE_SLOTS + (frame.size_bucket[rows] + 1)
    cell_keys, cell = np.unique(key, return_inverse=True)
    k = cell_keys.size
    n = frame.n[rows]
    sums_ms = frame.sum_us[rows] / 1000.0
    cells = Cells(path=cell_keys // _SIZE_SLOTS,
                  n_base=np.bincount(cell, weights=n * ~is_treat, minlength=k),
                  sum_base_ms=np.bincount(cell, weights=sums_ms * ~is_treat, minlength=k),
                  n_treat=np.bincount(cell, weights=n * is_treat, minlength=k),
                  sum_treat_ms=np.bincount(cell, weights=sums_ms * is_treat, minlength=k))
    if 0 < np.unique(cells.path).size < MIN_CLUSTERS:  # the within-path interval needs each cell's histograms
        slot = np.full(frame.size, -1, dtype=np.int64)
        slot[rows] = cell * 2 + is_treat
        hists = _histograms(frame, slot, 2 * k).reshape(k, 2, -1)
        cells = replace(cells, hist_base=hists[:, 0], hist_treat=hists[:, 1])
    return cell_estimate(cells)


def _comparisons(frame: _Frame, filters: Filters, groups: IntArray, labels: list[bk.Bucket],
                 dimension: str) -> list[BucketComparison]:
    """One comparison per group that holds data in either arm (groups < 0 are dropped)."""
    n_groups = len(labels)
    base_iw, treat_iw = filters.baseline_iw, filters.treatment_iw
    arm_slot = np.where(frame.arm == base_iw, 0, np.where(frame.arm == treat_iw, 1, -1))
    valid = (groups >= 0) & (arm_slot >= 0)
    cell = np.where(valid, groups * 2 + arm_slot, -1)
    cells = 2 * n_groups
    keep = cell >= 0
    n = _group_sum(frame.n[keep], cell[keep], cells)
    sums = _group_sum(frame.sum_us[keep], cell[keep], cells)
    sumsq = _group_sum(frame.sumsq[keep], cell[keep], cells)
    hists = _histograms(frame, cell, cells)
    results: list[BucketComparison] = []
    for group, label in enumerate(labels):
        b, t = 2 * group, 2 * group + 1
        if n[b] == 0 and n[t] == 0:
            continue
        baseline = _arm_stats(base_iw, n[b], sums[b], sumsq[b], hists[b])
        treatment = _arm_stats(treat_iw, n[t], sums[t], sumsq[t], hists[t])
        estimate = _paired(frame, np.flatnonzero(valid & (groups == group)), filters)
        results.append(_bucket_comparison(dimension, label, baseline, treatment, estimate))
    return results


def _bucket_comparison(dimension: str, label: bk.Bucket, baseline: ArmStats, treatment: ArmStats,
                       estimate: PairedEstimate) -> BucketComparison:
    shown = not estimate.too_small
    interval = estimate.interval if shown else None
    return BucketComparison(
        dimension=dimension, bucket=label.label, order=label.order, lower=label.lower, upper=label.upper,
        baseline=baseline, treatment=treatment,
        abs_ms=estimate.estimate_ms if shown else None,
        abs_ci_low=interval.abs_low if interval else None, abs_ci_high=interval.abs_high if interval else None,
        pct=estimate.pct if shown else None,
        pct_ci_low=interval.pct_low if interval else None, pct_ci_high=interval.pct_high if interval else None,
        n_pairs=estimate.n_pairs, n_paths=estimate.n_paths, method=estimate.method if estimate.n_pairs else None,
        too_small=estimate.too_small, note=estimate.reason)


def _dimension_groups(frame: _Frame, dimension: str) -> tuple[IntArray, list[bk.Bucket]]:
    """Group index per roll-up row and the bucket descriptions for ``dimension``."""
    if dimension == "rtt":
        return bk.rtt_index(frame.min_rtt_us), bk.RTT_BUCKETS
    if dimension == "bandwidth":
        return bk.bandwidth_index(frame.bottleneck_bps), bk.BANDWIDTH_BUCKETS
    if dimension == "bdp":
        return bk.bdp_index(frame.bdp_bytes), bk.BDP_BUCKETS
    if dimension == "loss":
        return bk.loss_index(frame.loss_rate), bk.LOSS_BUCKETS
    if dimension == "region":
        order = sorted(range(len(frame.region_names)), key=lambda i: frame.region_names[i])
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        labels = [bk.Bucket(frame.region_names[i], position, None, None) for position, i in enumerate(order)]
        return (rank[frame.region] if frame.size else frame.region), labels
    if dimension == "size":
        present = sorted(set(frame.size_bucket.tolist()))
        position = {bucket: index for index, bucket in enumerate(present)}
        labels = []
        for index, bucket in enumerate(present):
            lower, upper = bk.size_bucket_bounds(bucket)
            labels.append(bk.Bucket(bk.size_bucket_label(bucket), index, float(lower),
                                    float(upper) if upper is not None else None))
        groups = np.fromiter((position[b] for b in frame.size_bucket.tolist()), dtype=np.int64, count=frame.size)
        return groups, labels
    raise ValueError(f"unknown dimension {dimension!r}; expected one of {', '.join(bk.DIMENSIONS)}")


# ---- public functions ------------------------------------------------------------------------

def compare_by(session: Session, filters: Filters,
               dimension: Literal["rtt", "bandwidth", "bdp", "region", "loss", "size"]) -> list[BucketComparison]:
    """Treatment vs baseline per bucket of ``dimension``; buckets without data are omitted.

    Roll-up rows whose path has no estimate yet (no ``path_estimates`` row, or the needed
    value missing) are left out of the rtt / bandwidth / bdp / loss comparisons.
    """
    return compare_many(session, filters, (dimension,))[dimension]


def compare_many(session: Session, filters: Filters, dimensions: Sequence[str]) -> dict[str, list[BucketComparison]]:
    """:func:`compare_by` for several dimensions over one read of the roll-ups."""
    unknown = [dimension for dimension in dimensions if dimension not in bk.DIMENSIONS]
    if unknown:
        raise ValueError(f"unknown dimension {unknown[0]!r}; expected one of {', '.join(bk.DIMENSIONS)}")
    frame = _load(session, filters, (filters.baseline_iw, filters.treatment_iw), with_hist=True)
    return {dimension: _comparisons(frame, filters, *_dimension_groups(frame, dimension), dimension)
            for dimension in dimensions}


_PERCENTILES = (("p50", 0.5), ("p75", 0.75), ("p90", 0.9), ("p99", 0.99))


def _arm_percentiles(iw: int, n: float, sum_us: float, hist: IntArray, retrans_trials: float,
                     retrans_n: float, bytes_retrans: float, bytes_sent: float) -> ArmPercentiles:
    quantiles = histogram_quantiles(hist, [q for _, q in _PERCENTILES])
    return ArmPercentiles(iw=iw, n=int(n), avg=(sum_us / n / 1000.0) if n > 0 else None,
                          p50=quantiles[0], p75=quantiles[1], p90=quantiles[2], p99=quantiles[3],
                          retrans_share=_share(retrans_trials, retrans_n),
                          retrans_bytes_share=_share(bytes_retrans, bytes_sent))


def percentile_table(session: Session, filters: Filters,
                     group_by: Literal["region"] | None = None) -> list[PercentileTable]:
    """The IETF slides' table: per arm avg/p50/p75/p90/p99 (ms) and retransmission rates.

    ``arms`` lists the treatment arm then the baseline arm (as on the slides), also when an
    arm has no trials (then its values are ``None``).  Percentiles come from the histograms
    (+-1 %).  ``group_by="region"`` gives one table per region, else one table ``"all"``.
    """
    base_iw, treat_iw = filters.baseline_iw, filters.treatment_iw
    frame = _load(session, filters, (base_iw, treat_iw), with_hist=True)
    if group_by == "region":
        groups, labels = _dimension_groups(frame, "region")
        names = [label.label for label in labels]
    else:
        groups, names = np.zeros(frame.size, dtype=np.int64), ["all"]
    arm_slot = np.where(frame.arm == treat_iw, 0, 1)
    cell = groups * 2 + arm_slot
    cells = 2 * len(names)
    sums = {name: _group_sum(getattr(frame, name), cell, cells)
            for name in ("n", "sum_us", "retrans_trials", "retrans_n", "bytes_retrans", "bytes_sent")}
    hists = _histograms(frame, cell, cells)
    tables: list[PercentileTable] = []
    for group, name in enumerate(names):
        arms = []
        for slot, iw in ((0, treat_iw), (1, base_iw)):
            c = 2 * group + slot
            arms.append(_arm_percentiles(iw, sums["n"][c], sums["sum_us"][c], hists[c], sums["retrans_trials"][c],
                                         sums["retrans_n"][c], sums["bytes_retrans"][c], sums["bytes_sent"][c]))
        treatment, baseline = arms
        rows = np.flatnonzero((groups == group) & ((frame.arm == base_iw) | (frame.arm == treat_iw)))
        estimate = _paired(frame, rows, filters)
        keys = ("avg", *(key for key, _ in _PERCENTILES))
        improvement: dict[str, float | None] = dict.fromkeys(keys)
        pct_improvement = dict(improvement)
        improvement_ci: dict[str, list[float | None]] = {key: [None, None] for key in keys}
        pct_improvement_ci = {key: [None, None] for key in keys}
        if not estimate.too_small:
            improvement["avg"], pct_improvement["avg"] = estimate.estimate_ms, estimate.pct
            if estimate.interval is not None:
                improvement_ci["avg"] = [estimate.interval.abs_low, estimate.interval.abs_high]
                pct_improvement_ci["avg"] = [estimate.interval.pct_low, estimate.interval.pct_high]
            intervals = _percentile_intervals(frame, rows, filters)
            for (key, _), interval in zip(_PERCENTILES, intervals):
                base_value, treat_value = getattr(baseline, key), getattr(treatment, key)
                if base_value is None or treat_value is None:
                    continue
                improvement[key] = base_value - treat_value
                pct_improvement[key] = 100.0 * (base_value - treat_value) / base_value if base_value > 0 else None
                if interval is not None:
                    improvement_ci[key] = [interval.abs_low, interval.abs_high]
                    pct_improvement_ci[key] = [interval.pct_low, interval.pct_high]
        increase = None
        if baseline.retrans_share is not None and treatment.retrans_share is not None:
            increase = 100.0 * (treatment.retrans_share - baseline.retrans_share)
        tables.append(PercentileTable(group=name, arms=arms, improvement=improvement,
                                      pct_improvement=pct_improvement, retrans_increase_pp=increase,
                                      improvement_ci=improvement_ci, pct_improvement_ci=pct_improvement_ci,
                                      n_pairs=estimate.n_pairs, n_paths=estimate.n_paths,
                                      too_small=estimate.too_small, note=estimate.reason))
    return tables


def _percentile_intervals(frame: _Frame, rows: IntArray, filters: Filters) -> list[Interval | None]:
    """Intervals of the percentile improvements of roll-up rows ``rows`` (per-path histograms)."""
    paths, path_index = np.unique(frame.path[rows], return_inverse=True)
    if paths.size == 0:
        return [None for _ in _PERCENTILES]
    slot = np.full(frame.size, -1, dtype=np.int64)
    slot[rows] = path_index * 2 + (frame.arm[rows] == filters.treatment_iw)
    hists = _histograms(frame, slot, 2 * paths.size).reshape(paths.size, 2, -1)
    return quantile_difference_intervals(hists[:, 0], hists[:, 1], [q for _, q in _PERCENTILES])


def latency_vs_iw(session: Session, filters: Filters) -> list[ArmStats]:
    """Mean, median and standard deviation per IW present (Figure 2); arms filter ignored."""
    frame = _load(session, filters, None, with_hist=True)
    arms = sorted(set(frame.arm.tolist()))
    index = {iw: i for i, iw in enumerate(arms)}
    groups = np.fromiter((index[a] for a in frame.arm.tolist()), dtype=np.int64, count=frame.size)
    n = _group_sum(frame.n, groups, len(arms))
    sums = _group_sum(frame.sum_us, groups, len(arms))
    sumsq = _group_sum(frame.sumsq, groups, len(arms))
    hists = _histograms(frame, groups, len(arms))
    return [_arm_stats(iw, n[i], sums[i], sumsq[i], hists[i]) for i, iw in enumerate(arms) if n[i] > 0]


def latency_cdf(session: Session, filters: Filters) -> dict[int, list[tuple[float, float]]]:
    """Per IW: ``(latency_ms, cumulative fraction)`` at each occupied histogram bin's upper edge."""
    frame = _load(session, filters, None, with_hist=True)
    arms = sorted(set(frame.arm.tolist()))
    index = {iw: i for i, iw in enumerate(arms)}
    groups = np.fromiter((index[a] for a in frame.arm.tolist()), dtype=np.int64, count=frame.size)
    hists = _histograms(frame, groups, len(arms))
    return {iw: histogram_cdf(hists[i]) for i, iw in enumerate(arms) if hists[i].sum() > 0}


def headline(session: Session, filters: Filters) -> Headline:
    """Totals over every arm matching the filters, and the overall treatment-vs-baseline result."""
    frame = _load(session, filters, None, with_hist=True)
    compared = (frame.arm == filters.baseline_iw) | (frame.arm == filters.treatment_iw)
    comparison = _comparisons(frame, filters, np.where(compared, 0, -1), [bk.Bucket("all", 0, None, None)], "all")
    base = frame.arm == filters.baseline_iw
    treat = frame.arm == filters.treatment_iw
    share_base = _share(frame.retrans_trials[base].sum(), frame.retrans_n[base].sum())
    share_treat = _share(frame.retrans_trials[treat].sum(), frame.retrans_n[treat].sum())
    with_trials = frame.n_trials > 0
    result = comparison[0] if comparison else None
    return Headline(
        n_trials=int(frame.n_trials.sum()),
        n_probes=int(np.unique(frame.probe[with_trials]).size),
        n_regions=int(np.unique(frame.region[with_trials]).size),
        baseline_iw=filters.baseline_iw, treatment_iw=filters.treatment_iw,
        abs_ms=result.abs_ms if result else None, pct=result.pct if result else None,
        pct_ci_low=result.pct_ci_low if result else None, pct_ci_high=result.pct_ci_high if result else None,
        retrans_increase_pp=(100.0 * (share_treat - share_base)
                             if share_base is not None and share_treat is not None else None),
        abs_ci_low=result.abs_ci_low if result else None, abs_ci_high=result.abs_ci_high if result else None,
        n_pairs=result.n_pairs if result else 0, n_paths=result.n_paths if result else 0,
        too_small=result.too_small if result else True, note=result.note if result else None)


def region_summary(session: Session, filters: Filters) -> list[RegionSummary]:
    """Per region: trials of both arms, means, the paired improvement with its interval, a map centroid."""
    summaries: list[RegionSummary] = []
    for result in compare_by(session, filters, "region"):
        lat, lon = region_centroid(result.bucket)
        summaries.append(RegionSummary(
            region=result.bucket, lat=lat, lon=lon, n=result.baseline.n + result.treatment.n,
            abs_ms=result.abs_ms, pct=result.pct, baseline_mean_ms=result.baseline.mean_ms,
            treatment_mean_ms=result.treatment.mean_ms, abs_ci_low=result.abs_ci_low, abs_ci_high=result.abs_ci_high,
            pct_ci_low=result.pct_ci_low, pct_ci_high=result.pct_ci_high, n_baseline=result.baseline.n,
            n_treatment=result.treatment.n, n_pairs=result.n_pairs, n_paths=result.n_paths,
            too_small=result.too_small, note=result.note))
    return summaries


def loss_summary(session: Session, filters: Filters) -> list[LossBucket]:
    """Per path-loss bucket: the comparison and the retransmission rate of each arm."""
    frame = _load(session, filters, (filters.baseline_iw, filters.treatment_iw), with_hist=True)
    groups, labels = _dimension_groups(frame, "loss")
    comparisons = _comparisons(frame, filters, groups, labels, "loss")
    result: list[LossBucket] = []
    for comparison in comparisons:
        rows = groups == comparison.order
        shares = []
        for iw in (filters.baseline_iw, filters.treatment_iw):
            arm_rows = rows & (frame.arm == iw)
            shares.append(_share(frame.retrans_trials[arm_rows].sum(), frame.retrans_n[arm_rows].sum()))
        increase = 100.0 * (shares[1] - shares[0]) if shares[0] is not None and shares[1] is not None else None
        result.append(LossBucket(bucket=comparison.bucket, order=comparison.order, comparison=comparison,
                                 retrans_share_baseline=shares[0], retrans_share_treatment=shares[1],
                                 retrans_increase_pp=increase))
    return result


def fleet(session: Session, now: dt.datetime | None = None) -> list[ProbeRow]:
    """Every probe with its roll-up totals: trials, trials per day (last 7 UTC days), error share."""
    today = (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc).date()
    rows = session.execute(text("""
        SELECT p.id, p.name, p.region, p.country, p.version, p.last_seen_at,
               (p.last_heartbeat ->> 'spool_backlog') AS spool_backlog,
               COALESCE(sum(r.n_trials) FILTER (WHERE r.grain = 1), 0) AS trials_total,
               COALESCE(sum(r.n_errors) FILTER (WHERE r.grain = 1), 0) AS errors,
               COALESCE(sum(r.n_trials) FILTER (WHERE r.grain = 0 AND r.day > :week_start), 0) AS trials_week
        FROM probes AS p LEFT JOIN analysis_rollups AS r
             ON r.probe_id = p.id AND (r.grain = 1 OR r.day > :week_start)
        GROUP BY p.id ORDER BY p.region, p.name"""), {"week_start": today - dt.timedelta(days=7)}).all()
    result: list[ProbeRow] = []
    for row in rows:
        try:
            backlog = int(row.spool_backlog) if row.spool_backlog is not None else None
        except ValueError:
            backlog = None
        total = int(row.trials_total)
        result.append(ProbeRow(probe_id=str(row.id), name=row.name, region=row.region, country=row.country,
                               version=row.version, last_seen_at=row.last_seen_at, trials_total=total,
                               trials_per_day=int(row.trials_week) / 7.0,
                               error_share=int(row.errors) / total if total else None, spool_backlog=backlog))
    return result


def filter_options(session: Session) -> FilterOptions:
    """Choices for the filter bar: campaigns, regions, arms and the object size range seen."""
    campaigns = [(int(row.id), row.name) for row in session.execute(text("SELECT id, name FROM campaigns ORDER BY id"))]
    regions = [row[0] for row in session.execute(text("SELECT DISTINCT region FROM probes ORDER BY region"))]
    arms = [int(row[0]) for row in session.execute(text("SELECT DISTINCT arm_iw FROM analysis_rollups WHERE grain = 1 ORDER BY 1"))]
    size_min, size_max = session.execute(text("SELECT min(size_min), max(size_max) FROM analysis_rollups WHERE grain = 1")).one()
    return FilterOptions(campaigns=campaigns, regions=regions, arms=arms,
                         size_min=int(size_min) if size_min is not None else None,
                         size_max=int(size_max) if size_max is not None else None)


#: The flow roles of the fairness experiment (wire v1/v2 fragments were mapped to ``role`` on ingest).
_FLOW_ROLE_SQL = "t.role"


def fairness(session: Session, filters: Filters) -> list[FairnessPoint]:
    """Offered-load / fairness campaigns (those with an arrival rate or a background flow),
    per campaign x flow role x IW: what the short flows gained and what the competing
    long-lived flow paid.  Filters: campaigns, time window, regions (sizes and arms are not
    applied: the background flow is large by design and every arm of a mix is shown)."""
    where, params = trial_where(replace(filters, size_min=None, size_max=None))
    rows = session.execute(text(f"""
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
        ORDER BY t.campaign_id, flow, t.arm_iw"""), params).all()
    if not rows:
        return []
    campaign_ids = sorted({int(row.campaign_id) for row in rows})
    bottleneck = dict(session.execute(text("""
        SELECT t.campaign_id, avg(e.bottleneck_bps)
        FROM (SELECT DISTINCT campaign_id, probe_id, origin_id FROM trials WHERE campaign_id = ANY(:ids)) AS t
        JOIN path_estimates AS e ON e.probe_id = t.probe_id AND e.origin_id = t.origin_id
        WHERE e.bottleneck_bps > 0 GROUP BY t.campaign_id"""), {"ids": campaign_ids}).all())
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
        points.append(FairnessPoint(
            campaign_id=int(row.campaign_id), campaign_name=row.name, mix="+".join(str(iw) for iw in sorted(row.arms)),
            arrival_rate_per_s=rate, offered_load=load, flow=row.flow, iw=int(row.arm_iw), n=int(row.n),
            errors=int(row.errors), mean_bytes=_float(row.mean_bytes), throughput_bps=_float(row.throughput_bps),
            fct_mean_ms=_float(row.fct_mean_ms), fct_p50_ms=_float(row.fct_p50_ms), fct_p90_ms=_float(row.fct_p90_ms),
            retrans_flow_share=_share(float(row.retrans_flows), float(row.joined_flows)),
            bytes_retrans_share=(_share(float(row.bytes_retrans), float(row.bytes_sent))
                                 if row.bytes_sent is not None and row.bytes_retrans is not None else None),
            fct_p50_ci_ms=(p50_ci[0] / 1000.0, p50_ci[1] / 1000.0) if p50_ci else None,
            retrans_flows=int(row.retrans_flows), joined_flows=int(row.joined_flows),
            retrans_flow_share_ci=proportion_interval(int(row.retrans_flows), int(row.joined_flows))))
    return points


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None


# ---- raw path --------------------------------------------------------------------------------

#: Columns of the trials page and the CSV export, in order.
TRIAL_COLUMNS: tuple[str, ...] = (
    "trial_id", "started_at", "campaign_id", "probe_id", "region", "origin_id", "arm_iw", "object_size",
    "total_us", "ttfb_us", "server_latency_us", "http_status", "error_kind", "tcpi_total_retrans",
    "tcpi_min_rtt_us", "server_total_retrans", "server_bytes_retrans", "server_bytes_sent")
#: The trials page counts at most this many matches (then reports ``TRIALS_COUNT_CAP + 1``).
TRIALS_COUNT_CAP = 100_000


def _raw_select(filters: Filters) -> tuple[str, dict[str, Any]]:
    where, params = trial_where(filters)
    columns = ", ".join("p.region" if name == "region" else f"t.{name}" for name in TRIAL_COLUMNS)
    return f"SELECT {columns} FROM trials AS t LEFT JOIN probes AS p ON p.id = t.probe_id WHERE {where}", params


def trials_page(session: Session, filters: Filters, limit: int = 100, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Raw trials matching the filters exactly, newest first, and how many match (capped).

    The count stops at :data:`TRIALS_COUNT_CAP`; more matches are reported as cap + 1.
    """
    limit = max(0, min(int(limit), 10_000))
    offset = max(0, int(offset))
    select, params = _raw_select(filters)
    rows = session.execute(text(f"{select} ORDER BY t.started_at DESC, t.trial_id LIMIT :limit OFFSET :offset"),
                           {**params, "limit": limit, "offset": offset}).all()
    where, count_params = trial_where(filters)
    total = session.execute(text(f"""
        SELECT count(*) FROM (SELECT 1 FROM trials AS t LEFT JOIN probes AS p ON p.id = t.probe_id
                              WHERE {where} LIMIT :cap) AS matches"""), {**count_params, "cap": TRIALS_COUNT_CAP + 1}
                            ).scalar_one()
    return [dict(row._mapping) for row in rows], int(total)


def _csv_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return "" if value is None else value


def iter_trials_csv(session: Session, filters: Filters, chunk_rows: int = 2000) -> Iterator[str]:
    """Raw trials matching the filters as CSV text chunks (header first), streamed by a server-side cursor."""
    select, params = _raw_select(filters)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(TRIAL_COLUMNS)
    result = session.execute(text(f"{select} ORDER BY t.started_at, t.trial_id"), params,
                             execution_options={"yield_per": chunk_rows})
    for partition in result.partitions(chunk_rows):
        for row in partition:
            writer.writerow([_csv_value(value) for value in row])
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    if buffer.tell():
        yield buffer.getvalue()

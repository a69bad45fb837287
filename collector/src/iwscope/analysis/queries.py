"""The analysis functions: every figure's data, read from the roll-ups (raw path noted).

Each public function takes a SQLAlchemy ``Session`` and a :class:`Filters` and returns frozen
dataclasses (:mod:`results`; JSON-serialisable with ``dataclasses.asdict``).  Units: latencies in
milliseconds; ``pct`` values in percent (12.0 = 12 %); shares (``retrans_share``, ...) as
fractions 0..1; ``retrans_increase_pp`` in percentage points.  Improvement = baseline -
treatment (positive = the treatment arm is faster).

Each call reads the bucket roll-ups (histograms, arm statistics) and the paired estimate's
per-path sums (:mod:`frames`), each with one SQL statement; grouping into buckets, histogram
merges, percentiles and intervals happen in numpy.

These are the *benefit* figures: the trials of cost-experiment campaigns (competing-flow phases:
short flows under load on a shared bottleneck) are left out unless ``Filters.include_cost``
(:func:`~iwscope.analysis.filters.without_cost`, applied by :func:`reads.read` and by the
latency functions); :mod:`cost` and :mod:`offered_load` read them.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis import buckets as bk
from iwscope.analysis import pathcopy
from iwscope.analysis._types import IntArray
from iwscope.analysis.filters import Filters, without_cost
from iwscope.analysis.frames import (
    WEEK_DAYS,
    Frame,
    load_probe_totals,
)
from iwscope.analysis.paired import MIN_PAIRS, PairedEstimate
from iwscope.analysis.reads import Data, cached_buckets, copy_or_postgresql, group_sum, histograms, paired_estimate, read
from iwscope.analysis.results import (
    ArmPercentiles,
    ArmStats,
    BucketComparison,
    FilterOptions,
    Headline,
    LossBucket,
    PercentileTable,
    ProbeRow,
    RegionSummary,
)
from iwscope.analysis.stats import (
    Interval,
    histogram_cdf,
    histogram_quantiles,
    mean_std_ms,
    quantile_difference_intervals,
    share,
)


def arm_stats(iw: int, n: float, sum_us: float, sumsq: float, hist: IntArray | None) -> ArmStats:
    count = int(n)
    mean, std = mean_std_ms(count, sum_us, sumsq)
    p25, median, p75 = histogram_quantiles(hist, [0.25, 0.5, 0.75]) if hist is not None and count > 0 else (None, None, None)
    return ArmStats(iw=iw, n=count, mean_ms=mean, median_ms=median, std_ms=std, p25_ms=p25, p75_ms=p75)


#: Most paths whose own histograms a percentile interval reads; above it, a fixed pseudo-random
#: subset of this many paths stands in (``_percentile_intervals``).
PERCENTILE_DETAIL_PATHS = 200
#: Per-path histograms are read from the paths' raw trials (about 2 ms a path on the benchmark
#: box), so one call reads at most this many paths over all its groups: with many groups each
#: gets an equal share, but never fewer than ``PERCENTILE_MIN_DETAIL_PATHS`` (or all it has).
PERCENTILE_DETAIL_BUDGET = 600
PERCENTILE_MIN_DETAIL_PATHS = 100


def _comparisons(
    data: Data, groups: tuple[IntArray, IntArray], labels: list[bk.Bucket], dimension: str
) -> list[BucketComparison]:
    """One comparison per group that holds data in either arm (groups < 0 are dropped).
    ``groups`` = (group of each path-frame row, group of each bucket-frame row)."""
    path_groups, bucket_groups = groups
    frame, filters = data.buckets, data.filters
    n_groups = len(labels)
    base_iw, treat_iw = filters.baseline_iw, filters.treatment_iw
    arm_slot = np.where(frame.arm == base_iw, 0, np.where(frame.arm == treat_iw, 1, -1))
    valid = (bucket_groups >= 0) & (arm_slot >= 0)
    cell = np.where(valid, bucket_groups * 2 + arm_slot, -1)
    cells = 2 * n_groups
    keep = cell >= 0
    n = group_sum(frame.n[keep], cell[keep], cells)
    sums = group_sum(frame.sum_us[keep], cell[keep], cells)
    sumsq = group_sum(frame.sumsq[keep], cell[keep], cells)
    hists = histograms(frame, cell, cells)
    path_valid = path_groups >= 0
    results: list[BucketComparison] = []
    for group, label in enumerate(labels):
        b, t = 2 * group, 2 * group + 1
        if n[b] == 0 and n[t] == 0:
            continue
        baseline = arm_stats(base_iw, n[b], sums[b], sumsq[b], hists[b])
        treatment = arm_stats(treat_iw, n[t], sums[t], sumsq[t], hists[t])
        estimate = paired_estimate(data, np.flatnonzero(path_valid & (path_groups == group)))
        results.append(bucket_comparison(dimension, label, baseline, treatment, estimate))
    return results


def bucket_comparison(
    dimension: str, label: bk.Bucket, baseline: ArmStats, treatment: ArmStats, estimate: PairedEstimate
) -> BucketComparison:
    """One bucket's comparison: both arms as they are, the paired improvement only when there
    are enough pairs (else "n too small": ``too_small`` and no numbers)."""
    shown = not estimate.too_small
    interval = estimate.interval if shown else None
    return BucketComparison(
        dimension=dimension,
        bucket=label.label,
        order=label.order,
        lower=label.lower,
        upper=label.upper,
        baseline=baseline,
        treatment=treatment,
        abs_ms=estimate.estimate_ms if shown else None,
        abs_ci_low=interval.abs_low if interval else None,
        abs_ci_high=interval.abs_high if interval else None,
        pct=estimate.pct if shown else None,
        pct_ci_low=interval.pct_low if interval else None,
        pct_ci_high=interval.pct_high if interval else None,
        n_pairs=estimate.n_pairs,
        n_paths=estimate.n_paths,
        method=estimate.method if estimate.n_pairs else None,
        too_small=estimate.too_small,
        note=estimate.reason,
    )


_BUCKET_COLUMNS = {
    "rtt": ("rtt_bucket", bk.RTT_BUCKETS),
    "bandwidth": ("bandwidth_bucket", bk.BANDWIDTH_BUCKETS),
    "bdp": ("bdp_bucket", bk.BDP_BUCKETS),
    "loss": ("loss_bucket", bk.LOSS_BUCKETS),
}


def _dimension_groups(data: Data, dimension: str) -> tuple[tuple[IntArray, IntArray], list[bk.Bucket]]:
    """Group index of every row of both frames and the bucket descriptions for ``dimension``."""
    frames = (data.paths, data.buckets)
    if dimension in _BUCKET_COLUMNS:
        column, labels = _BUCKET_COLUMNS[dimension]
        first, second = (getattr(frame, column) for frame in frames)
        return (first, second), labels
    if dimension == "region":
        # only the regions with rows here: a frame may name regions it has none of (the analysis
        # copy's frames name every region it knows, e.g. a cost experiment's bottleneck left out)
        names = sorted({frame.region_names[index] for frame in frames for index in np.unique(frame.region).tolist()})
        rank = {name: position for position, name in enumerate(names)}
        labels = [bk.Bucket(name, position, None, None) for position, name in enumerate(names)]
        first, second = (
            np.array([rank.get(name, -1) for name in frame.region_names], dtype=np.int64)[frame.region]
            if frame.size
            else frame.region
            for frame in frames
        )
        return (first, second), labels
    if dimension == "size":
        octaves = np.union1d(data.paths.size_bucket, data.buckets.size_bucket).astype(np.int64)  # sorted, unique
        present = octaves.tolist()
        labels = []
        for index, bucket in enumerate(present):
            lower, upper = bk.size_bucket_bounds(bucket)
            labels.append(
                bk.Bucket(bk.size_bucket_label(bucket), index, float(lower), float(upper) if upper is not None else None)
            )
        # an octave's place among them is its label's position
        first, second = (np.searchsorted(octaves, frame.size_bucket).astype(np.int64) for frame in frames)
        return (first, second), labels
    raise ValueError(f"unknown dimension {dimension!r}; expected one of {', '.join(bk.DIMENSIONS)}")


# ---- public functions ------------------------------------------------------------------------


def compare_by(
    session: Session, filters: Filters, dimension: Literal["rtt", "bandwidth", "bdp", "region", "loss", "size"]
) -> list[BucketComparison]:
    """Treatment vs baseline per bucket of ``dimension``; buckets without data are omitted.

    Paths without an estimate yet (no ``path_estimates`` row, or the needed value missing when
    their trials were folded in) are left out of the rtt / bandwidth / bdp / loss comparisons.
    """
    return compare_many(session, filters, (dimension,))[dimension]


def compare_many(session: Session, filters: Filters, dimensions: Sequence[str]) -> dict[str, list[BucketComparison]]:
    """:func:`compare_by` for several dimensions over one read of the roll-ups."""
    unknown = [dimension for dimension in dimensions if dimension not in bk.DIMENSIONS]
    if unknown:
        raise ValueError(f"unknown dimension {unknown[0]!r}; expected one of {', '.join(bk.DIMENSIONS)}")
    data = read(session, filters, by_size="size" in dimensions)
    return {dimension: _comparisons(data, *_dimension_groups(data, dimension), dimension) for dimension in dimensions}


_PERCENTILES = (("p50", 0.5), ("p75", 0.75), ("p90", 0.9), ("p99", 0.99))


def _arm_percentiles(
    iw: int,
    n: float,
    sum_us: float,
    hist: IntArray,
    retrans_trials: float,
    retrans_n: float,
    bytes_retrans: float,
    bytes_sent: float,
) -> ArmPercentiles:
    quantiles = histogram_quantiles(hist, [q for _, q in _PERCENTILES])
    return ArmPercentiles(
        iw=iw,
        n=int(n),
        avg=(sum_us / n / 1000.0) if n > 0 else None,
        p50=quantiles[0],
        p75=quantiles[1],
        p90=quantiles[2],
        p99=quantiles[3],
        retrans_share=share(retrans_trials, retrans_n),
        retrans_bytes_share=share(bytes_retrans, bytes_sent),
    )


def percentile_table(session: Session, filters: Filters, group_by: Literal["region"] | None = None) -> list[PercentileTable]:
    """The IETF slides' table: per arm avg/p50/p75/p90/p99 (ms) and retransmission rates.

    ``arms`` lists the treatment arm then the baseline arm (as on the slides), also when an
    arm has no trials (then its values are ``None``).  Percentiles come from the histograms
    (+-1 %).  ``group_by="region"`` gives one table per region, else one table ``"all"``.
    """
    base_iw, treat_iw = filters.baseline_iw, filters.treatment_iw
    data = read(session, filters)
    frame = data.buckets
    if group_by == "region":
        (path_groups, groups), labels = _dimension_groups(data, "region")
        names = [label.label for label in labels]
    else:
        path_groups = np.zeros(data.paths.size, dtype=np.int64)
        groups, names = np.zeros(frame.size, dtype=np.int64), ["all"]
    group_rows = [np.flatnonzero(path_groups == group) for group in range(len(names))]
    # which groups show a number (an estimate's too_small, from the same pairs), so the per-path
    # histograms their intervals need are read while the rest is computed
    showing = [round(float(data.paths.n_pairs[rows].sum())) >= MIN_PAIRS for rows in group_rows]
    limit = min(PERCENTILE_DETAIL_PATHS, max(PERCENTILE_MIN_DETAIL_PATHS, PERCENTILE_DETAIL_BUDGET // max(sum(showing), 1)))
    detail_paths = [
        _detail_paths(data, rows, limit) if shown else (np.zeros(0, dtype=np.int64), 0)
        for rows, shown in zip(group_rows, showing, strict=True)
    ]
    union = np.unique(np.concatenate([paths for paths, _ in detail_paths])) if detail_paths else np.zeros(0, np.int64)
    reading = data.start_path_histograms(union) if union.size else None  # one read for every group
    arm_slot = np.where(frame.arm == treat_iw, 0, 1)
    cell = groups * 2 + arm_slot
    cells = 2 * len(names)
    sums = {
        name: group_sum(getattr(frame, name), cell, cells)
        for name in ("n", "sum_us", "retrans_trials", "retrans_n", "bytes_retrans", "bytes_sent")
    }
    hists = histograms(frame, cell, cells)
    estimates = [paired_estimate(data, rows) for rows in group_rows]
    detail = reading() if reading is not None else None
    tables: list[PercentileTable] = []
    for group, name in enumerate(names):
        arms = []
        for slot, iw in ((0, treat_iw), (1, base_iw)):
            c = 2 * group + slot
            arms.append(
                _arm_percentiles(
                    iw,
                    sums["n"][c],
                    sums["sum_us"][c],
                    hists[c],
                    sums["retrans_trials"][c],
                    sums["retrans_n"][c],
                    sums["bytes_retrans"][c],
                    sums["bytes_sent"][c],
                )
            )
        treatment, baseline = arms
        estimate = estimates[group]
        keys = ("avg", *(key for key, _ in _PERCENTILES))
        improvement: dict[str, float | None] = dict.fromkeys(keys)
        pct_improvement = dict(improvement)
        improvement_ci: dict[str, list[float | None]] = {key: [None, None] for key in keys}
        pct_improvement_ci: dict[str, list[float | None]] = {key: [None, None] for key in keys}
        if not estimate.too_small:
            improvement["avg"], pct_improvement["avg"] = estimate.estimate_ms, estimate.pct
            if estimate.interval is not None:
                improvement_ci["avg"] = [estimate.interval.abs_low, estimate.interval.abs_high]
                pct_improvement_ci["avg"] = [estimate.interval.pct_low, estimate.interval.pct_high]
            full = {key: (getattr(baseline, key), getattr(treatment, key)) for key, _ in _PERCENTILES}
            paths, n_paths = detail_paths[group]
            intervals = (
                _percentile_intervals(data, detail, paths, n_paths, full) if detail is not None else [None for _ in _PERCENTILES]
            )
            for (key, _), interval in zip(_PERCENTILES, intervals, strict=True):
                base_value, treat_value = full[key]
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
        tables.append(
            PercentileTable(
                group=name,
                arms=arms,
                improvement=improvement,
                pct_improvement=pct_improvement,
                retrans_increase_pp=increase,
                improvement_ci=improvement_ci,
                pct_improvement_ci=pct_improvement_ci,
                n_pairs=estimate.n_pairs,
                n_paths=estimate.n_paths,
                too_small=estimate.too_small,
                note=estimate.reason,
            )
        )
    return tables


def _detail_paths(data: Data, rows: IntArray, limit: int) -> tuple[IntArray, int]:
    """The paths whose histograms a percentile interval of ``data.paths`` entries ``rows`` reads,
    and how many paths there are: all of them up to ``limit``, else a fixed pseudo-random subset
    of that many (``PathIds.order_keys``: the same paths every call)."""
    paths = np.unique(data.paths.path[rows])
    if paths.size <= limit:
        return paths, int(paths.size)
    chosen = paths[np.argsort(data.paths.path_ids.order_keys(paths), kind="stable")[:limit]]
    return np.sort(chosen), int(paths.size)


def _percentile_intervals(
    data: Data, detail: Frame, paths: IntArray, n_paths: int, full: dict[str, tuple[float | None, float | None]]
) -> list[Interval | None]:
    """Intervals of the percentile improvements from the per-path histograms of ``paths``
    (``detail`` holds at least their rows).

    When ``paths`` is a subset of ``n_paths`` (:func:`_detail_paths`), the paths are resampled
    from the subset (subsampling, Politis & Romano 1994): the interval's distances from the
    subset's own difference shrink by ``sqrt(subset / paths)`` and are put around the
    difference of all paths (``full``: baseline and treatment value per key)."""
    if paths.size == 0:
        return [None for _ in _PERCENTILES]
    scale = math.sqrt(paths.size / n_paths)
    treat_iw = data.filters.treatment_iw
    index = np.minimum(np.searchsorted(paths, detail.path), paths.size - 1)
    wanted = (paths[index] == detail.path) & ((detail.arm == treat_iw) | (detail.arm == data.filters.baseline_iw))
    slot = np.where(wanted, index * 2 + (detail.arm == treat_iw), -1)
    hists = histograms(detail, slot, 2 * paths.size).reshape(paths.size, 2, -1)
    intervals = quantile_difference_intervals(hists[:, 0], hists[:, 1], [q for _, q in _PERCENTILES])
    if scale == 1.0:
        return intervals
    subset_base = histogram_quantiles(hists[:, 0].sum(axis=0), [q for _, q in _PERCENTILES])
    subset_treat = histogram_quantiles(hists[:, 1].sum(axis=0), [q for _, q in _PERCENTILES])
    scaled: list[Interval | None] = []
    for (key, _), interval, sub_b, sub_t in zip(_PERCENTILES, intervals, subset_base, subset_treat, strict=True):
        base_value, treat_value = full[key]
        if interval is None or sub_b is None or sub_t is None or base_value is None or treat_value is None:
            scaled.append(None)
            continue
        sub_abs, all_abs = sub_b - sub_t, base_value - treat_value
        sub_pct = 100.0 * sub_abs / sub_b if sub_b > 0 else float("nan")
        all_pct = 100.0 * all_abs / base_value if base_value > 0 else float("nan")
        scaled.append(
            Interval(
                all_abs - (sub_abs - interval.abs_low) * scale,
                all_abs + (interval.abs_high - sub_abs) * scale,
                all_pct - (sub_pct - interval.pct_low) * scale,
                all_pct + (interval.pct_high - sub_pct) * scale,
            )
        )
    return scaled


def _per_arm(frame: Frame) -> tuple[list[int], IntArray]:
    arms = sorted(set(frame.arm.tolist()))
    index = {iw: i for i, iw in enumerate(arms)}
    return arms, np.fromiter((index[a] for a in frame.arm.tolist()), dtype=np.int64, count=frame.size)


def latency_vs_iw(session: Session, filters: Filters) -> list[ArmStats]:
    """Mean, median and standard deviation per IW present (Figure 2); arms filter ignored."""
    frame = cached_buckets(session, without_cost(session, filters), None)
    arms, groups = _per_arm(frame)
    n = group_sum(frame.n, groups, len(arms))
    sums = group_sum(frame.sum_us, groups, len(arms))
    sumsq = group_sum(frame.sumsq, groups, len(arms))
    hists = histograms(frame, groups, len(arms))
    return [arm_stats(iw, n[i], sums[i], sumsq[i], hists[i]) for i, iw in enumerate(arms) if n[i] > 0]


def latency_cdf(session: Session, filters: Filters) -> dict[int, list[tuple[float, float]]]:
    """Per IW: ``(latency_ms, cumulative fraction)`` at each occupied histogram bin's upper edge."""
    frame = cached_buckets(session, without_cost(session, filters), None)
    arms, groups = _per_arm(frame)
    hists = histograms(frame, groups, len(arms))
    return {iw: histogram_cdf(hists[i]) for i, iw in enumerate(arms) if hists[i].sum() > 0}


def headline(session: Session, filters: Filters) -> Headline:
    """Totals over every arm matching the filters, and the overall treatment-vs-baseline result."""
    data = read(session, filters, all_arms=True)
    frame = data.buckets
    bucket_groups = np.where((frame.arm == filters.baseline_iw) | (frame.arm == filters.treatment_iw), 0, -1)
    path_groups = np.zeros(data.paths.size, dtype=np.int64)
    comparison = _comparisons(data, (path_groups, bucket_groups), [bk.Bucket("all", 0, None, None)], "all")
    base = frame.arm == filters.baseline_iw
    treat = frame.arm == filters.treatment_iw
    share_base = share(frame.retrans_trials[base].sum(), frame.retrans_n[base].sum())
    share_treat = share(frame.retrans_trials[treat].sum(), frame.retrans_n[treat].sum())
    with_trials = frame.n_trials > 0
    result = comparison[0] if comparison else None
    return Headline(
        n_trials=int(frame.n_trials.sum()),
        n_probes=int(np.unique(data.paths.probe[data.paths.n_trials > 0]).size),
        n_regions=int(np.unique(frame.region[with_trials]).size),
        baseline_iw=filters.baseline_iw,
        treatment_iw=filters.treatment_iw,
        abs_ms=result.abs_ms if result else None,
        pct=result.pct if result else None,
        pct_ci_low=result.pct_ci_low if result else None,
        pct_ci_high=result.pct_ci_high if result else None,
        retrans_increase_pp=(100.0 * (share_treat - share_base) if share_base is not None and share_treat is not None else None),
        abs_ci_low=result.abs_ci_low if result else None,
        abs_ci_high=result.abs_ci_high if result else None,
        n_pairs=result.n_pairs if result else 0,
        n_paths=result.n_paths if result else 0,
        too_small=result.too_small if result else True,
        note=result.note if result else None,
    )


def region_summary(session: Session, filters: Filters) -> list[RegionSummary]:
    """Per region: trials of both arms, means, the paired improvement with its interval."""
    summaries: list[RegionSummary] = []
    for result in compare_by(session, filters, "region"):
        summaries.append(
            RegionSummary(
                region=result.bucket,
                n=result.baseline.n + result.treatment.n,
                abs_ms=result.abs_ms,
                pct=result.pct,
                baseline_mean_ms=result.baseline.mean_ms,
                treatment_mean_ms=result.treatment.mean_ms,
                abs_ci_low=result.abs_ci_low,
                abs_ci_high=result.abs_ci_high,
                pct_ci_low=result.pct_ci_low,
                pct_ci_high=result.pct_ci_high,
                n_baseline=result.baseline.n,
                n_treatment=result.treatment.n,
                n_pairs=result.n_pairs,
                n_paths=result.n_paths,
                too_small=result.too_small,
                note=result.note,
            )
        )
    return summaries


def loss_summary(session: Session, filters: Filters) -> list[LossBucket]:
    """Per path-loss bucket: the comparison and the retransmission rate of each arm."""
    data = read(session, filters)
    (path_groups, groups), labels = _dimension_groups(data, "loss")
    comparisons = _comparisons(data, (path_groups, groups), labels, "loss")
    frame = data.buckets
    result: list[LossBucket] = []
    for comparison in comparisons:
        rows = groups == comparison.order
        shares = []
        for iw in (filters.baseline_iw, filters.treatment_iw):
            arm_rows = rows & (frame.arm == iw)
            shares.append(share(frame.retrans_trials[arm_rows].sum(), frame.retrans_n[arm_rows].sum()))
        increase = 100.0 * (shares[1] - shares[0]) if shares[0] is not None and shares[1] is not None else None
        result.append(
            LossBucket(
                bucket=comparison.bucket,
                order=comparison.order,
                comparison=comparison,
                retrans_share_baseline=shares[0],
                retrans_share_treatment=shares[1],
                retrans_increase_pp=increase,
            )
        )
    return result


def fleet(session: Session, now: dt.datetime | None = None) -> list[ProbeRow]:
    """Every probe with its roll-up totals: trials, trials per day (last 7 UTC days), error share
    (the totals from the analysis copy when configured and usable, see ``pathcopy``)."""
    today = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC).date()
    totals = copy_or_postgresql(
        lambda directory: pathcopy.probe_totals(session, directory, today), lambda: load_probe_totals(session, today)
    )
    rows = session.execute(
        text("""
        SELECT p.id, p.name, p.region, p.country, p.version, p.last_seen_at,
               (p.last_heartbeat ->> 'spool_backlog') AS spool_backlog
        FROM probes AS p ORDER BY p.region, p.name""")
    ).all()
    result: list[ProbeRow] = []
    for row in rows:
        try:
            backlog = int(row.spool_backlog) if row.spool_backlog is not None else None
        except ValueError:
            backlog = None
        total, errors, week = totals.get(str(row.id), (0, 0, 0))
        result.append(
            ProbeRow(
                probe_id=str(row.id),
                name=row.name,
                region=row.region,
                country=row.country,
                version=row.version,
                last_seen_at=row.last_seen_at,
                trials_total=total,
                trials_per_day=week / WEEK_DAYS,
                error_share=errors / total if total else None,
                spool_backlog=backlog,
            )
        )
    return result


def filter_options(session: Session) -> FilterOptions:
    """Choices for the filter bar: campaigns, regions, arms and the object size range seen."""
    campaigns = [(int(row.id), row.name) for row in session.execute(text("SELECT id, name FROM campaigns ORDER BY id"))]
    regions = [row[0] for row in session.execute(text("SELECT DISTINCT region FROM probes ORDER BY region"))]
    arms = [
        int(row[0])
        for row in session.execute(text("SELECT DISTINCT arm_iw FROM analysis_bucket_rollups WHERE grain = 1 ORDER BY 1"))
    ]
    size_min, size_max = session.execute(
        text("SELECT min(size_min), max(size_max) FROM analysis_bucket_rollups WHERE grain = 1")
    ).one()
    return FilterOptions(
        campaigns=campaigns,
        regions=regions,
        arms=arms,
        size_min=int(size_min) if size_min is not None else None,
        size_max=int(size_max) if size_max is not None else None,
    )

"""Statistics of the passive, real-user study: the cluster bootstrap over mergeable histograms.

What the servers upload (``passive_aggregates``) are sums per arm x cluster x ... and sparse
latency histograms in the collector's layout (:mod:`iwscope.analysis.buckets`: bins 2 % wide,
read at their geometric centre, so a percentile is within +-1 % of the exact order statistic of
the binned values -- :data:`HIST_RESOLUTION_PCT`).  Here, one arm in one group (a region, a day,
a Figure 5 bucket, a treated share) is a :class:`ClusterSums`: per *cluster* (the keyed hash of
the client prefix modulo 32: all connections of a prefix fall in one cluster) the sums and the
histogram.

Intervals (95 %, expanded percentile method, :data:`PASSIVE_REPLICATES` replicates, seeded):

* **Cluster bootstrap.**  Connections of one prefix share a path, a client and its habits, so
  they are not independent; clusters are.  A replicate draws the arm's clusters with data with
  replacement (multinomial weights, :func:`iwscope.analysis.stats.multinomial_weights`), adds
  up the drawn clusters' sums and histograms (one ``weights @ matrix`` product: replicates x
  clusters times clusters x bins) and recomputes the statistic: a mean is the ratio of summed
  latencies to summed responses, a percentile the nearest-rank quantile of the merged
  histogram, a rate the ratio of summed counts.
* **Expanded percentiles** (Hesterberg 2015, :func:`expanded_tail`): with k clusters the plain
  percentile interval is too narrow (it knows neither the ``(k-1)/k`` of the bootstrap variance
  nor Student's t), so its tails are read at ``Phi(-sqrt(k/(k-1)) t_{k-1, 0.975})`` -- 1.9 %
  and 98.1 % at 32 clusters, 0.1 % and 99.9 % at 5 --; k of a difference is the smaller arm's.
  On synthetic campaigns of 2 x 32 clusters with lognormal latencies and a cluster random
  effect (``tests/analysis/test_passive_stats.py``) the mean and median improvement's interval
  covers the truth in 93.0 % and 94.3 % of 300 campaigns (plain percentiles: 91.5 % and 92.5 % of
  200; resampling connections instead of clusters: under 80 %).
* **Arms are resampled independently**: different arms are different prefixes (an arm is a hash
  range of prefixes), so an improvement's replicate is the baseline's replicate minus the
  treatment's, each from its own draw, and its percent is over the baseline's replicate.
* The seed of a draw is :data:`PASSIVE_SEED` with a stable key of what is drawn (the group, the
  arm, the statistic), so a number does not depend on which other groups were asked for.
* **Share sweep** (:func:`paired_weights`): one arm's clusters at different treated shares are
  largely the same prefixes (a growing share moves prefixes out of the default arm only), so the
  levels are resampled *together*: the same cluster weights for every level, and a level's change
  against the reference level is the difference of the paired replicates.
* **n too small**: an arm (in a group) with fewer than :data:`MIN_RESPONSES` measured responses
  or fewer than :data:`MIN_CLUSTERS` clusters with a response gets no latency number; fewer than
  :data:`MIN_CONNECTIONS` connections or :data:`MIN_CLUSTERS` clusters, no rate.
* **A rate with no event at all (or only events)**: resampling cannot show the uncertainty of
  0 of n (every replicate is 0), so the interval is Wilson's over the connections (0 to about 3.8
  / n); a difference involving such an arm combines each arm's 97.5 % interval (Bonferroni: it
  covers at least 95 %).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from iwscope.analysis._types import FloatArray, IntArray
from iwscope.analysis.buckets import HIST_BINS, HIST_CENTER_US, HIST_RATIO
from iwscope.analysis.stats import BOOTSTRAP_SEED, multinomial_weights, proportion_interval, t_quantile

#: Replicates of every passive interval (the real-users work asked for at least 1,000).
PASSIVE_REPLICATES = 2000
#: Seed of every draw (combined with a stable key of what is drawn).
PASSIVE_SEED = BOOTSTRAP_SEED
#: Fewest measured responses an arm (in a group) needs for a latency number.
MIN_RESPONSES = 30
#: Fewest connections an arm (in a group) needs for a rate or a share.
MIN_CONNECTIONS = 30
#: Fewest clusters with data an arm (in a group) needs for any number.
MIN_CLUSTERS = 5
#: Half-width of a histogram bin around its geometric centre, percent (bins are 2 % wide).
HIST_RESOLUTION_PCT = round(100.0 * (math.sqrt(HIST_RATIO) - 1.0), 3)
#: The percentile table's columns (the IETF 78 slides): the mean and four percentiles.
LATENCY_KEYS: tuple[str, ...] = ("avg", "p50", "p75", "p90", "p99")
QUANTILES: dict[str, float] = {"p50": 0.50, "p75": 0.75, "p90": 0.90, "p99": 0.99}
#: The sums a cluster carries (``passive_aggregates`` columns; ``biased_connections`` is the
#: connections of rows flagged ``biased``).
SUM_NAMES: tuple[str, ...] = (
    "connections",
    "responses",
    "latency_sum_us",
    "retrans_connections",
    "data_segs_out",
    "total_retrans",
    "syn_retrans",
    "rwnd_limited",
    "reused_after_idle",
    "tls",
    "biased_connections",
)
#: Fewest finite replicates an interval is read from.
_MIN_FINITE = 10


@dataclass(frozen=True)
class Value:
    """A number with its 95 % interval (``None`` each: n too small, or no interval)."""

    value: float | None
    low: float | None = None
    high: float | None = None


MISSING = Value(None, None, None)


@dataclass(frozen=True)
class ClusterSums:
    """One arm in one group, per cluster that has data: ``sums[name]`` (clusters,) and the
    latency histogram window ``hist`` (clusters, width) of bins ``hist_lo .. hist_lo+width-1``."""

    clusters: IntArray
    sums: Mapping[str, FloatArray]
    hist: FloatArray
    hist_lo: int = 0

    @property
    def size(self) -> int:
        return int(self.clusters.size)

    def total(self, name: str) -> float:
        return float(self.sums[name].sum()) if self.size else 0.0

    def clusters_with(self, name: str) -> int:
        return int(np.count_nonzero(self.sums[name] > 0)) if self.size else 0


def empty_sums() -> ClusterSums:
    return ClusterSums(np.zeros(0, dtype=np.int64), {name: np.zeros(0) for name in SUM_NAMES}, np.zeros((0, 0)), 0)


def cluster_sums(
    clusters: Sequence[int], sums: Mapping[str, Sequence[float]], histograms: Sequence[Mapping[int, float]]
) -> ClusterSums:
    """A :class:`ClusterSums` from per-cluster values: ``sums[name][i]`` and ``histograms[i]``
    (bin -> count) of cluster ``clusters[i]`` (names missing from ``sums`` are zeros)."""
    count = len(clusters)
    occupied = [bin_ for histogram in histograms for bin_, value in histogram.items() if value]
    lo = min(occupied) if occupied else 0
    width = (max(occupied) - lo + 1) if occupied else 0
    hist = np.zeros((count, width))
    for row, histogram in enumerate(histograms):
        for bin_, value in histogram.items():
            if value:
                hist[row, bin_ - lo] += value
    arrays = {name: np.asarray(sums.get(name, [0.0] * count), dtype=np.float64) for name in SUM_NAMES}
    return ClusterSums(np.asarray(clusters, dtype=np.int64), arrays, hist, lo)


def stable_key(*parts: object) -> int:
    """A stable 32-bit key of ``parts`` (the seed of a draw together with :data:`PASSIVE_SEED`)."""
    return zlib.crc32("|".join(str(part) for part in parts).encode("utf-8"))


def draw_weights(units: int, key: int, replicates: int = PASSIVE_REPLICATES) -> FloatArray:
    """Multinomial cluster weights (replicates, units) of the draw named ``key``."""
    return multinomial_weights(np.random.default_rng([PASSIVE_SEED, key]), replicates, units)


def expanded_tail(units: int | None, level: float = 0.95) -> float:
    """The lower tail (percent) of the expanded percentile interval for ``units`` resampled
    clusters (Hesterberg 2015): ``Phi(-sqrt(k / (k - 1)) t_{k-1})`` instead of ``(1 - level) / 2``,
    which undoes the bootstrap's narrowness with few clusters (``None``: the plain percentile)."""
    if units is None or units < 2:
        return 50.0 * (1.0 - level)
    z = math.sqrt(units / (units - 1)) * t_quantile(0.5 + level / 2.0, units - 1)
    return 100.0 * NormalDist().cdf(-z)


def interval(replicates: FloatArray, level: float = 0.95, units: int | None = None) -> tuple[float | None, float | None]:
    """Expanded percentile interval (:func:`expanded_tail`) of the finite replicates (``None``
    with fewer than 10)."""
    finite = replicates[np.isfinite(replicates)]
    if finite.size < _MIN_FINITE:
        return None, None
    tail = expanded_tail(units, level)
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return float(low), float(high)


def row_quantiles(hists: FloatArray, quantiles: Sequence[float], first_bin: int = 0) -> FloatArray:
    """Nearest-rank quantiles (ms, bin centres) of every row of ``hists`` (rows, width), whose
    column 0 is bin ``first_bin``: (rows, len(quantiles)); NaN for an empty row.  The same
    definition as :func:`iwscope.analysis.stats.histogram_quantiles`."""
    rows = hists.shape[0]
    out = np.full((rows, len(quantiles)), np.nan)
    if rows == 0 or hists.shape[1] == 0:
        return out
    cumulative = np.cumsum(hists, axis=1)
    totals = cumulative[:, -1]
    for column, q in enumerate(quantiles):
        rank = np.maximum(1.0, np.ceil(q * totals - 1e-9))
        index = np.minimum(first_bin + (cumulative < rank[:, None]).sum(axis=1), HIST_BINS - 1)
        out[:, column] = np.where(totals > 0, HIST_CENTER_US[index] / 1000.0, np.nan)
    return out


# ---- latency ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LatencyEstimate:
    """One arm's latency statistics (ms): ``keys`` = ``avg`` and the quantiles asked for; the
    point estimates, their replicates (replicates, keys) and whether the arm is too small."""

    keys: tuple[str, ...]
    point: dict[str, float | None]
    replicates: FloatArray | None
    too_small: bool
    responses: int
    clusters: int

    def value(self, key: str) -> Value:
        if self.too_small or self.replicates is None:
            return MISSING
        low, high = interval(self.replicates[:, self.keys.index(key)], units=self.clusters)
        return Value(self.point[key], low, high)


def latency_too_small(responses: float, clusters: int) -> bool:
    return responses < MIN_RESPONSES or clusters < MIN_CLUSTERS


def latency_estimate(
    data: ClusterSums, key: int, quantile_keys: Sequence[str] = tuple(QUANTILES), replicates: int = PASSIVE_REPLICATES
) -> LatencyEstimate:
    """Mean (exact, from the sums) and percentiles (merged histogram) of an arm, with cluster
    bootstrap replicates of each; none when the arm is too small (module docstring)."""
    keys = ("avg", *quantile_keys)
    quantiles = [QUANTILES[name] for name in quantile_keys]
    responses = data.sums["responses"] if data.size else np.zeros(0)
    keep = responses > 0
    n_responses, n_clusters = float(responses.sum()), int(keep.sum())
    if n_responses <= 0:
        return LatencyEstimate(keys, dict.fromkeys(keys), None, True, 0, 0)
    total_hist = data.hist[keep].sum(axis=0, keepdims=True)
    point: dict[str, float | None] = {"avg": float(data.sums["latency_sum_us"][keep].sum()) / n_responses / 1000.0}
    for name, value in zip(quantile_keys, row_quantiles(total_hist, quantiles, data.hist_lo)[0], strict=True):
        point[name] = float(value) if np.isfinite(value) else None
    if latency_too_small(n_responses, n_clusters):
        return LatencyEstimate(keys, point, None, True, int(n_responses), n_clusters)
    weights = draw_weights(n_clusters, key, replicates)
    with np.errstate(divide="ignore", invalid="ignore"):
        means = (weights @ data.sums["latency_sum_us"][keep]) / (weights @ responses[keep]) / 1000.0
    reps = np.column_stack([means, row_quantiles(weights @ data.hist[keep], quantiles, data.hist_lo)])
    return LatencyEstimate(keys, point, reps, False, int(n_responses), n_clusters)


def improvement(baseline: LatencyEstimate, treatment: LatencyEstimate, key: str) -> tuple[Value, Value]:
    """(baseline - treatment in ms, its percent of the baseline), each with its interval from the
    two arms' independent replicates; missing when either arm is too small."""
    if baseline.too_small or treatment.too_small or baseline.replicates is None or treatment.replicates is None:
        return MISSING, MISSING
    base_point, treat_point = baseline.point[key], treatment.point[key]
    if base_point is None or treat_point is None:
        return MISSING, MISSING
    base = baseline.replicates[:, baseline.keys.index(key)]
    diff = base - treatment.replicates[:, treatment.keys.index(key)]
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = 100.0 * diff / base
    absolute = base_point - treat_point
    units = min(baseline.clusters, treatment.clusters)
    return (
        Value(absolute, *interval(diff, units=units)),
        Value(100.0 * absolute / base_point if base_point > 0 else None, *interval(pct, units=units)),
    )


# ---- rates and shares ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RateEstimate:
    """A ratio of summed counts (e.g. retransmitted / sent segments) with its replicates."""

    point: float | None
    replicates: FloatArray | None
    #: Every cluster has no event (0 %) or only events (100 %): the interval is Wilson's.
    degenerate: bool
    too_small: bool
    connections: int
    events: float = field(default=0.0)
    #: Clusters resampled (the expanded interval's k).
    clusters: int = 0

    def value(self, scale: float = 1.0) -> Value:
        if self.too_small or self.point is None:
            return MISSING
        low, high = self.bounds(0.95)
        return Value(self.point * scale, None if low is None else low * scale, None if high is None else high * scale)

    def bounds(self, level: float) -> tuple[float | None, float | None]:
        """The ``level`` interval: bootstrap percentiles, or Wilson's when degenerate."""
        if self.too_small or self.point is None:
            return None, None
        if self.degenerate or self.replicates is None:
            found = proportion_interval(self.point * self.connections, self.connections, level)
            return found if found is not None else (None, None)
        return interval(self.replicates, level, units=self.clusters)


def count_too_small(connections: float, clusters: int) -> bool:
    return connections < MIN_CONNECTIONS or clusters < MIN_CLUSTERS


def rate_estimate(
    data: ClusterSums, numerator: str, denominator: str, key: int, replicates: int = PASSIVE_REPLICATES
) -> RateEstimate:
    """``sum(numerator) / sum(denominator)`` of an arm with cluster bootstrap replicates (too
    small below :data:`MIN_CONNECTIONS` connections or :data:`MIN_CLUSTERS` clusters)."""
    connections = data.total("connections")
    top, bottom = data.total(numerator), data.total(denominator)
    point = top / bottom if bottom > 0 else None
    if point is None or count_too_small(connections, data.size):
        return RateEstimate(point, None, False, True, int(connections), top, data.size)
    num, den = data.sums[numerator], data.sums[denominator]
    degenerate = top == 0 or bool(np.all(num == den))
    if degenerate:
        return RateEstimate(point, None, True, False, int(connections), top, data.size)
    weights = draw_weights(data.size, key, replicates)
    with np.errstate(divide="ignore", invalid="ignore"):
        reps = (weights @ num) / (weights @ den)
    return RateEstimate(point, reps, False, False, int(connections), top, data.size)


def rate_difference(baseline: RateEstimate, treatment: RateEstimate, scale: float = 100.0) -> Value:
    """Treatment rate minus baseline rate (x ``scale``: percentage points), with its interval:
    the difference of independent replicates, or, when either arm is degenerate, each arm's
    97.5 % interval combined (Bonferroni, at least 95 %)."""
    if baseline.too_small or treatment.too_small or baseline.point is None or treatment.point is None:
        return MISSING
    point = (treatment.point - baseline.point) * scale
    if baseline.degenerate or treatment.degenerate or baseline.replicates is None or treatment.replicates is None:
        base_low, base_high = baseline.bounds(0.975)
        treat_low, treat_high = treatment.bounds(0.975)
        if None in (base_low, base_high, treat_low, treat_high):
            return Value(point)
        assert base_low is not None and base_high is not None and treat_low is not None and treat_high is not None
        return Value(point, (treat_low - base_high) * scale, (treat_high - base_low) * scale)
    low, high = interval((treatment.replicates - baseline.replicates) * scale, units=min(baseline.clusters, treatment.clusters))
    return Value(point, low, high)


# ---- paired levels (the share sweep) ------------------------------------------------------------


def paired_weights(levels: Sequence[ClusterSums], key: int, replicates: int = PASSIVE_REPLICATES) -> tuple[IntArray, FloatArray]:
    """The union of the levels' clusters and one weight matrix over it (replicates, clusters):
    every level is resampled with the same clusters (module docstring)."""
    union = np.unique(np.concatenate([level.clusters for level in levels])) if levels else np.zeros(0, dtype=np.int64)
    return union.astype(np.int64), draw_weights(int(union.size), key, replicates)


def aligned(level: ClusterSums, union: IntArray) -> ClusterSums:
    """``level`` with a row for every cluster of ``union`` (zeros where it has no data)."""
    rows = np.searchsorted(union, level.clusters)
    sums = {}
    for name in SUM_NAMES:
        column = np.zeros(union.size)
        column[rows] = level.sums[name]
        sums[name] = column
    hist = np.zeros((union.size, level.hist.shape[1]))
    hist[rows] = level.hist
    return ClusterSums(union, sums, hist, level.hist_lo)


def paired_latency(
    level: ClusterSums, union: IntArray, weights: FloatArray, quantile_keys: Sequence[str] = ("p50",)
) -> LatencyEstimate:
    """:func:`latency_estimate` of one level with the shared ``weights`` over ``union``."""
    keys = ("avg", *quantile_keys)
    quantiles = [QUANTILES[name] for name in quantile_keys]
    full = aligned(level, union)
    responses = full.sums["responses"]
    n_responses, n_clusters = float(responses.sum()), int(np.count_nonzero(responses))
    if n_responses <= 0:
        return LatencyEstimate(keys, dict.fromkeys(keys), None, True, 0, 0)
    point: dict[str, float | None] = {"avg": float(full.sums["latency_sum_us"].sum()) / n_responses / 1000.0}
    total = row_quantiles(full.hist.sum(axis=0, keepdims=True), quantiles, full.hist_lo)[0]
    point.update({name: float(value) if np.isfinite(value) else None for name, value in zip(quantile_keys, total, strict=True)})
    if latency_too_small(n_responses, n_clusters):
        return LatencyEstimate(keys, point, None, True, int(n_responses), n_clusters)
    with np.errstate(divide="ignore", invalid="ignore"):
        means = (weights @ full.sums["latency_sum_us"]) / (weights @ responses) / 1000.0
    reps = np.column_stack([means, row_quantiles(weights @ full.hist, quantiles, full.hist_lo)])
    return LatencyEstimate(keys, point, reps, False, int(n_responses), n_clusters)


def paired_rate(level: ClusterSums, union: IntArray, weights: FloatArray, numerator: str, denominator: str) -> RateEstimate:
    """:func:`rate_estimate` of one level with the shared ``weights`` over ``union``."""
    full = aligned(level, union)
    connections = full.total("connections")
    top, bottom = full.total(numerator), full.total(denominator)
    point = top / bottom if bottom > 0 else None
    if point is None or count_too_small(connections, level.size):
        return RateEstimate(point, None, False, True, int(connections), top, level.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        reps = (weights @ full.sums[numerator]) / (weights @ full.sums[denominator])
    degenerate = top == 0 or bool(np.all(level.sums[numerator] == level.sums[denominator]))
    return RateEstimate(point, None if degenerate else reps, degenerate, False, int(connections), top, level.size)


def paired_change(level: LatencyEstimate, reference: LatencyEstimate, key: str) -> Value:
    """``level - reference`` of ``key`` (ms) from paired replicates; missing when either is too small."""
    if level.too_small or reference.too_small or level.replicates is None or reference.replicates is None:
        return MISSING
    now, then = level.point[key], reference.point[key]
    if now is None or then is None:
        return MISSING
    diff = level.replicates[:, level.keys.index(key)] - reference.replicates[:, reference.keys.index(key)]
    return Value(now - then, *interval(diff, units=min(level.clusters, reference.clusters)))


def paired_rate_change(level: RateEstimate, reference: RateEstimate, scale: float = 100.0) -> Value:
    """``level - reference`` of a rate (x ``scale``), paired replicates (Bonferroni when degenerate)."""
    return rate_difference(reference, level, scale)


__all__ = [
    "ClusterSums",
    "HIST_RESOLUTION_PCT",
    "LATENCY_KEYS",
    "LatencyEstimate",
    "MIN_CLUSTERS",
    "MIN_CONNECTIONS",
    "MIN_RESPONSES",
    "MISSING",
    "PASSIVE_REPLICATES",
    "PASSIVE_SEED",
    "QUANTILES",
    "RateEstimate",
    "SUM_NAMES",
    "Value",
    "aligned",
    "cluster_sums",
    "count_too_small",
    "draw_weights",
    "empty_sums",
    "improvement",
    "interval",
    "latency_estimate",
    "latency_too_small",
    "paired_change",
    "paired_latency",
    "paired_rate",
    "paired_rate_change",
    "paired_weights",
    "rate_difference",
    "rate_estimate",
    "row_quantiles",
    "stable_key",
]

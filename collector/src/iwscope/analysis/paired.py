"""Paired comparison of two IW arms: trials matched on (path, round, size).

A campaign runs in rounds: within one round, on one path (probe x origin), every arm fetches
the same object sizes in random order at about the same time.  Cross traffic, route changes
and the object size therefore hit both arms of a (path, round, size) *cell* alike, and the
difference inside a cell removes them.  :func:`stats.cluster_bootstrap` (what the roll-ups
served before) compares the arms' pooled means instead; tests/analysis/test_paired.py
compares the two on the same trials.

Pairs (:func:`make_pairs`)
    A pair is one cell holding at least one baseline and one treatment trial; an arm with
    several trials in the cell contributes their mean.  Cells with only one arm are dropped,
    and so are trials whose latency is not finite (a failed fetch has no latency).

Estimate (:func:`paired_estimate`)
    ``estimate_ms`` = mean over pairs of (baseline - treatment); ``pct`` = 100 * sum(baseline
    - treatment) / sum(baseline) over the same pairs (ratio of sums, so long paths weigh by
    their milliseconds, not by a per-pair percentage).  Both are ratios of sums of the
    per-path sufficient statistics (pair count ``n``, sum of differences ``d``, sum of
    baselines ``b``), which is all the interval needs too (:func:`paired_interval`), so it
    can later run off roll-ups holding those three sums per path.

What the interval covers
    Paths are the sampled units: the interval is for the pair-weighted mean effect over the
    population of paths the probes are drawn from, ``E[d_path] / E[n_path]`` (and ``E[d] /
    E[b]`` for the percent), not just for the paths that happened to be measured.  Trials
    of one path are correlated, so paths are resampled whole (cluster bootstrap): a replicate
    is ``sum(w*d) / sum(w*n)`` with multinomial path weights ``w``.

Interval method: studentised path-cluster bootstrap with a t floor
    The per-path effect of a larger IW scales with the path's RTT (RTT x rounds saved), and
    path RTTs are right-skewed, so the sampling distribution of the mean effect in ms is
    skewed, and the percentile cluster bootstrap of :mod:`stats` undercovers.  Coverage study
    on ``tests/analysis/test_paired.py``'s generator (RTT lognormal, median 80 ms, sigma 1,
    truncated to 10 ms .. 1 s; 4-12 rounds of 6 sizes per path; heavy-tailed noise; 95 %
    nominal; 1000 replications per row, so +-0.7 points; ms / percent):

    =====  ===========  ===========  ===========  ===========================
    paths  percentile   t, G-1 df    bootstrap-t  bootstrap-t with t floor
    =====  ===========  ===========  ===========  ===========================
    5      76.5 / 81.9  86.7 / 90.1  90.0 / 90.6  91.1 / 93.7
    10     83.8 / 89.8  88.6 / 92.7  91.4 / 93.7  92.4 / 95.1
    15     84.6 / 91.1  87.4 / 93.2  91.8 / 93.3  92.9 / 94.9
    20     89.7 / 92.9  91.7 / 94.3  94.0 / 94.0  94.8 / 95.4
    25     87.8 / 91.9  89.0 / 93.4  92.4 / 93.9  93.5 / 94.9
    30     90.6 / 92.8  91.5 / 94.4  93.2 / 94.2  94.3 / 95.3
    45     90.4 / 92.8  91.5 / 93.4  92.7 / 93.8  93.9 / 94.3
    60     91.1 / 94.2  91.0 / 94.7  93.1 / 94.9  94.6 / 95.2
    =====  ===========  ===========  ===========  ===========================

    Rerun with three more seeds, the last two columns gave 91.3-92.3 and 92.1-93.2 % (ms)
    at 20 paths, 92.6-93.3 and 93.7-94.1 % at 25.

    * *bootstrap-t* (percentile-t): ``t* = (theta* - theta) / se*`` from the same path
      resamples, with ``se`` the cluster-robust (CR1, ``G/(G-1)``) delta-method standard
      error of a ratio of sums; interval ``[theta - q*(97.5) se, theta - q*(2.5) se]``.
      It corrects the skewness to second order and is the largest single gain.  But with
      only 1-3 pairs per path the path values are heavy-tailed (a 1 s RTO in one arm of one
      pair) and it fell to 89-92 % (ms) and 88-92 % (percent) at 25-30 paths, where the
      t interval held 91-95 %.
    * *t floor*: each side of the interval is at least as long as that side of the
      small-sample t interval ``theta -+ t(G-1, 0.975) se`` (the union of the two
      intervals), so it covers at least as often as either.  With 1-3 pairs per path at
      25-30 paths it held 93.8-94.9 % (ms) and 93.6-96.4 % (percent).  It costs width: at 25-60
      paths the median ms interval is ~82 ms, against ~65 ms for the (undercovering)
      percentile interval of the same pairs and ~69 ms for the unpaired estimate
      (``unpaired_estimate`` in ``tests/analysis/test_paired.py``).  The t quantile is computed
      exactly (:func:`t_quantile`; scipy is not a dependency).
    * What remains is one-sided: when the sample happens to lack long-RTT paths the truth
      lies above the interval (5-6 % of the time at 25 paths against 2.5 % nominal; below
      it under 1 %).  No interval built only from the sampled paths can see a tail they
      do not contain; more paths is the only cure.  The percent, a ratio of two
      RTT-driven sums, is far less skewed and is covered at nominal level from ~10 paths.
    * BCa, Hall's skewness-removing transformation (with normal, t and bootstrap
      quantiles) and the wild cluster bootstrap with the null imposed (Rademacher, Webb
      and Mammen weights) were also tried on the same generator; none covered better than
      the bootstrap-t with the t floor (Hall's bootstrap came closest, with wider
      intervals; BCa and the wild bootstrap were no better than the t interval).

Minimums and what an interval may claim
    ``too_small`` is set below :data:`MIN_PAIRS` = 20 pairs: no number is shown then, only
    "n too small" with the counts.  Above it the estimate and its interval are shown, with a
    ``caveat`` saying how far the interval reaches:

    * fewer than :data:`stats.MIN_CLUSTERS` (5) paths: the interval resamples pairs (raw
      trials) or the trials of each cell (roll-ups, :func:`within_path_interval`) and reflects
      within-path noise only: it is about the measured paths (a lab path, the demo's few
      paths per bucket), not about a population of paths;
    * 5 to :data:`MIN_PATHS` - 1 = 24 paths: the path-cluster interval, which the study above
      found to cover the population effect 91-95 % (ms) there, a little under nominal;
    * from 25 paths: no caveat (>= 93 % in every run of the study).

Aggregated cells (:func:`cell_path_stats`)
    The roll-ups keep, per path, arm and size octave, the count and sum of latencies but not
    the rounds.  A (path, size octave) cell holding both arms then counts as ``w = min(n_base,
    n_treat)`` pairs whose difference is the difference of the arms' cell means: the
    within-path, within-size stratified estimator, with the same per-path sums and interval.
    Time-correlated noise shared by the arms of one round is not cancelled that way (only
    raw pairs do that); path level and size mix are.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from iwscope.analysis._types import FloatArray, IntArray
from iwscope.analysis.stats import (
    BOOTSTRAP_REPLICATES,
    BOOTSTRAP_SEED,
    MIN_CLUSTERS,
    Interval,
    multinomial_weights,
    percentile_interval,
    poisson_bootstrap_means,
    sum_by,
    t_quantile,
)

BoolArray = npt.NDArray[np.bool_]

#: Fewest paths for a path-cluster interval without a caveat (study above).
MIN_PATHS = 25
#: Fewest pairs for any number at all: below it, "n too small".
MIN_PAIRS = 20
#: Two-sided confidence level of every interval.
LEVEL = 0.95
#: Largest ``replicates x units`` weight matrix built at once (bounds memory, ~16 MB).
_CHUNK_CELLS = 1 << 21


# ---- pairs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pairs:
    """One entry per pair, ordered by (path, round, size)."""

    path: IntArray
    round_: IntArray
    size: IntArray
    baseline_ms: FloatArray
    treatment_ms: FloatArray

    def __len__(self) -> int:
        return int(self.path.size)


@dataclass(frozen=True)
class PathStats:
    """Per-path sufficient statistics of the pairs: all the estimator and interval use."""

    path: IntArray
    n_pairs: FloatArray
    sum_diff_ms: FloatArray
    sum_base_ms: FloatArray


def _trial_arrays(
    path: npt.ArrayLike, round_: npt.ArrayLike, size: npt.ArrayLike, arm_is_treatment: npt.ArrayLike, latency_ms: npt.ArrayLike
) -> tuple[IntArray, IntArray, IntArray, BoolArray, FloatArray]:
    """The five trial columns as 1-D arrays of one length, trials without a finite latency dropped."""
    p = np.asarray(path, dtype=np.int64).ravel()
    r = np.asarray(round_, dtype=np.int64).ravel()
    s = np.asarray(size, dtype=np.int64).ravel()
    a = np.asarray(arm_is_treatment, dtype=np.bool_).ravel()
    lat = np.asarray(latency_ms, dtype=np.float64).ravel()
    if not p.size == r.size == s.size == a.size == lat.size:
        raise ValueError(f"trial arrays differ in length: {p.size}, {r.size}, {s.size}, {a.size}, {lat.size}")
    keep = np.isfinite(lat)
    if not keep.all():
        p, r, s, a, lat = p[keep], r[keep], s[keep], a[keep], lat[keep]
    return p, r, s, a, lat


def _cell_order(p: IntArray, r: IntArray, s: IntArray) -> tuple[IntArray, IntArray]:
    """Order of the trials by (path, round, size) and a cell key that is equal within a cell.

    One int64 key and one argsort when the three value ranges fit in 62 bits (always, for
    real ids and sizes), else a lexsort.
    """
    spans = [int(column.max()) - int(column.min()) + 1 for column in (p, r, s)]
    if spans[0] * spans[1] * spans[2] < (1 << 62):
        key = ((p - p.min()) * spans[1] + (r - r.min())) * spans[2] + (s - s.min())
        order = np.argsort(key, kind="stable")
        return order, key[order]
    order = np.lexsort((s, r, p))
    ps, rs, ss = p[order], r[order], s[order]
    new = np.ones(order.size, dtype=np.bool_)
    new[1:] = (ps[1:] != ps[:-1]) | (rs[1:] != rs[:-1]) | (ss[1:] != ss[:-1])
    return order, np.cumsum(new)


def make_pairs(
    path: npt.ArrayLike, round_: npt.ArrayLike, size: npt.ArrayLike, arm_is_treatment: npt.ArrayLike, latency_ms: npt.ArrayLike
) -> Pairs:
    """Pairs of a trial table (one entry per trial in each array; vectorised, ~0.2 s per 10^6 trials).

    ``path`` are path ids (probe x origin), ``round_`` round numbers, ``size`` object sizes in
    bytes, ``arm_is_treatment`` True for the treatment arm, ``latency_ms`` the latencies.
    """
    p, r, s, a, lat = _trial_arrays(path, round_, size, arm_is_treatment, latency_ms)
    if p.size == 0:
        empty_i, empty_f = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        return Pairs(empty_i, empty_i.copy(), empty_i.copy(), empty_f, empty_f.copy())
    order, sorted_key = _cell_order(p, r, s)
    first = np.empty(order.size, dtype=np.bool_)
    first[0] = True
    np.not_equal(sorted_key[1:], sorted_key[:-1], out=first[1:])
    cell = np.cumsum(first) - 1
    cells = int(cell[-1]) + 1
    slot = cell * 2 + a[order]
    counts = np.bincount(slot, minlength=2 * cells).reshape(cells, 2)
    sums = sum_by(slot, lat[order], 2 * cells).reshape(cells, 2)
    paired = (counts > 0).all(axis=1)
    head = order[first][paired]  # one trial of every paired cell, in (path, round, size) order
    means = sums[paired] / counts[paired]
    return Pairs(path=p[head], round_=r[head], size=s[head], baseline_ms=means[:, 0], treatment_ms=means[:, 1])


def path_stats(pairs: Pairs) -> PathStats:
    """Pair count, sum of (baseline - treatment) and sum of baselines of every path."""
    ids, index = np.unique(pairs.path, return_inverse=True)
    k = ids.size
    diff = pairs.baseline_ms - pairs.treatment_ms
    return PathStats(
        path=ids,
        n_pairs=np.bincount(index, minlength=k).astype(np.float64),
        sum_diff_ms=sum_by(index, diff, k),
        sum_base_ms=sum_by(index, pairs.baseline_ms, k),
    )


# ---- interval ----------------------------------------------------------------------------------


def _ratio_bounds(numer: FloatArray, denom: FloatArray, t_star: FloatArray) -> tuple[float, float] | None:
    """Bootstrap-t-with-t-floor bounds of ``sum(numer) / sum(denom)`` from the replicates' t*."""
    units = numer.size
    theta = float(numer.sum() / denom.sum())
    resid = numer - theta * denom
    se = math.sqrt(units / (units - 1) * float(resid @ resid)) / float(denom.sum())
    if se <= 1e-12 * (abs(theta) + 1e-300) or not math.isfinite(se):
        return theta, theta  # every unit has the same ratio: no sampling variation to show
    t_star = t_star[np.isfinite(t_star)]
    if t_star.size < 10:
        return None
    q_low, q_high = np.percentile(t_star, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
    q_t = t_quantile((1 + LEVEL) / 2, units - 1)
    return theta - max(float(q_high), q_t) * se, theta - min(float(q_low), -q_t) * se


def _replicate_t(weights: FloatArray, numer: FloatArray, denom: FloatArray) -> FloatArray:
    """t* = (theta* - theta) / se* of the ratio of sums for every row of ``weights``.

    With ``e = numer - theta * denom`` and ``delta = theta* - theta = (w @ e) / (w @ denom)``,
    the replicate's residual sum of squares is ``sum(w * (e - delta * denom)^2)`` = ``w@e^2 -
    2 delta w@(e denom) + delta^2 w@denom^2``: three matrix-vector products, per-unit sums only.
    """
    units = numer.size
    theta = numer.sum() / denom.sum()
    resid = numer - theta * denom
    w_denom = weights @ denom
    with np.errstate(divide="ignore", invalid="ignore"):
        delta = (weights @ resid) / w_denom
        ss = weights @ (resid * resid) - 2.0 * delta * (weights @ (resid * denom)) + delta * delta * (weights @ (denom * denom))
        se = np.sqrt(units / (units - 1) * np.maximum(ss, 0.0)) / w_denom
        t_star = delta / se
    # a replicate drawing copies of one unit only has se* = 0: t* = 0 if delta = 0, else +-inf
    return np.where(np.isnan(t_star) & (delta == 0), 0.0, t_star)


def _edgeworth_bounds(numer: FloatArray, denom: FloatArray) -> tuple[float, float]:
    """Bounds of ``sum(numer) / sum(denom)`` from the Edgeworth expansion of the studentised ratio,
    with the t floor: the analytic counterpart of :func:`_ratio_bounds` for many units.

    For a studentised mean of units with skewness ``g`` (here: of the linearised residuals
    ``e = numer - theta denom``), ``P(T <= x) = Phi(x) + g (2x^2 + 1) phi(x) / (6 sqrt(G)) +
    O(1/G)`` (Hall 1992, ch. 2), so the quantiles of T are ``z_p - g (2 z_p^2 + 1) / (6 sqrt(G))``:
    the second-order correction the bootstrap-t makes, computed in O(G) instead of O(B G).
    """
    units = numer.size
    theta = float(numer.sum() / denom.sum())
    resid = numer - theta * denom
    m2 = float(resid @ resid) / units
    se = math.sqrt(units / (units - 1) * float(resid @ resid)) / float(denom.sum())
    if se <= 1e-12 * (abs(theta) + 1e-300) or not math.isfinite(se):
        return theta, theta
    skew = float(np.mean(resid**3)) / m2**1.5
    z = _Z_975
    shift = skew * (2.0 * z * z + 1.0) / (6.0 * math.sqrt(units))
    q_high, q_low = z - shift, -z - shift
    q_t = t_quantile((1 + LEVEL) / 2, units - 1)
    return theta - max(q_high, q_t) * se, theta - min(q_low, -q_t) * se


#: Standard normal 97.5 % quantile.
_Z_975 = 1.959963984540054
#: From this many units (paths) on, :func:`paired_interval` uses the Edgeworth-corrected t
#: interval instead of the bootstrap-t: same second-order correction, O(G) instead of
#: O(replicates x G) (2.1 s at 20,000 paths).  Coverage study: ``bench/coverage_paired.py``,
#: results in the analysis README (200 paths: 96.0 / 94.6 % against the bootstrap-t's
#: 96.3 / 94.8 %; 60 paths: 94.1 / 95.0 against 94.9 / 95.4, hence the threshold).
ANALYTIC_MIN_UNITS = 200


def paired_interval(
    n_pairs: npt.ArrayLike,
    sum_diff_ms: npt.ArrayLike,
    sum_base_ms: npt.ArrayLike,
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
    analytic_min_units: int = ANALYTIC_MIN_UNITS,
) -> Interval | None:
    """95 % interval of ``sum(d)/sum(n)`` (ms) and ``100 sum(d)/sum(b)`` (%), resampling units whole.

    Each argument has one entry per unit (a path, or a single pair for the pair bootstrap).
    Studentised bootstrap with a t floor (module docstring); from ``analytic_min_units`` units on,
    its analytic equivalent (:func:`_edgeworth_bounds`).  ``None`` with fewer than two units, or
    when the baseline sum is not positive.
    """
    n = np.asarray(n_pairs, dtype=np.float64)
    d = np.asarray(sum_diff_ms, dtype=np.float64)
    b = np.asarray(sum_base_ms, dtype=np.float64)
    units = n.size
    if units < 2 or n.sum() <= 0 or b.sum() <= 0:
        return None
    if units >= analytic_min_units:
        abs_low, abs_high = _edgeworth_bounds(d, n)
        pct_low, pct_high = _edgeworth_bounds(d, b)
        return Interval(abs_low, abs_high, 100.0 * pct_low, 100.0 * pct_high)
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_CELLS // units)
    t_abs, t_pct = [], []
    for start in range(0, replicates, chunk):
        weights = multinomial_weights(rng, min(chunk, replicates - start), units)
        t_abs.append(_replicate_t(weights, d, n))
        t_pct.append(_replicate_t(weights, d, b))
    abs_bounds = _ratio_bounds(d, n, np.concatenate(t_abs))
    pct_bounds = _ratio_bounds(d, b, np.concatenate(t_pct))
    if abs_bounds is None or pct_bounds is None:
        return None
    return Interval(abs_bounds[0], abs_bounds[1], 100.0 * pct_bounds[0], 100.0 * pct_bounds[1])


# ---- estimators ------------------------------------------------------------------------------

Method = Literal["cluster", "pairs", "within-path"]


@dataclass(frozen=True)
class PairedEstimate:
    """Improvement (baseline - treatment; positive = treatment faster) over pairs.

    ``interval`` is ``None`` when it cannot be computed.  ``too_small``: fewer than
    :data:`MIN_PAIRS` pairs, show "n too small" and the counts, not the numbers.  ``caveat``
    says what the interval does not cover (module docstring), ``None`` when nothing.
    """

    n_pairs: int
    n_paths: int
    estimate_ms: float | None
    pct: float | None
    interval: Interval | None
    method: Method
    too_small: bool
    caveat: str | None

    @property
    def reason(self) -> str | None:
        """Why the result is too small or limited (``None`` when neither)."""
        if self.n_pairs == 0:
            return "no pairs (no cell holds both arms)"
        if self.too_small:
            return f"{self.n_pairs} pairs < MIN_PAIRS = {MIN_PAIRS}" + (f"; {self.caveat}" if self.caveat else "")
        return self.caveat


def _caveat(n_paths: int, method: Method) -> str | None:
    if method != "cluster":
        return (
            f"{n_paths} path{'s' if n_paths != 1 else ''} (< {MIN_CLUSTERS}): the interval reflects "
            "within-path noise only, about the measured paths, not a population of paths"
        )
    if n_paths < MIN_PATHS:
        return f"{n_paths} paths < MIN_PATHS = {MIN_PATHS}: the path-cluster interval may cover a little under 95 %"
    return None


def _estimate(
    stats: PathStats, method: Method, fallback: Callable[[], Interval | None], replicates: int, seed: int
) -> PairedEstimate:
    n_paths, n_pairs = int(stats.path.size), int(round(float(stats.n_pairs.sum())))
    caveat = _caveat(n_paths, method) if n_pairs else None
    if n_pairs == 0:
        return PairedEstimate(0, n_paths, None, None, None, method, True, caveat)
    total_diff, total_base = float(stats.sum_diff_ms.sum()), float(stats.sum_base_ms.sum())
    estimate = total_diff / float(stats.n_pairs.sum())
    pct = 100.0 * total_diff / total_base if total_base > 0 else None
    if method == "cluster":
        interval = paired_interval(stats.n_pairs, stats.sum_diff_ms, stats.sum_base_ms, replicates, seed)
    else:
        interval = fallback()
    return PairedEstimate(n_pairs, n_paths, estimate, pct, interval, method, n_pairs < MIN_PAIRS, caveat)


def paired_estimate(pairs: Pairs, replicates: int = BOOTSTRAP_REPLICATES, seed: int = BOOTSTRAP_SEED) -> PairedEstimate:
    """Paired improvement of raw pairs with its 95 % interval (module docstring)."""
    stats = path_stats(pairs)
    method: Method = "cluster" if stats.path.size >= MIN_CLUSTERS else "pairs"
    return _estimate(
        stats,
        method,
        lambda: paired_interval(np.ones(len(pairs)), pairs.baseline_ms - pairs.treatment_ms, pairs.baseline_ms, replicates, seed),
        replicates,
        seed,
    )


# ---- aggregated cells (roll-ups) -------------------------------------------------------------


@dataclass(frozen=True)
class Cells:
    """One entry per (path, size stratum) cell: counts and latency sums (ms) of both arms, and
    optionally each arm's latency histogram (``(cells, HIST_BINS)``) for the within-path interval."""

    path: IntArray
    n_base: FloatArray
    sum_base_ms: FloatArray
    n_treat: FloatArray
    sum_treat_ms: FloatArray
    hist_base: IntArray | None = None
    hist_treat: IntArray | None = None


def cell_path_stats(cells: Cells) -> PathStats:
    """Per-path sums of the stratified pairs of ``cells`` (module docstring, "Aggregated cells")."""
    both = (cells.n_base > 0) & (cells.n_treat > 0)
    weight = np.where(both, np.minimum(cells.n_base, cells.n_treat), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_base = np.where(both, cells.sum_base_ms / cells.n_base, 0.0)
        mean_treat = np.where(both, cells.sum_treat_ms / cells.n_treat, 0.0)
    keep = weight > 0
    ids, index = np.unique(cells.path[keep], return_inverse=True)
    k = ids.size
    w = weight[keep]
    return PathStats(
        path=ids,
        n_pairs=sum_by(index, w, k),
        sum_diff_ms=sum_by(index, w * (mean_base - mean_treat)[keep], k),
        sum_base_ms=sum_by(index, w * mean_base[keep], k),
    )


def within_path_interval(cells: Cells, replicates: int = BOOTSTRAP_REPLICATES, seed: int = BOOTSTRAP_SEED) -> Interval | None:
    """Percentile interval from resampling each cell's trials (Poisson bootstrap of its histograms).

    Replicate cell means use bin centres and are shifted by (exact - binned) cell mean, as
    :func:`stats.histogram_bootstrap` does; the replicate estimate is the stratified one of
    :func:`cell_path_stats`.  Within-path noise only (module docstring).
    """
    if cells.hist_base is None or cells.hist_treat is None:
        return None
    both = (cells.n_base >= 2) & (cells.n_treat >= 2)
    if not both.any():
        return None
    weight = np.minimum(cells.n_base, cells.n_treat)[both]
    rng = np.random.default_rng(seed)

    def replicate_means(hists: IntArray, n: FloatArray, sums_ms: FloatArray) -> FloatArray:
        out = np.empty((replicates, hists.shape[0]))
        for column, (hist, exact) in enumerate(zip(hists, sums_ms / n, strict=True)):
            means, binned = poisson_bootstrap_means(rng, hist, replicates)
            out[:, column] = means + (exact - binned)
        return out

    base = replicate_means(cells.hist_base[both], cells.n_base[both], cells.sum_base_ms[both])
    treat = replicate_means(cells.hist_treat[both], cells.n_treat[both], cells.sum_treat_ms[both])
    diff = (base - treat) @ weight
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = 100.0 * diff / (base @ weight)
    diff = diff / weight.sum()
    return percentile_interval(diff, pct)


def path_estimate(
    stats: PathStats,
    within_path: Callable[[], Interval | None],
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
) -> PairedEstimate:
    """:func:`cell_estimate` from per-path sums already reduced (e.g. in SQL) with
    :func:`cell_path_stats`' arithmetic; ``within_path`` gives the interval when there are
    fewer than ``MIN_CLUSTERS`` paths (it needs the cells' histograms)."""
    method: Method = "cluster" if stats.path.size >= MIN_CLUSTERS else "within-path"
    return _estimate(stats, method, within_path, replicates, seed)


def cell_estimate(cells: Cells, replicates: int = BOOTSTRAP_REPLICATES, seed: int = BOOTSTRAP_SEED) -> PairedEstimate:
    """Paired (within-path, within-size) improvement of aggregated cells with its 95 % interval."""
    stats = cell_path_stats(cells)
    method: Method = "cluster" if stats.path.size >= MIN_CLUSTERS else "within-path"
    return _estimate(stats, method, lambda: within_path_interval(cells, replicates, seed), replicates, seed)

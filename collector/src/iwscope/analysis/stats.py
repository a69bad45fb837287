"""Statistics on roll-ups: histogram packing, percentiles from histograms, bootstrap CIs.

Histograms are stored compactly: ``hist_lo`` (first occupied bin) plus a ``bytea`` of
little-endian int32 counts for bins ``hist_lo .. hist_lo + len - 1`` (only the occupied span,
typically a few dozen bins per roll-up row, not the full 1000).

Bootstrap confidence intervals (95 %, percentile method, fixed seed so results are
reproducible):

* **Paired cluster bootstrap over paths** (:func:`cluster_bootstrap`) when a bucket holds at
  least :data:`MIN_CLUSTERS` paths (probe x origin).  Trials of one path are correlated
  (same route, same queue), so resampling single trials would pretend to far more
  independent information than there is.  Both arms are measured on the same paths, so a
  resampled path brings its baseline *and* treatment trials: replicate means are
  ``sum(w_c * sum_c) / sum(w_c * n_c)`` with multinomial path weights ``w``.  Only per-path
  counts and sums are needed, which the roll-ups hold exactly.
* **Trial bootstrap from the histograms** (:func:`histogram_bootstrap`) when there are
  fewer paths (e.g. one lab path): each arm's trials are resampled independently from its
  histogram (values at bin centres, +-1 %) with the Poisson bootstrap (each trial weighted
  Poisson(1), the standard large-sample equivalent of multinomial resampling), and the replicate
  differences are shifted by the difference between the exact and the binned point
  estimate so the interval is centred on the exact estimate.  This only captures
  within-path noise, which is all the data can tell about a single path.
* No interval (``None``) when either arm has fewer than two trials.

For raw per-flow data (the cost analysis): a t interval of a mean (:func:`mean_interval`), the
order-statistic interval of a median (:func:`median_interval`), Wilson intervals of shares
(:func:`proportion_interval`) and a moving-block bootstrap for dependent series such as the
packets of one interactive flow (:func:`block_bootstrap`).
"""

from __future__ import annotations

import array
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from iwscope.analysis._types import FloatArray, IntArray
from iwscope.analysis.buckets import HIST_BINS, HIST_CENTER_US, HIST_UPPER_US

BOOTSTRAP_REPLICATES = 2000
BOOTSTRAP_SEED = 20100730  # the IETF 78 slides' date; any fixed seed
MIN_CLUSTERS = 5


# ---- histogram packing -----------------------------------------------------------------------


def share(numerator: float, denominator: float) -> float | None:
    """``numerator / denominator``, or ``None`` when the denominator is not positive."""
    return numerator / denominator if denominator > 0 else None


def sum_by(groups: npt.ArrayLike, weights: npt.ArrayLike, n_groups: int) -> FloatArray:
    """Sum of ``weights`` per group code in ``[0, n_groups)`` (``np.bincount`` with weights,
    typed as the float64 array it returns: numpy's stubs declare an integer array)."""
    return np.asarray(np.bincount(groups, weights=weights, minlength=n_groups), dtype=np.float64)


def pack_histogram(counts: npt.ArrayLike) -> tuple[int, bytes]:
    """``(lo, bytes)`` of a full-length histogram: the occupied span as little-endian int32."""
    full = np.asarray(counts, dtype=np.int64)
    occupied = np.flatnonzero(full)
    if occupied.size == 0:
        return 0, b""
    lo, hi = int(occupied[0]), int(occupied[-1])
    if full[lo : hi + 1].max() > np.iinfo(np.int32).max:
        raise OverflowError("histogram bin count exceeds int32")
    return lo, full[lo : hi + 1].astype("<i4").tobytes()


def add_to_packed(lo: int | None, packed: bytes | memoryview | None, bins: dict[int, int]) -> tuple[int, bytes]:
    """``pack_histogram(unpack_histogram(lo, packed) + bins)`` without full-length arrays: only
    the span the two occupy, in plain Python (a refresh merges one small delta into each of
    thousands of rows, where numpy's per-call overhead dominates).  ``bins`` maps bin -> count
    to add (negative counts take away)."""
    span = array.array("i")
    if packed:
        span.frombytes(bytes(packed))
        if sys.byteorder != "little":
            span.byteswap()
    if not bins:
        return (int(lo or 0), bytes(packed or b"")) if span else (0, b"")
    start = int(lo or 0)
    low, high = min(bins), max(bins)
    if span:
        low, high = min(low, start), max(high, start + len(span) - 1)
    merged = [0] * (high - low + 1)
    merged[start - low : start - low + len(span)] = span.tolist()
    for index, count in bins.items():
        merged[index - low] += count
    occupied = [i for i, value in enumerate(merged) if value]
    if not occupied:
        return 0, b""
    first, last = occupied[0], occupied[-1]
    if max(merged[first : last + 1]) > 2**31 - 1:
        raise OverflowError("histogram bin count exceeds int32")
    out = array.array("i", merged[first : last + 1])
    if sys.byteorder != "little":
        out.byteswap()
    return low + first, out.tobytes()


def unpack_histogram(lo: int | None, packed: bytes | memoryview | None) -> IntArray:
    """Full-length (``HIST_BINS``) histogram of a packed one."""
    full = np.zeros(HIST_BINS, dtype=np.int64)
    if packed:
        span = np.frombuffer(bytes(packed), dtype="<i4")
        start = int(lo or 0)
        full[start : start + span.size] += span
    return full


def merge_packed(
    groups: IntArray, los: Sequence[int | None], packed: Sequence[bytes | memoryview | None], n_groups: int
) -> IntArray:
    """Sum many packed histograms into ``n_groups`` full histograms (vectorised).

    ``groups[i]`` is the output row of ``packed[i]``.  Returns an ``(n_groups, HIST_BINS)``
    array of counts.
    """
    if n_groups == 0:
        return np.zeros((0, HIST_BINS), dtype=np.int64)
    blobs = [bytes(blob) if blob else b"" for blob in packed]
    lengths = np.fromiter((len(blob) // 4 for blob in blobs), dtype=np.int64, count=len(blobs))
    total = int(lengths.sum())
    out = np.zeros(n_groups * HIST_BINS, dtype=np.int64)
    if total == 0:
        return out.reshape(n_groups, HIST_BINS)
    counts = np.frombuffer(b"".join(blobs), dtype="<i4").astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    lo_array = np.fromiter((int(lo or 0) for lo in los), dtype=np.int64, count=len(blobs))
    # bin of element j of row i = lo_i + (j - start_i)
    position = np.arange(total, dtype=np.int64)
    bins = position - np.repeat(starts, lengths) + np.repeat(lo_array, lengths)
    flat_index = np.repeat(np.asarray(groups, dtype=np.int64), lengths) * HIST_BINS + bins
    out += np.bincount(flat_index, weights=counts, minlength=n_groups * HIST_BINS).astype(np.int64)
    return out.reshape(n_groups, HIST_BINS)


def merge_pieces(piece_groups: IntArray, piece_lo: IntArray, piece_len: IntArray, blob: bytes, n_groups: int) -> IntArray:
    """Sum packed histogram pieces stored back to back in ``blob`` into ``n_groups`` histograms.

    Piece ``j`` holds ``piece_len[j]`` int32 counts for bins ``piece_lo[j]...``; it is added to
    output row ``piece_groups[j]``, or ignored when that is negative.
    """
    out = np.zeros(max(n_groups, 0) * HIST_BINS, dtype=np.int64)
    total = int(piece_len.sum()) if piece_len.size else 0
    if n_groups <= 0 or total == 0:
        return out.reshape(max(n_groups, 0), HIST_BINS)
    counts = np.frombuffer(blob, dtype="<i4", count=total)
    starts = np.cumsum(piece_len) - piece_len
    kept = np.flatnonzero(piece_groups >= 0)
    if kept.size < piece_len.size:  # expand only the pieces wanted (a group of a few paths of many)
        piece_groups, piece_lo, piece_len, starts = piece_groups[kept], piece_lo[kept], piece_len[kept], starts[kept]
    kept_total = int(piece_len.sum()) if piece_len.size else 0
    if kept_total == 0:
        return out.reshape(n_groups, HIST_BINS)
    element_piece = np.repeat(np.arange(piece_len.size), piece_len)
    # each element's offset within its piece, then its place in the blob and its bin
    within = np.arange(kept_total, dtype=np.int64) - (np.cumsum(piece_len) - piece_len)[element_piece]
    values = counts[starts[element_piece] + within]
    bins = within + piece_lo[element_piece]
    out += np.bincount(piece_groups[element_piece] * HIST_BINS + bins, weights=values, minlength=n_groups * HIST_BINS).astype(
        np.int64
    )
    return out.reshape(n_groups, HIST_BINS)


# ---- percentiles and moments -----------------------------------------------------------------


def histogram_quantiles(counts: npt.ArrayLike, quantiles: Sequence[float]) -> list[float | None]:
    """Quantiles (in ms) of a histogram: the centre of the bin holding the ``ceil(q*n)``-th value.

    This is the nearest-rank definition (the smallest value with at least ``q*n`` values at or
    below it), read at bin resolution (+-1 %).  ``None`` for an empty histogram.
    """
    full = np.asarray(counts, dtype=np.int64)
    total = int(full.sum())
    if total == 0:
        return [None for _ in quantiles]
    cumulative = np.cumsum(full)
    result: list[float | None] = []
    for q in quantiles:
        rank = max(1, int(np.ceil(q * total - 1e-9)))
        index = int(np.searchsorted(cumulative, rank, side="left"))
        result.append(float(HIST_CENTER_US[index]) / 1000.0)
    return result


def histogram_cdf(counts: npt.ArrayLike) -> list[tuple[float, float]]:
    """``(latency_ms, cumulative fraction)`` at the upper edge of every occupied bin."""
    full = np.asarray(counts, dtype=np.int64)
    total = int(full.sum())
    if total == 0:
        return []
    occupied = np.flatnonzero(full)
    cumulative = np.cumsum(full)[occupied] / total
    return [(float(HIST_UPPER_US[i]) / 1000.0, float(c)) for i, c in zip(occupied, cumulative, strict=True)]


def mean_std_ms(n: int, sum_us: float, sumsq_us2: float) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ms) from count, sum and sum of squares (us)."""
    if n <= 0:
        return None, None
    mean_us = sum_us / n
    if n < 2:
        return mean_us / 1000.0, None
    variance = max(0.0, (sumsq_us2 - sum_us * sum_us / n) / (n - 1))
    return mean_us / 1000.0, float(np.sqrt(variance)) / 1000.0


# ---- bootstrap -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    abs_low: float
    abs_high: float
    pct_low: float
    pct_high: float


def percentile_interval(diff: FloatArray, pct: FloatArray) -> Interval | None:
    """Percentile 95 % interval of bootstrap replicates of an improvement (ms) and its percent;
    non-finite replicates dropped, ``None`` with fewer than 10 left."""
    keep = np.isfinite(diff) & np.isfinite(pct)
    if keep.sum() < 10:
        return None
    abs_low, abs_high = np.percentile(diff[keep], [2.5, 97.5])
    pct_low, pct_high = np.percentile(pct[keep], [2.5, 97.5])
    return Interval(float(abs_low), float(abs_high), float(pct_low), float(pct_high))


def multinomial_weights(rng: np.random.Generator, replicates: int, units: int) -> FloatArray:
    """Multinomial(units, uniform) weights per replicate: ``(replicates, units)``, each row the
    number of times a resample drew each unit (path).  Drawn as indices and counted in one
    vectorised bincount (``rng.multinomial`` loops per replicate)."""
    drawn = rng.integers(0, units, size=(replicates, units))
    flat = (np.arange(replicates, dtype=np.int64)[:, None] * units + drawn).ravel()
    return np.bincount(flat, minlength=replicates * units).reshape(replicates, units).astype(np.float64)


def cluster_bootstrap(
    n_base: npt.ArrayLike,
    sum_base_ms: npt.ArrayLike,
    n_treat: npt.ArrayLike,
    sum_treat_ms: npt.ArrayLike,
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
) -> Interval | None:
    """Paired cluster bootstrap of (baseline mean - treatment mean) and its percent of baseline.

    Each argument has one entry per cluster (path).  Replicates in which an arm ends up with
    no trials are dropped.
    """
    nb = np.asarray(n_base, dtype=np.float64)
    sb = np.asarray(sum_base_ms, dtype=np.float64)
    nt = np.asarray(n_treat, dtype=np.float64)
    st = np.asarray(sum_treat_ms, dtype=np.float64)
    clusters = nb.size
    if clusters == 0:
        return None
    weights = multinomial_weights(np.random.default_rng(seed), replicates, clusters)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_base = (weights @ sb) / (weights @ nb)
        mean_treat = (weights @ st) / (weights @ nt)
        diff = mean_base - mean_treat
        pct = 100.0 * diff / mean_base
    return percentile_interval(diff, pct)


#: A cell's replicate means are drawn as a normal (``poisson_bootstrap_means``) when it holds
#: at least this many trials ...
POISSON_NORMAL_MIN_TRIALS = 1000
#: ... and the replicate mean's own skewness is at most this: the percentile endpoints then
#: move by <= 0.12 x this of the interval's width (Cornish-Fisher, z = 1.96), under half the
#: replicate noise of 2,000 replicates (~1.5 % of the width).
POISSON_NORMAL_MAX_SKEW = 0.05


def _normal_spread(lam: FloatArray, centred: FloatArray) -> float | None:
    """sqrt(k2) of a cell's counts ``lam`` at centred values when its replicate means may be
    drawn as a normal (``poisson_bootstrap_means``), else ``None``."""
    if float(lam.sum()) < POISSON_NORMAL_MIN_TRIALS:
        return None
    k2, k3 = float(lam @ centred**2), float(lam @ centred**3)
    return math.sqrt(k2) if k2 == 0.0 or abs(k3) <= POISSON_NORMAL_MAX_SKEW * k2**1.5 else None


def draws_as_normal(hist: npt.ArrayLike) -> bool:
    """Whether ``poisson_bootstrap_means`` draws this histogram's replicate means as a normal."""
    counts = np.asarray(hist, dtype=np.float64)
    occupied = counts > 0
    values = HIST_CENTER_US[occupied] / 1000.0
    lam = counts[occupied]
    return lam.size > 0 and _normal_spread(lam, values - float(lam @ values) / float(lam.sum())) is not None


def poisson_bootstrap_means(
    rng: np.random.Generator, hist: npt.ArrayLike, replicates: int, normal: bool = True
) -> tuple[FloatArray, float]:
    """Replicate means (ms, bin centres) of a histogram's trials and the binned mean itself.

    Poisson bootstrap: every trial gets a Poisson(1) weight, so a bin holding c trials gets a
    Poisson(c) count -- one vectorised draw instead of a multinomial per replicate.

    The replicate mean is, to first order, the binned mean plus sum(d_i (v_i - mean)) / n, a
    sum of independent Poisson counts whose cumulants are known: k_j = sum(c_i (v_i - mean)^j).
    When the cell is large and that sum's skewness k3 / k2^1.5 small (the constants above),
    the replicates are drawn from the normal it tends to (one draw per replicate instead of one
    per occupied bin: on the 96-path benchmark, cells of ~4,300 trials over ~24 bins, skewness
    0.009 at the median, 0.05 at the 95th percentile); otherwise, or with ``normal=False``, bin
    by bin.  ``tests/analysis/test_stats.py`` compares the two."""
    counts = np.asarray(hist, dtype=np.int64)
    occupied = np.flatnonzero(counts)
    values = HIST_CENTER_US[occupied] / 1000.0
    lam = counts[occupied].astype(np.float64)
    n = float(lam.sum())
    binned = float(lam @ values) / n
    spread = _normal_spread(lam, values - binned) if normal else None
    if spread is not None:
        return binned + spread / n * rng.standard_normal(replicates), binned
    draws = rng.poisson(lam, size=(replicates, occupied.size))
    totals = draws.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        means = np.where(totals > 0, (draws @ values) / totals, np.nan)
    return means, binned


def histogram_bootstrap(
    hist_base: npt.ArrayLike,
    hist_treat: npt.ArrayLike,
    exact_base_ms: float,
    exact_treat_ms: float,
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
) -> Interval | None:
    """Independent trial bootstrap of each arm from its histogram (Poisson bootstrap).

    Replicate means use bin centres; the replicate distribution is shifted by (exact -
    binned) point estimate so it is centred on the exact means from the sums.
    """
    base = np.asarray(hist_base, dtype=np.int64)
    treat = np.asarray(hist_treat, dtype=np.int64)
    n_base, n_treat = int(base.sum()), int(treat.sum())
    if n_base < 2 or n_treat < 2:
        return None
    rng = np.random.default_rng(seed)
    base_means, base_binned = poisson_bootstrap_means(rng, base, replicates)
    treat_means, treat_binned = poisson_bootstrap_means(rng, treat, replicates)
    base_means = base_means + (exact_base_ms - base_binned)
    treat_means = treat_means + (exact_treat_ms - treat_binned)
    diff = base_means - treat_means
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = 100.0 * diff / base_means
    return percentile_interval(diff, pct)


# ---- Student t quantile (no scipy) -----------------------------------------------------------


def _t_abs_cdf(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3-4, exact)."""
    theta = math.atan(t / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:
        if df == 1:
            return 2.0 * theta / math.pi
        term = total = math.cos(theta)
        for k in range(1, (df - 1) // 2):
            term *= cos2 * (2 * k) / (2 * k + 1)
            total += term
        return 2.0 / math.pi * (theta + sin * total)
    term = total = 1.0
    for k in range(1, df // 2):
        term *= cos2 * (2 * k - 1) / (2 * k)
        total += term
    return sin * total


@lru_cache(maxsize=512)
def t_quantile(p: float, df: int) -> float:
    """``p``-quantile of Student's t with ``df`` (integer >= 1) degrees of freedom.

    Exact (closed-form CDF for integer df, inverted by bisection to ~1e-12) up to 2000 df;
    above, the Cornish-Fisher expansion to 1/df^4 (Abramowitz & Stegun 26.7.5), whose error
    there is below 1e-12.
    """
    if df < 1:
        raise ValueError("df must be >= 1")
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if df > 2000:
        z = NormalDist().inv_cdf(p)
        g1 = (z**3 + z) / 4
        g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
        g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
        g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
        return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4
    target = 2.0 * p - 1.0  # P(|T| <= t)
    low, high = 0.0, 1.0
    while _t_abs_cdf(high, df) < target:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if _t_abs_cdf(middle, df) < target:
            low = middle
        else:
            high = middle
        if high - low <= 1e-13 * high:
            break
    return 0.5 * (low + high)


# ---- intervals of percentile differences -------------------------------------------------------


def _row_quantiles(hists: FloatArray, quantiles: Sequence[float], first_bin: int = 0) -> FloatArray:
    """Nearest-rank quantiles (ms, bin centres) of every row of ``hists``, whose column 0 is bin
    ``first_bin`` (a window of the histograms holding all their counts): ``(rows, len(quantiles))``."""
    cumulative = np.cumsum(hists, axis=1)
    totals = cumulative[:, -1]
    out = np.full((hists.shape[0], len(quantiles)), np.nan)
    for column, q in enumerate(quantiles):
        rank = np.maximum(1.0, np.ceil(q * totals - 1e-9))
        index = np.minimum(first_bin + (cumulative < rank[:, None]).sum(axis=1), HIST_BINS - 1)
        out[:, column] = np.where(totals > 0, HIST_CENTER_US[index] / 1000.0, np.nan)
    return out


def quantile_difference_intervals(
    path_hist_base: npt.ArrayLike,
    path_hist_treat: npt.ArrayLike,
    quantiles: Sequence[float],
    replicates: int = 1000,
    seed: int = BOOTSTRAP_SEED,
) -> list[Interval | None]:
    """95 % intervals of (baseline - treatment) quantile and its percent of the baseline's.

    ``path_hist_*`` hold one full histogram per path (rows aligned).  With at least
    :data:`MIN_CLUSTERS` paths, paths are resampled whole (both arms' histograms travel
    together: the same paths at the same times); with fewer, each arm's trials are resampled
    (Poisson bootstrap of the pooled histograms: within-path noise only).  Percentile method.
    """
    base = np.asarray(path_hist_base, dtype=np.float64)
    treat = np.asarray(path_hist_treat, dtype=np.float64)
    if base.ndim != 2 or base.shape != treat.shape or base.sum() < 2 or treat.sum() < 2:
        return [None for _ in quantiles]
    rng = np.random.default_rng(seed)
    paths = base.shape[0]
    first_bin = 0
    if paths >= MIN_CLUSTERS:
        weights = multinomial_weights(rng, replicates, paths)
        # only the bins some path has counts in (a few hundred of the 1,000): the same replicates
        used = np.flatnonzero(base.sum(axis=0) + treat.sum(axis=0))
        first_bin, last_bin = int(used[0]), int(used[-1]) + 1
        base_star, treat_star = weights @ base[:, first_bin:last_bin], weights @ treat[:, first_bin:last_bin]
    else:
        base_star = rng.poisson(base.sum(axis=0), size=(replicates, HIST_BINS)).astype(np.float64)
        treat_star = rng.poisson(treat.sum(axis=0), size=(replicates, HIST_BINS)).astype(np.float64)
    qb, qt = _row_quantiles(base_star, quantiles, first_bin), _row_quantiles(treat_star, quantiles, first_bin)
    diff = qb - qt
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = 100.0 * diff / qb
    return [percentile_interval(diff[:, column], pct[:, column]) for column in range(len(quantiles))]


# ---- intervals of a median and of a proportion (small samples, no bootstrap) --------------------


def median_interval(sorted_values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """Distribution-free interval of the median from order statistics: ``[x_(j), x_(n+1-j)]``
    with the largest ``j`` such that ``P(Binomial(n, 1/2) < j) <= (1 - level) / 2``, which covers
    the population median with at least ``level`` for any continuous distribution.  ``None``
    below 6 values (no such ``j`` at 95 %).  The binomial terms are summed in log space
    (``2 ** n`` overflows a float above 1,023 values), from 8 standard deviations below the
    mean (the mass left out there is below 1e-15)."""
    n = len(sorted_values)
    tail = (1.0 - level) / 2.0
    log_norm = math.lgamma(n + 1) - n * math.log(2.0)
    j = max(0, math.floor(n / 2 - 4 * math.sqrt(n)))
    below = 0.0
    while j <= n:  # below = P(B < j + 1) for the next candidate j + 1
        below += math.exp(log_norm - math.lgamma(j + 1) - math.lgamma(n - j + 1))
        if below > tail:
            break
        j += 1
    if j == 0:
        return None
    return float(sorted_values[j - 1]), float(sorted_values[n - j])


def proportion_interval(successes: float, trials: float, level: float = 0.95) -> tuple[float, float] | None:
    """Wilson score interval of a proportion (good coverage down to a handful of trials and at
    0 % / 100 %, where the normal interval collapses to a point); ``None`` without trials.
    Counts may be fractional: effective sample sizes of dependent data (e.g. blocks of packets)."""
    if trials <= 0:
        return None
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    share = successes / trials
    centre = (share + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values: Sequence[float] | FloatArray, level: float = 0.95, min_n: int = 2) -> tuple[float, float] | None:
    """Student t interval of a mean (``None`` below ``min_n`` values)."""
    n = len(values)
    if n < max(2, min_n):
        return None
    array = np.asarray(values, dtype=float)
    half = t_quantile(0.5 + level / 2, n - 1) * float(array.std(ddof=1)) / math.sqrt(n)
    mean = float(array.mean())
    return mean - half, mean + half


def weighted_mean_interval(
    means: Sequence[float], intervals: Sequence[tuple[float, float] | None], weights: Sequence[float]
) -> tuple[float, tuple[float, float]]:
    """The ``weights``-weighted mean of independent estimates and its 95 % normal interval, each
    estimate's standard error taken from its own 95 % interval (half its width / 1.96; ``None``:
    no error of its own).  For a bucket of paths weighted by their measured pairs (the Model
    page's prediction, the lab twin's buckets)."""
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("weights sum to zero")
    mean = sum(weight * value for weight, value in zip(weights, means, strict=True)) / total
    variance = sum(
        (weight * (ci[1] - ci[0]) / (2 * 1.96)) ** 2 for weight, ci in zip(weights, intervals, strict=True) if ci is not None
    ) / (total**2)
    half = 1.96 * math.sqrt(variance)
    return mean, (mean - half, mean + half)


def difference_interval(
    first_ms: float, first_ci: tuple[float, float] | None, second_ms: float, second_ci: tuple[float, float] | None
) -> tuple[float, float] | None:
    """95 % normal interval of ``first - second`` for two independent estimates, each standard
    error taken from its own 95 % interval (``None`` when either has none): the unpaired
    difference of two arms' means, e.g. flows that arrived at random rather than in rounds."""
    if first_ci is None or second_ci is None:
        return None
    half = math.hypot((first_ci[1] - first_ci[0]) / 2, (second_ci[1] - second_ci[0]) / 2)
    difference = first_ms - second_ms
    return difference - half, difference + half


def block_bootstrap(
    series: Sequence[npt.ArrayLike],
    block: int,
    statistic: Callable[[FloatArray], npt.ArrayLike],
    rng: np.random.Generator,
    *,
    min_blocks: int = 10,
    replicates: int = BOOTSTRAP_REPLICATES // 4,
) -> FloatArray | None:
    """Moving-block bootstrap percentile interval of ``statistic(values)`` over several series
    (e.g. the interactive flows of a phase): each replicate draws ``ceil(len / block)`` blocks of
    ``block`` consecutive values from each series, so dependence within a block is kept.
    ``[low, high]`` for a scalar statistic, one such row per element of a vector one; ``None``
    below ``min_blocks`` blocks of data."""
    pieces = [np.asarray(values, dtype=float) for values in series]
    pieces = [values for values in pieces if len(values)]
    if sum(len(values) for values in pieces) < min_blocks * block:
        return None
    estimates = []
    for _ in range(replicates):
        drawn = []
        for values in pieces:
            length = min(block, len(values))
            starts = rng.integers(0, len(values) - length + 1, size=math.ceil(len(values) / length))
            drawn.append(np.concatenate([values[start : start + length] for start in starts])[: len(values)])
        estimates.append(np.asarray(statistic(np.concatenate(drawn)), dtype=float))
    stacked = np.stack(estimates)
    finite = stacked[np.all(np.isfinite(stacked.reshape(len(stacked), -1)), axis=1)]
    if not len(finite):
        return None
    bounds: FloatArray = np.moveaxis(np.percentile(finite, [2.5, 97.5], axis=0), 0, -1)
    return bounds

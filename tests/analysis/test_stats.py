"""Pure statistics and bucketing, against hand-computed values (no database)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from iwscope.analysis import Filters
from iwscope.analysis import buckets as bk
from iwscope.analysis.stats import (
    add_to_packed,
    cluster_bootstrap,
    difference_interval,
    histogram_bootstrap,
    histogram_cdf,
    histogram_quantiles,
    mean_std_ms,
    median_interval,
    merge_packed,
    merge_pieces,
    pack_histogram,
    poisson_bootstrap_means,
    proportion_interval,
    unpack_histogram,
    weighted_mean_interval,
)

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


def hist_of(latencies_ms: list[float]) -> np.ndarray:
    counts = np.zeros(bk.HIST_BINS, dtype=np.int64)
    for value in latencies_ms:
        counts[bk.hist_bin(value * 1000)] += 1
    return counts


def test_figure5_bucket_edges_are_right_closed() -> None:
    rtt_us = np.array([0, 20_000, 20_001, 50_000, 3_000_000, 3_000_001, np.nan])
    assert bk.rtt_index(rtt_us).tolist() == [0, 0, 1, 1, 6, 7, -1]
    assert [b.label for b in bk.RTT_BUCKETS] == [
        "<=20 ms",
        "<=50 ms",
        "<=100 ms",
        "<=200 ms",
        "<=500 ms",
        "<=1000 ms",
        "<=3000 ms",
        ">3000 ms",
    ]
    assert bk.bandwidth_index(np.array([56e3, 56e3 + 1, 1.2e6, 60e6])).tolist() == [0, 1, 4, 9]
    assert [b.label for b in bk.BANDWIDTH_BUCKETS][:4] == ["<=56kbit/s", "<=256kbit/s", "<=512kbit/s", "<=1Mbit/s"]
    assert bk.bdp_index(np.array([1000.0, 1001.0, 100_000.0, 100_001.0])).tolist() == [0, 1, 4, 5]
    assert bk.loss_index(np.array([0.0, 0.0005, 0.001, 0.02, 0.5, np.nan])).tolist() == [0, 1, 1, 3, 5, -1]


def test_size_octaves() -> None:
    assert [bk.size_bucket(size) for size in (0, 1, 2, 8191, 8192, 16383, 16384)] == [-1, 0, 1, 12, 13, 13, 14]
    assert bk.size_bucket_bounds(13) == (8192, 16384)
    assert bk.size_bucket_label(13) == "8 KiB-16 KiB"
    assert bk.size_buckets_overlapping(9000, 20000) == (13, 14)
    assert bk.size_buckets_overlapping(None, None) == (-1, 62)


def test_histogram_bins_are_two_percent_wide() -> None:
    for latency_us in (137.0, 9_000.0, 70_000.0, 1_234_567.0):
        index = bk.hist_bin(latency_us)
        assert bk.HIST_LOWER_US[index] <= latency_us * (1 + 1e-12)
        assert latency_us < bk.HIST_UPPER_US[index] * (1 + 1e-12)
        assert abs(bk.HIST_CENTER_US[index] / latency_us - 1) <= 0.0100
    assert bk.hist_bin(1.0) == 0
    assert bk.hist_bin(1e13) == bk.HIST_BINS - 1


def test_pack_unpack_and_merge() -> None:
    counts = hist_of([100, 100, 120, 900])
    lo, packed = pack_histogram(counts)
    assert lo == bk.hist_bin(100_000)
    assert len(packed) == 4 * (bk.hist_bin(900_000) - lo + 1)
    assert unpack_histogram(lo, packed).tolist() == counts.tolist()
    assert pack_histogram(np.zeros(bk.HIST_BINS)) == (0, b"")
    other_lo, other = pack_histogram(hist_of([80]))
    merged = merge_packed(np.array([1, 0, 1]), [lo, other_lo, lo], [packed, other, packed], 2)
    assert merged[0].tolist() == hist_of([80]).tolist()
    assert merged[1].tolist() == (2 * counts).tolist()


def test_merge_pieces_skips_ignored_pieces_and_keeps_every_wanted_one_whole() -> None:
    """Pieces of ignored rows (group < 0) between wanted ones: each wanted piece is read from its
    own place in the blob, whichever pieces before it were skipped (the subset path of
    ``merge_pieces``), and equals unpacking every piece one by one."""
    rng = np.random.default_rng(3)
    histograms = [hist_of(list(rng.uniform(20, 3000, size=int(rng.integers(1, 40))))) for _ in range(30)]
    packed = [pack_histogram(h) for h in histograms]
    piece_lo = np.array([lo for lo, _ in packed], dtype=np.int64)
    piece_len = np.array([len(blob) // 4 for _, blob in packed], dtype=np.int64)
    blob = b"".join(b for _, b in packed)
    for groups in (rng.integers(-1, 4, size=30), np.full(30, -1), np.arange(30) % 4, np.where(np.arange(30) == 29, 2, -1)):
        expected = np.zeros((4, bk.HIST_BINS), dtype=np.int64)
        for group, (lo, piece) in zip(groups.tolist(), packed, strict=True):
            if group >= 0:
                expected[group] += unpack_histogram(lo, piece)
        assert np.array_equal(merge_pieces(groups, piece_lo, piece_len, blob, 4), expected)


def test_quantiles_nearest_rank_within_one_percent() -> None:
    counts = hist_of([100, 120, 900, 1000, 1100])
    p50, p75, p90, p99 = histogram_quantiles(counts, [0.5, 0.75, 0.9, 0.99])
    # nearest rank: ceil(0.5*5)=3rd -> 900, ceil(3.75)=4th -> 1000, 5th -> 1100, 5th -> 1100
    assert p50 == pytest.approx(900, rel=0.01)
    assert p75 == pytest.approx(1000, rel=0.01)
    assert p90 == pytest.approx(1100, rel=0.01)
    assert p99 == pytest.approx(1100, rel=0.01)
    assert histogram_quantiles(hist_of([42]), [0.5]) == [pytest.approx(42, rel=0.01)]
    assert histogram_quantiles(np.zeros(bk.HIST_BINS), [0.5]) == [None]


def test_cdf_reaches_one_in_steps() -> None:
    points = histogram_cdf(hist_of([100, 100, 200, 400]))
    assert [fraction for _, fraction in points] == [0.5, 0.75, 1.0]
    assert points[0][0] == pytest.approx(100, rel=0.021)
    assert histogram_cdf(np.zeros(bk.HIST_BINS)) == []


def test_mean_and_sample_std() -> None:
    values_us = [900_000, 1_000_000, 1_100_000]
    mean, std = mean_std_ms(3, sum(values_us), sum(v * v for v in values_us))
    assert mean == pytest.approx(1000.0)
    assert std == pytest.approx(100.0)
    assert mean_std_ms(1, 80_000, 6.4e9) == (80.0, None)
    assert mean_std_ms(0, 0, 0) == (None, None)


def test_cluster_bootstrap_constant_improvement_gives_a_point_interval() -> None:
    # Six paths with very different latencies but exactly 100 ms improvement each (equal n):
    # every resample's pooled difference is 100 ms.
    n = [4, 4, 4, 4, 4, 4]
    base = [4 * m for m in (200.0, 300.0, 500.0, 800.0, 1200.0, 2000.0)]
    treat = [4 * (m - 100.0) for m in (200.0, 300.0, 500.0, 800.0, 1200.0, 2000.0)]
    interval = cluster_bootstrap(n, base, n, treat)
    assert interval is not None
    assert interval.abs_low == pytest.approx(100.0)
    assert interval.abs_high == pytest.approx(100.0)
    # percent varies with which paths are drawn; the point estimate 100/833.3 = 12 % lies inside
    assert interval.pct_low < 12.0 < interval.pct_high


def test_cluster_bootstrap_widens_with_between_path_spread() -> None:
    n = [10] * 6
    base = [10 * 1000.0] * 6
    treat_equal = [10 * 900.0] * 6
    treat_spread = [10 * m for m in (700.0, 800.0, 900.0, 900.0, 1000.0, 1100.0)]
    tight = cluster_bootstrap(n, base, n, treat_equal)
    wide = cluster_bootstrap(n, base, n, treat_spread)
    assert tight is not None and wide is not None
    assert tight.abs_high - tight.abs_low == pytest.approx(0.0)
    assert wide.abs_high - wide.abs_low > 100.0
    assert wide.abs_low < 100.0 < wide.abs_high


def test_histogram_bootstrap_bounds_and_single_trial() -> None:
    base, treat = hist_of([900, 1000, 1100]), hist_of([600, 700, 800])
    interval = histogram_bootstrap(base, treat, 1000.0, 700.0)
    assert interval is not None
    # resampled means lie in [900, 1100] and [600, 800]: differences in [100, 500]
    assert 100.0 - 5 <= interval.abs_low < 300.0 < interval.abs_high <= 500.0 + 5
    assert histogram_bootstrap(base, hist_of([80]), 1000.0, 80.0) is None


def test_filters_url_round_trip() -> None:
    filters = Filters(
        campaign_ids=(1, 2),
        since=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        until=dt.datetime(2026, 2, 1, 12, 30, tzinfo=dt.UTC),
        regions=("africa", "europe"),
        size_min=1000,
        size_max=20000,
        baseline_iw=10,
        treatment_iw=16,
        metric="client",
    )
    query = filters.to_query()
    assert query["campaign"] == "1,2"
    assert query["region"] == "africa,europe"
    assert query["base"] == "10" and query["treat"] == "16" and query["metric"] == "client"
    assert Filters.from_query(query) == filters
    assert Filters.from_query(Filters().to_query()) == Filters()
    assert Filters().to_query() == {"base": "3", "treat": "10", "metric": "server"}


def test_filters_from_bad_query_falls_back_to_defaults() -> None:
    bad = {
        "campaign": "1,x,-4,1",
        "since": "yesterday",
        "until": "2026-13-40",
        "region": " , ",
        "smin": "-5",
        "smax": "big",
        "base": "0",
        "treat": "ten",
        "metric": "fastest",
    }
    assert Filters.from_query(bad) == Filters(campaign_ids=(1,))
    assert Filters.from_query({}) == Filters()
    # a '+' of a UTC offset decoded to a space by a URL parser is still understood
    parsed = Filters.from_query({"since": "2026-01-01T00:00:00 00:00"})
    assert parsed.since == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_median_interval_covers_at_least_95_percent() -> None:
    """The order-statistic interval: hand ranks for n = 24 (7th and 18th), none below 6 values,
    and coverage of a skewed distribution's median >= 95 % at n = 10 and 24."""
    assert median_interval([float(v) for v in range(1, 25)]) == (7.0, 18.0)
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    # Large n (2 ** n overflows a float above 1,023): ranks n/2 -+ 1.96 sqrt(n)/2, as the normal
    # approximation gives (n = 5000: ranks 2431 and 2570, checked with exact integer binomials).
    assert median_interval([float(v) for v in range(1, 5001)]) == (2431.0, 2570.0)
    assert median_interval([float(v) for v in range(1, 1101)]) == (518.0, 583.0)
    rng = np.random.default_rng(3)
    true_median = float(np.exp(0.0))  # lognormal(0, 1)
    for n in (10, 24):
        hits = 0
        for _ in range(4000):
            interval = median_interval(np.sort(rng.lognormal(0.0, 1.0, n)).tolist())
            assert interval is not None
            hits += interval[0] <= true_median <= interval[1]
        assert hits / 4000 >= 0.94, (n, hits)


def test_proportion_interval_is_wilson() -> None:
    low, high = proportion_interval(24, 24)  # type: ignore[misc]
    assert high == 1.0 and low == pytest.approx(0.8620, abs=1e-4)
    low, high = proportion_interval(1, 2)  # type: ignore[misc]
    assert (low, high) == pytest.approx((0.0945, 0.9055), abs=1e-4)
    assert proportion_interval(0, 0) is None


def test_add_to_packed_equals_the_full_length_merge() -> None:
    """The refresh's span-only merge gives exactly pack(unpack(old) + delta), also when a delta
    takes counts away (re-bucketing) and empties the ends or the whole histogram."""
    rng = np.random.default_rng(4)
    for _ in range(300):
        old = np.zeros(bk.HIST_BINS, dtype=np.int64)
        if rng.random() < 0.8:
            start = int(rng.integers(0, bk.HIST_BINS - 40))
            old[start : start + 40] = rng.integers(0, 5, 40)
        lo, packed = pack_histogram(old)
        bins: dict[int, int] = {}
        for index in rng.integers(0, bk.HIST_BINS, int(rng.integers(0, 6))).tolist():
            bins[index] = bins.get(index, 0) + int(rng.integers(1, 4))
        if rng.random() < 0.3:  # take some of the old counts away
            for index in np.flatnonzero(old)[: int(rng.integers(0, 10))].tolist():
                bins[index] = bins.get(index, 0) - int(old[index])
        expected = old.copy()
        for index, count in bins.items():
            expected[index] += count
        assert add_to_packed(lo, packed, bins) == pack_histogram(expected)
    assert add_to_packed(5, np.array([2], dtype="<i4").tobytes(), {5: -2}) == (0, b"")
    assert add_to_packed(0, b"", {}) == (0, b"")


def _replicate_interval(hist: np.ndarray, normal: bool, seed: int, replicates: int = 40_000) -> tuple[float, float]:
    means, _ = poisson_bootstrap_means(np.random.default_rng(seed), hist, replicates, normal)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def _cell(latencies_ms: np.ndarray) -> np.ndarray:
    return np.bincount([bk.hist_bin(value * 1000) for value in latencies_ms], minlength=bk.HIST_BINS)


def test_poisson_bootstrap_draws_a_large_symmetric_cell_as_its_normal_and_a_skewed_one_bin_by_bin() -> None:
    rng = np.random.default_rng(7)
    body = _cell(rng.lognormal(np.log(250.0), 0.15, 5000))  # skewness of the replicate mean ~0.007
    bin_by_bin = _replicate_interval(body, normal=False, seed=1)
    drawn_normal = _replicate_interval(body, normal=True, seed=2)
    width = bin_by_bin[1] - bin_by_bin[0]
    # the endpoints agree to within the bin-by-bin draw's own replicate noise
    assert abs(drawn_normal[0] - bin_by_bin[0]) < 0.02 * width and abs(drawn_normal[1] - bin_by_bin[1]) < 0.02 * width
    # the normal draw is really taken: another seed's replicates differ from the Poisson draw's
    assert not np.array_equal(
        poisson_bootstrap_means(np.random.default_rng(3), body, 100)[0],
        poisson_bootstrap_means(np.random.default_rng(3), body, 100, normal=False)[0],
    )

    # 10 of 1,200 trials in a long timeout tail: skewness 0.4, so drawn bin by bin, replicate for replicate ...
    tail = _cell(np.concatenate([rng.lognormal(np.log(250.0), 0.15, 1190), 1200.0 + rng.exponential(20_000.0, 10)]))
    assert np.array_equal(
        poisson_bootstrap_means(np.random.default_rng(3), tail, 500)[0],
        poisson_bootstrap_means(np.random.default_rng(3), tail, 500, normal=False)[0],
    )
    # ... because its normal would misplace the interval (by 5 % of its width here)
    exact = _replicate_interval(tail, normal=False, seed=1)
    centres = bk.HIST_CENTER_US / 1000.0
    n = tail.sum()
    mean = float(tail @ centres) / n
    sd = float(np.sqrt(tail @ (centres - mean) ** 2)) / n
    normal_interval = (mean - 1.96 * sd, mean + 1.96 * sd)
    tail_width = exact[1] - exact[0]
    assert max(abs(normal_interval[0] - exact[0]), abs(normal_interval[1] - exact[1])) > 0.04 * tail_width
    # a small cell is never drawn as a normal
    small = hist_of([200.0, 210.0, 260.0, 300.0, 900.0] * 10)
    assert np.array_equal(
        poisson_bootstrap_means(np.random.default_rng(3), small, 500)[0],
        poisson_bootstrap_means(np.random.default_rng(3), small, 500, normal=False)[0],
    )


def test_a_weighted_mean_of_independent_estimates_takes_their_errors_with_their_weights() -> None:
    # two estimates, 20 +- 1 and 40 +- 4 (95 % half widths), weighted 3 : 1
    mean, (low, high) = weighted_mean_interval([20.0, 40.0], [(19.0, 21.0), (36.0, 44.0)], [3.0, 1.0])
    assert mean == pytest.approx(25.0)
    half = 1.96 * np.sqrt((3 * 1 / 1.96) ** 2 + (1 * 4 / 1.96) ** 2) / 4
    assert (low, high) == pytest.approx((25.0 - half, 25.0 + half))
    # an estimate without an interval adds no error; weights that sum to zero are refused
    assert weighted_mean_interval([10.0, 30.0], [None, None], [1.0, 1.0]) == (20.0, (20.0, 20.0))
    with pytest.raises(ValueError):
        weighted_mean_interval([1.0], [None], [0.0])


def test_an_unpaired_difference_adds_the_two_errors_in_quadrature() -> None:
    # 30 +- 3 minus 10 +- 4: 20 +- 5
    assert difference_interval(30.0, (27.0, 33.0), 10.0, (6.0, 14.0)) == pytest.approx((15.0, 25.0))
    assert difference_interval(30.0, None, 10.0, (6.0, 14.0)) is None

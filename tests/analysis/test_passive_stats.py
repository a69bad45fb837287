"""The passive study's statistics on synthetic clusters where the truth is known (pure: no
database).  Latencies are lognormal with a random effect per cluster (the prefixes of one
cluster share paths and habits), so the population's percentiles and mean are known in closed
form and the cluster bootstrap's intervals can be checked to cover them."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from iwscope.analysis.buckets import HIST_CENTER_US, HIST_MIN_US, HIST_RATIO, hist_bin
from iwscope.analysis.passive_stats import (
    HIST_RESOLUTION_PCT,
    MIN_CLUSTERS,
    MIN_CONNECTIONS,
    MIN_RESPONSES,
    ClusterSums,
    LatencyEstimate,
    cluster_sums,
    improvement,
    latency_estimate,
    paired_change,
    paired_latency,
    paired_weights,
    rate_difference,
    rate_estimate,
    row_quantiles,
    stable_key,
)

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services

SIGMA_CLUSTER = 0.35
SIGMA_CONNECTION = 0.55
BASE_MEDIAN_US = 200_000.0
TREAT_MEDIAN_US = 170_000.0


def bins_of(latency_us: np.ndarray) -> np.ndarray:
    """``hist_bin`` vectorised (the same floor of the log)."""
    index = np.floor(np.log(np.maximum(latency_us, HIST_MIN_US) / HIST_MIN_US) / math.log(HIST_RATIO))
    return np.clip(index, 0, len(HIST_CENTER_US) - 1).astype(np.int64)


def arm(
    rng: np.random.Generator,
    median_us: float,
    clusters: int = 32,
    per_cluster: float = 60.0,
    shift_us: float = 0.0,
    effects: np.ndarray | None = None,
    retrans_rate: float = 0.02,
) -> ClusterSums:
    """One arm's clusters: sizes Poisson, log latency = log(median) + cluster effect + noise."""
    sizes = rng.poisson(per_cluster, clusters) + 1
    effect = rng.normal(0.0, SIGMA_CLUSTER, clusters) if effects is None else effects
    histograms, sums, connections, segments, retrans = [], [], [], [], []
    for size, u in zip(sizes, effect, strict=True):
        values = np.exp(math.log(median_us) + u + rng.normal(0.0, SIGMA_CONNECTION, size)) + shift_us
        found, counts = np.unique(bins_of(values), return_counts=True)
        histograms.append(dict(zip(found.tolist(), counts.astype(float).tolist(), strict=True)))
        sums.append(float(values.sum()))
        connections.append(float(size))
        sent = rng.integers(10, 60, size).sum()
        segments.append(float(sent))
        retrans.append(float(rng.binomial(sent, retrans_rate)))
    return cluster_sums(
        list(range(clusters)),
        {
            "connections": connections,
            "responses": connections,
            "latency_sum_us": sums,
            "data_segs_out": segments,
            "total_retrans": retrans,
            "retrans_connections": [min(c, r) for c, r in zip(connections, retrans, strict=True)],
        },
        histograms,
    )


def true_quantile_ms(median_us: float, q: float) -> float:
    sigma = math.hypot(SIGMA_CLUSTER, SIGMA_CONNECTION)
    return median_us * math.exp(sigma * NormalDist().inv_cdf(q)) / 1000.0


def true_mean_ms(median_us: float) -> float:
    return median_us * math.exp((SIGMA_CLUSTER**2 + SIGMA_CONNECTION**2) / 2) / 1000.0


# ---- histogram resolution and point estimates -------------------------------------------------------


def test_percentiles_from_the_merged_histogram_are_within_the_stated_resolution() -> None:
    rng = np.random.default_rng(1)
    values = np.exp(rng.normal(math.log(150_000), 1.1, 5000))
    found, counts = np.unique(bins_of(values), return_counts=True)
    data = cluster_sums(
        [0],
        {"connections": [5000.0], "responses": [5000.0], "latency_sum_us": [float(values.sum())]},
        [dict(zip(found.tolist(), counts.astype(float).tolist(), strict=True))],
    )
    estimate = latency_estimate(data, stable_key("resolution"))
    ordered = np.sort(values)
    assert HIST_RESOLUTION_PCT == pytest.approx(0.995, abs=0.001)
    for key, q in (("p50", 0.5), ("p75", 0.75), ("p90", 0.9), ("p99", 0.99)):
        exact_ms = ordered[math.ceil(q * len(values)) - 1] / 1000.0
        got = estimate.point[key]
        assert got is not None and abs(got / exact_ms - 1.0) <= HIST_RESOLUTION_PCT / 100.0 + 1e-12, (key, got, exact_ms)
    # the mean is exact (from the sums), not binned
    assert estimate.point["avg"] == pytest.approx(values.mean() / 1000.0, rel=1e-12)
    # one bin's single value: its centre, never below zero
    assert row_quantiles(np.array([[0.0, 3.0]]), [0.5], first_bin=hist_bin(80_000) - 1)[0, 0] == pytest.approx(
        HIST_CENTER_US[hist_bin(80_000)] / 1000.0
    )


# ---- n too small ------------------------------------------------------------------------------------


def spread(total: int, clusters: int, latency_us: float = 100_000.0) -> ClusterSums:
    """``total`` responses over ``clusters`` clusters, all at one latency."""
    per = [total // clusters + (1 if index < total % clusters else 0) for index in range(clusters)]
    return cluster_sums(
        list(range(clusters)),
        {
            "connections": per,
            "responses": per,
            "latency_sum_us": [n * latency_us for n in per],
            "data_segs_out": [10.0 * n for n in per],
            "total_retrans": [1.0 for _ in per],
        },
        [{hist_bin(latency_us): float(n)} for n in per],
    )


@pytest.mark.parametrize(
    ("responses", "clusters", "too_small"),
    [(MIN_RESPONSES - 1, 10, True), (MIN_RESPONSES, 10, False), (400, MIN_CLUSTERS - 1, True), (400, MIN_CLUSTERS, False)],
)
def test_n_too_small_below_the_named_thresholds(responses: int, clusters: int, too_small: bool) -> None:
    estimate = latency_estimate(spread(responses, clusters), stable_key("small"))
    assert estimate.too_small is too_small
    assert (estimate.value("p50").value is None) is too_small
    assert (estimate.value("avg").low is None) is too_small
    # an improvement needs both arms
    fine = latency_estimate(spread(400, 10, 90_000.0), stable_key("fine"))
    absolute, percent = improvement(estimate, fine, "avg")
    assert (absolute.value is None and percent.value is None) is too_small
    rate = rate_estimate(spread(responses, clusters), "total_retrans", "data_segs_out", stable_key("rate"))
    assert rate.too_small is (responses < MIN_CONNECTIONS or clusters < MIN_CLUSTERS)


def test_thresholds_are_the_briefs() -> None:
    assert (MIN_RESPONSES, MIN_CONNECTIONS, MIN_CLUSTERS) == (30, 30, 5)


# ---- the cluster bootstrap ---------------------------------------------------------------------------


def test_deterministic_case_brackets_the_true_difference() -> None:
    rng = np.random.default_rng(33)
    base, treat = arm(rng, BASE_MEDIAN_US, per_cluster=400), arm(rng, TREAT_MEDIAN_US, per_cluster=400)
    b, t = latency_estimate(base, stable_key("b")), latency_estimate(treat, stable_key("t"))
    for key, truth in (
        ("avg", true_mean_ms(BASE_MEDIAN_US) - true_mean_ms(TREAT_MEDIAN_US)),
        ("p50", (BASE_MEDIAN_US - TREAT_MEDIAN_US) / 1000.0),
        ("p90", true_quantile_ms(BASE_MEDIAN_US, 0.9) - true_quantile_ms(TREAT_MEDIAN_US, 0.9)),
    ):
        absolute, percent = improvement(b, t, key)
        assert absolute.low is not None and absolute.high is not None and absolute.value is not None
        assert absolute.low < truth < absolute.high, (key, absolute, truth)
        assert absolute.low <= absolute.value <= absolute.high
        assert percent.low is not None and percent.low < 15.0 < (percent.high or 0.0), (key, percent)
    # reproducible: the same data, the same draws
    again = improvement(latency_estimate(base, stable_key("b")), latency_estimate(treat, stable_key("t")), "p50")
    assert again == improvement(b, t, "p50")


def coverage(repetitions: int, per_cluster: float) -> dict[str, float]:
    rng = np.random.default_rng(20100730)
    truths = {
        "avg": true_mean_ms(BASE_MEDIAN_US) - true_mean_ms(TREAT_MEDIAN_US),
        "p50": (BASE_MEDIAN_US - TREAT_MEDIAN_US) / 1000.0,
    }
    covered = dict.fromkeys(truths, 0)
    for repetition in range(repetitions):
        b = latency_estimate(arm(rng, BASE_MEDIAN_US, per_cluster=per_cluster), stable_key("cov-b", repetition), ("p50",))
        t = latency_estimate(arm(rng, TREAT_MEDIAN_US, per_cluster=per_cluster), stable_key("cov-t", repetition), ("p50",))
        for key, truth in truths.items():
            absolute, _ = improvement(b, t, key)
            assert absolute.low is not None and absolute.high is not None
            covered[key] += int(absolute.low <= truth <= absolute.high)
    return {key: count / repetitions for key, count in covered.items()}


def test_interval_covers_the_true_difference_in_about_95_percent_of_campaigns() -> None:
    """120 seeded campaigns of 2 x 32 clusters: the 95 % interval of the mean and the median
    improvement covers the truth in 88-99 % of them (binomial sd at 95 %: 2 points; this seed
    gives 92.5 % and 93.3 %, 300 campaigns 93.0 % and 94.3 %).  Intervals that ignore the
    clusters cover far less (next test); intervals that are far too wide cover all."""
    found = coverage(120, per_cluster=60.0)
    assert 0.88 <= found["avg"] <= 0.99 and 0.88 <= found["p50"] <= 0.99, found


def test_resampling_connections_instead_of_clusters_would_be_caught() -> None:
    """The same campaigns with the cluster effect ignored (each connection its own cluster:
    one big cluster split into singletons) under-cover badly -- the coverage check above can fail."""
    rng = np.random.default_rng(7)
    truth = (BASE_MEDIAN_US - TREAT_MEDIAN_US) / 1000.0
    covered = 0
    repetitions = 30
    for repetition in range(repetitions):
        estimates = []
        for median, name in ((BASE_MEDIAN_US, "b"), (TREAT_MEDIAN_US, "t")):
            singles = split_into_connections(arm(rng, median, per_cluster=25.0))
            estimates.append(latency_estimate(singles, stable_key("naive", name, repetition), ("p50",), replicates=400))
        absolute, _ = improvement(estimates[0], estimates[1], "p50")
        assert absolute.low is not None and absolute.high is not None
        covered += int(absolute.low <= truth <= absolute.high)
    assert covered / repetitions < 0.8, covered


def split_into_connections(data: ClusterSums) -> ClusterSums:
    """Every response its own 'cluster' (what a connection-level bootstrap resamples)."""
    histograms: list[dict[int, float]] = []
    for row in data.hist:
        for column in np.flatnonzero(row):
            histograms += [{data.hist_lo + int(column): 1.0}] * int(row[column])
    ones = [1.0] * len(histograms)
    centres = [float(HIST_CENTER_US[next(iter(h))]) for h in histograms]
    return cluster_sums(
        list(range(len(histograms))), {"connections": ones, "responses": ones, "latency_sum_us": centres}, histograms
    )


def test_clusters_are_resampled_independently_per_arm_and_seeded() -> None:
    rng = np.random.default_rng(3)
    data = arm(rng, BASE_MEDIAN_US)
    first, second = latency_estimate(data, stable_key("x", "16")), latency_estimate(data, stable_key("x", "32"))
    assert first.point == second.point
    assert first.replicates is not None and second.replicates is not None
    assert not np.array_equal(first.replicates, second.replicates)  # another arm: another draw
    assert np.array_equal(first.replicates, latency_estimate(data, stable_key("x", "16")).replicates)
    # replicate latencies are latencies: never below zero
    assert np.nanmin(first.replicates) > 0


# ---- retransmissions ---------------------------------------------------------------------------------


def test_retransmission_rate_and_increase_cover_the_truth() -> None:
    """100 seeded pairs of arms (2 % and 3 % of segments retransmitted): the rate's interval
    covers 2 % and the increase's covers 1 percentage point in 88-100 % of them."""
    rng = np.random.default_rng(11)
    rate_covered = increase_covered = 0
    repetitions = 100
    for repetition in range(repetitions):
        base = rate_estimate(
            arm(rng, BASE_MEDIAN_US, retrans_rate=0.02), "total_retrans", "data_segs_out", stable_key("rb", repetition)
        )
        treat = rate_estimate(
            arm(rng, TREAT_MEDIAN_US, retrans_rate=0.03), "total_retrans", "data_segs_out", stable_key("rt", repetition)
        )
        value, increase = base.value(), rate_difference(base, treat)
        assert None not in (value.low, value.high, increase.low, increase.high)
        rate_covered += int(value.low <= 0.02 <= value.high)  # type: ignore[operator]
        increase_covered += int(increase.low <= 1.0 <= increase.high)  # type: ignore[operator]
        assert increase.value == pytest.approx(100.0 * ((treat.point or 0) - (base.point or 0)))
    assert rate_covered / repetitions >= 0.88 and increase_covered / repetitions >= 0.88, (rate_covered, increase_covered)


def test_a_rate_with_no_event_still_has_an_honest_interval() -> None:
    none = spread(300, 10)
    none.sums["total_retrans"][:] = 0.0
    estimate = rate_estimate(none, "total_retrans", "data_segs_out", stable_key("zero"))
    value = estimate.value()
    assert estimate.degenerate and value.value == 0.0
    assert value.low == 0.0 and value.high is not None and 0.005 < value.high < 0.02  # Wilson, 3.8 / 300
    other = rate_estimate(spread(300, 10), "total_retrans", "data_segs_out", stable_key("some"))
    difference = rate_difference(estimate, other)
    assert difference.low is not None and difference.high is not None and difference.low < 0 < difference.high


# ---- the share sweep -------------------------------------------------------------------------------


def test_share_sweep_pairs_the_levels_and_finds_the_interference() -> None:
    """The default arm at two treated shares: the same clusters (their effects shared) and 8 ms
    of interference at the larger share.  The paired change brackets the 8 ms and is narrower
    than an unpaired difference would be."""
    rng = np.random.default_rng(5)
    effects = rng.normal(0.0, SIGMA_CLUSTER, 32)
    small = arm(rng, BASE_MEDIAN_US, effects=effects, per_cluster=200)
    large = arm(rng, BASE_MEDIAN_US, effects=effects, per_cluster=200, shift_us=8_000.0)
    union, weights = paired_weights([small, large], stable_key("sweep"))
    before, after = paired_latency(small, union, weights), paired_latency(large, union, weights)
    change = paired_change(after, before, "avg")
    assert change.low is not None and change.high is not None and change.low < 8.0 < change.high
    unpaired_before = latency_estimate(small, stable_key("u1"), ("p50",))
    unpaired_after = latency_estimate(large, stable_key("u2"), ("p50",))
    unpaired, _ = improvement(unpaired_before, unpaired_after, "avg")
    assert unpaired.low is not None and unpaired.high is not None
    assert (change.high - change.low) < 0.5 * (unpaired.high - unpaired.low)


def test_a_level_without_enough_clusters_is_too_small_in_the_sweep() -> None:
    rng = np.random.default_rng(9)
    full = arm(rng, BASE_MEDIAN_US)
    few = arm(rng, BASE_MEDIAN_US, clusters=MIN_CLUSTERS - 1, per_cluster=100)
    union, weights = paired_weights([full, few], stable_key("few"))
    level: LatencyEstimate = paired_latency(few, union, weights)
    assert level.too_small and level.value("avg").value is None
    assert paired_change(level, paired_latency(full, union, weights), "avg").value is None

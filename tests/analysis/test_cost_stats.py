"""The cost analysis's small-sample rules and intervals (no database)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from iwscope.analysis.cost import MIN_DELAY_SAMPLES, MIN_P99_SAMPLES
from iwscope.analysis.stats import block_bootstrap, mean_interval

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services

#: The module itself (the attribute ``iwscope.analysis.cost`` is the function of that name).
cost_module = importlib.import_module("iwscope.analysis.cost")


def test_p99_needs_enough_packets_to_bracket_it() -> None:
    # The smallest n whose maximum exceeds the 99th percentile with >= 97.5 % probability.
    assert 1 - 0.99**MIN_P99_SAMPLES >= 0.975 > 1 - 0.99 ** (MIN_P99_SAMPLES - 1)
    rng = np.random.default_rng(1)
    few = [rng.exponential(5.0, MIN_P99_SAMPLES - 1)]
    p50, p50_ci, p99, p99_ci = cost_module._delay_quantiles(few, 30, rng)  # 12 blocks: a p50, no p99
    assert p50 is not None and p50_ci is not None and (p99, p99_ci) == (None, None)
    _, _, value, interval = cost_module._delay_quantiles([rng.exponential(5.0, 2000)], 40, rng)
    assert value is not None and interval is not None and interval[0] <= value <= interval[1]
    assert abs(value - 5.0 * np.log(100)) < 5.0  # the exponential's p99 is mean x ln 100
    # Enough packets for a p99 but fewer than 10 blocks for its interval: no number at all.
    assert cost_module._delay_quantiles([rng.exponential(5.0, 390)], 40, rng) == (None, None, None, None)
    assert cost_module._delay_quantiles([rng.exponential(5.0, 400)], 40, rng)[3] is not None
    assert cost_module._delay_quantiles([rng.exponential(5.0, MIN_DELAY_SAMPLES - 1)], 1, rng)[0] is None


def test_loss_interval_does_not_collapse_and_widens_for_bursts() -> None:
    none_lost = cost_module._loss_interval([np.zeros(500)], 40)
    assert none_lost is not None and none_lost[0] == pytest.approx(0.0, abs=1e-12) and 0.005 < none_lost[1] < 0.01
    spread = np.zeros(800)
    spread[::80] = 1  # 10 single losses, one every 80 packets
    burst = np.zeros(800)
    burst[400:410] = 1  # the same 10 losses in one burst
    spread_ci = cost_module._loss_interval([spread], 40)
    burst_ci = cost_module._loss_interval([burst], 40)
    independent = cost_module.proportion_interval(10, 800)
    assert spread_ci == pytest.approx(independent)  # no more variance than independent packets
    assert burst_ci[1] > 2 * independent[1]  # type: ignore[index]  # a burst counts for less
    assert cost_module._loss_interval([burst[:200]], 40)[1] > burst_ci[1]  # type: ignore[index]  # < 10 blocks


def test_ratio_interval_is_withheld_without_retransmissions() -> None:
    rng = np.random.default_rng(2)
    assert cost_module._bootstrap_ratio([0.0] * 40, [50_000.0] * 40, rng) is None
    interval = cost_module._bootstrap_ratio([1000.0] * 20 + [0.0] * 20, [50_000.0] * 40, rng)
    assert interval is not None and interval[0] < 0.01 < interval[1]


def test_block_bootstrap_needs_ten_blocks_and_widens_for_dependent_samples() -> None:
    rng = np.random.default_rng(3)
    assert block_bootstrap([np.ones(99)], 10, np.mean, rng) is None
    # A slowly drifting series (long bursts of queueing): blocks keep the runs, so the interval
    # of its mean is wider than an i.i.d. resample's.
    series = np.repeat(rng.exponential(5.0, 40), 25)
    blocked = block_bootstrap([series], 25, np.mean, rng)
    iid = block_bootstrap([series], 1, np.mean, rng)
    assert blocked is not None and iid is not None and blocked[1] - blocked[0] > 2 * (iid[1] - iid[0])


def test_mean_interval_needs_its_minimum() -> None:
    assert mean_interval([1.0] * 5, min_n=6) is None
    low, high = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], min_n=6)  # type: ignore[misc]
    assert low < 3.5 < high

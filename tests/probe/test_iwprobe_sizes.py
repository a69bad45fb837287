"""The websearch size model matches the shape of Figure 1 of the IW10 paper."""

from __future__ import annotations

import random

import pytest

from iwprobe import sizes

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


def test_websearch_shape() -> None:
    # ~90 % of responses fit in 10 segments of 1460 bytes.
    assert sizes.cdf("websearch", 14_600) == pytest.approx(0.90)
    # Few fit in IW3 (3 x 1460 B), most are a few KB to 30 KB, the median near 9 KB.
    assert sizes.cdf("websearch", 4_380) < 0.15
    assert 8_000 <= sizes.quantile("websearch", 0.5) <= 9_500
    assert sizes.quantile("websearch", 1.0) == 30_000
    assert sizes.quantile("websearch", 0.0) == 1_000


def test_samples_follow_the_cdf() -> None:
    drawn = sizes.sample("websearch", 20_000, random.Random(7))
    assert min(drawn) >= 1_000 and max(drawn) <= 30_000
    for size in (3_000, 9_000, 14_600, 20_000):
        empirical = sum(1 for value in drawn if value <= size) / len(drawn)
        assert empirical == pytest.approx(sizes.cdf("websearch", size), abs=0.015)


def test_cdf_and_quantile_are_inverse() -> None:
    for probability in (0.05, 0.3, 0.55, 0.8, 0.93):
        assert sizes.cdf("websearch", sizes.quantile("websearch", probability)) == pytest.approx(probability, abs=0.001)


def test_bad_input_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="unknown size distribution"):
        sizes.sample("pareto", 1)
    with pytest.raises(ValueError, match=r"probability must be in \[0, 1\]"):
        sizes.quantile("websearch", 1.5)

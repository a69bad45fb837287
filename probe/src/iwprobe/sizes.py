"""Response-size models a campaign can name instead of fixed sizes.

``websearch`` approximates Figure 1 of Dukkipati et al., "An Argument for Increasing TCP's
Initial Congestion Window" (CCR 2010): the CDF of Google web-search response sizes.  Like
the replication in the seed document 000 (a 7-piece piecewise function), it is a
piecewise-linear CDF; our breakpoints follow the published curve's shape:

=============  ============  ================================================
size (bytes)   CDF           why
=============  ============  ================================================
1,000          0.00          no search response is smaller than ~1 KB
3,000          0.05          few responses fit in IW3 (3 x 1460 B = 4,380 B)
6,000          0.25
9,000          0.55          median around 8-9 KB (the paper's "9 KB" object)
12,000         0.78
14,600         0.90          ~90 % fit in 10 segments of 1,460 B
20,000         0.96
30,000         1.00          the tail ends near 30 KB
=============  ============  ================================================

Sizes are drawn by inverse-transform sampling of that CDF and rounded to whole bytes.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from typing import Optional

#: (size in bytes, cumulative probability) breakpoints of the ``websearch`` model.
WEBSEARCH_BREAKPOINTS: tuple[tuple[int, float], ...] = (
    (1_000, 0.00),
    (3_000, 0.05),
    (6_000, 0.25),
    (9_000, 0.55),
    (12_000, 0.78),
    (14_600, 0.90),
    (20_000, 0.96),
    (30_000, 1.00),
)

DISTRIBUTIONS: dict[str, tuple[tuple[int, float], ...]] = {"websearch": WEBSEARCH_BREAKPOINTS}


def cdf(name: str, size: float) -> float:
    """P(response size <= ``size``) under the named model."""
    points = _points(name)
    if size <= points[0][0]:
        return 0.0
    if size >= points[-1][0]:
        return 1.0
    sizes = [s for s, _ in points]
    upper = bisect.bisect_right(sizes, size)
    (s0, p0), (s1, p1) = points[upper - 1], points[upper]
    return p0 + (p1 - p0) * (size - s0) / (s1 - s0)


def quantile(name: str, probability: float) -> int:
    """The size at cumulative ``probability`` (inverse CDF), in whole bytes."""
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"probability must be in [0, 1], got {probability}")
    points = _points(name)
    for (s0, p0), (s1, p1) in zip(points, points[1:]):
        if probability <= p1:
            if p1 == p0:
                return s0
            return int(round(s0 + (s1 - s0) * (probability - p0) / (p1 - p0)))
    return points[-1][0]


def sample(name: str, count: int, rng: Optional[random.Random] = None) -> list[int]:
    """Draw ``count`` sizes from the named model."""
    generator = rng or random.Random()
    return [quantile(name, generator.random()) for _ in range(count)]


def _points(name: str) -> Sequence[tuple[int, float]]:
    try:
        return DISTRIBUTIONS[name]
    except KeyError:
        raise ValueError(f"unknown size distribution {name!r}; known: {sorted(DISTRIBUTIONS)}") from None

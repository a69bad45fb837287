"""Bucket edges of every comparison dimension, and the latency histogram's bin layout.

Figure 5 of Dukkipati et al. (2010) buckets requests by path RTT, bottleneck bandwidth and
bandwidth-delay product and labels each bar by its *upper* edge (``20``, ``50``, ... ``3000``,
``>3000`` for RTT).  We keep exactly those edges:

* RTT (ms): 20, 50, 100, 200, 500, 1000, 3000 -> 8 buckets (``<=20`` ... ``>3000``).
* bottleneck bandwidth (kbit/s): 56, 256, 512, 1000, 3000, 5000, 10000, 20000, 50000 ->
  10 buckets.
* BDP (bytes): 1000, 5000, 10000, 50000, 100000 -> 6 buckets.

Buckets are half-open on the left, closed on the right: ``(lower, upper]``; the first bucket
starts at 0 (inclusive) and the last has no upper edge.  Loss buckets (server
retransmitted bytes / bytes sent of the path, ``path_estimates.loss_rate``) put a loss-free
path in a bucket of its own.  Object sizes are bucketed by octave (``2**k <= size <
2**(k+1)``) in the roll-up key itself, so size filters are octave-granular on the roll-up
path (exact on the raw path).

The latency histogram is log-spaced: bin ``i`` covers ``[HIST_MIN_US * R**i, HIST_MIN_US *
R**(i+1))`` with ``R = 1.02`` (2 % wide bins), values below ``HIST_MIN_US`` go to bin 0 and
values above the last edge to the last bin.  A bin is represented by its geometric centre, so
any percentile read from the histogram is within +-1 % of the exact order statistic of the
binned values (resolution stated in the README).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

Dimension = Literal["rtt", "bandwidth", "bdp", "region", "loss", "size"]
DIMENSIONS: tuple[Dimension, ...] = ("rtt", "bandwidth", "bdp", "region", "loss", "size")

#: Upper edges of the Figure 5 RTT buckets, milliseconds.
RTT_EDGES_MS: tuple[float, ...] = (20, 50, 100, 200, 500, 1000, 3000)
#: Upper edges of the Figure 5 bandwidth buckets, bit/s (56 kbit/s ... 50 Mbit/s).
BANDWIDTH_EDGES_BPS: tuple[float, ...] = (56e3, 256e3, 512e3, 1e6, 3e6, 5e6, 10e6, 20e6, 50e6)
#: Upper edges of the Figure 5 BDP buckets, bytes.
BDP_EDGES_BYTES: tuple[float, ...] = (1000, 5000, 10000, 50000, 100000)
#: Upper edges of the loss buckets (fraction of bytes retransmitted); 0 is its own bucket.
LOSS_EDGES: tuple[float, ...] = (0.0, 0.001, 0.01, 0.03, 0.1)

#: Histogram layout (see module docstring).
HIST_MIN_US: float = 10.0
HIST_RATIO: float = 1.02
HIST_BINS: int = 1000  # covers 10 us .. ~66 min


@dataclass(frozen=True)
class Bucket:
    """One bucket of a dimension: ``label`` for display, ``order`` for sorting."""

    label: str
    order: int
    lower: float | None
    upper: float | None


def _format_number(value: float) -> str:
    return f"{value:g}"


def _format_bandwidth(bps: float) -> str:
    if bps >= 1e6:
        return f"{bps / 1e6:g}M"
    return f"{bps / 1e3:g}k"


def edge_buckets(edges: tuple[float, ...], unit: str = "", fmt: str = "number") -> list[Bucket]:
    """The ``len(edges) + 1`` buckets ``[0, e0], (e0, e1], ..., (e_last, inf)``."""
    formatter = _format_bandwidth if fmt == "bandwidth" else _format_number
    buckets: list[Bucket] = []
    lower: float | None = 0.0
    for order, upper in enumerate(edges):
        buckets.append(Bucket(f"<={formatter(upper)}{unit}", order, lower, upper))
        lower = upper
    buckets.append(Bucket(f">{formatter(edges[-1])}{unit}", len(edges), edges[-1], None))
    return buckets


RTT_BUCKETS = edge_buckets(RTT_EDGES_MS, " ms")
BANDWIDTH_BUCKETS = edge_buckets(BANDWIDTH_EDGES_BPS, "bit/s", fmt="bandwidth")
BDP_BUCKETS = edge_buckets(BDP_EDGES_BYTES, " B")


def _loss_buckets() -> list[Bucket]:
    buckets = [Bucket("0%", 0, 0.0, 0.0)]
    for order, upper in enumerate(LOSS_EDGES[1:], start=1):
        buckets.append(Bucket(f"<={upper * 100:g}%", order, LOSS_EDGES[order - 1], upper))
    buckets.append(Bucket(f">{LOSS_EDGES[-1] * 100:g}%", len(LOSS_EDGES), LOSS_EDGES[-1], None))
    return buckets


LOSS_BUCKETS = _loss_buckets()


def edge_index(values: npt.NDArray[np.float64], edges: tuple[float, ...]) -> npt.NDArray[np.int64]:
    """Bucket index of each value for buckets closed on the right; NaN -> -1 (unknown)."""
    index = np.searchsorted(np.asarray(edges, dtype=np.float64), values, side="left").astype(np.int64)
    index[np.isnan(values)] = -1
    return index


def rtt_index(min_rtt_us: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """RTT bucket index of path min RTTs given in microseconds."""
    return edge_index(min_rtt_us / 1000.0, RTT_EDGES_MS)


def bandwidth_index(bps: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    return edge_index(bps, BANDWIDTH_EDGES_BPS)


def bdp_index(bdp_bytes: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    return edge_index(bdp_bytes, BDP_EDGES_BYTES)


def loss_index(loss_rate: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Loss bucket: 0 exactly -> bucket 0, then ``(0, 0.1%]`` -> 1, ... (NaN -> -1)."""
    index = np.searchsorted(np.asarray(LOSS_EDGES, dtype=np.float64), loss_rate, side="left").astype(np.int64)
    index[loss_rate <= 0.0] = 0
    index[np.isnan(loss_rate)] = -1
    return index


# ---- object sizes ----------------------------------------------------------------------------


def size_bucket(size_bytes: int) -> int:
    """Octave of an object size: ``k`` with ``2**k <= size < 2**(k+1)``; sizes < 1 -> -1."""
    if size_bytes < 1:
        return -1
    return int(size_bytes).bit_length() - 1


def size_bucket_bounds(bucket: int) -> tuple[int, int | None]:
    """``[lower, upper)`` bytes of a size octave (bucket -1 is ``[0, 1)``)."""
    if bucket < 0:
        return 0, 1
    return 2**bucket, 2 ** (bucket + 1)


def _format_bytes(value: int) -> str:
    for unit, factor in (("MiB", 2**20), ("KiB", 2**10)):
        if value >= factor:
            return f"{value / factor:g} {unit}"
    return f"{value} B"


def size_bucket_label(bucket: int) -> str:
    lower, upper = size_bucket_bounds(bucket)
    return f"{_format_bytes(lower)}-{_format_bytes(upper or 0)}"


def size_buckets_overlapping(size_min: int | None, size_max: int | None) -> tuple[int, int]:
    """Range ``[first, last]`` of size octaves that overlap ``[size_min, size_max]``."""
    first = size_bucket(size_min) if size_min is not None and size_min > 0 else -1
    last = size_bucket(size_max) if size_max is not None else 62
    return first, last


# ---- latency histogram -----------------------------------------------------------------------

_LOG_RATIO = math.log(HIST_RATIO)


def hist_bin(latency_us: float) -> int:
    """Histogram bin of a latency in microseconds (same formula as :func:`hist_bin_sql`)."""
    if latency_us <= HIST_MIN_US:
        return 0
    return min(HIST_BINS - 1, int(math.floor(math.log(latency_us / HIST_MIN_US) / _LOG_RATIO)))


def hist_bin_sql(column: str) -> str:
    """SQL expression computing :func:`hist_bin` of ``column`` (in microseconds)."""
    return (
        f"LEAST({HIST_BINS - 1}, GREATEST(0, FLOOR(LN(GREATEST({column}::float8, {HIST_MIN_US})"
        f" / {HIST_MIN_US}) / LN({HIST_RATIO}))::int))"
    )


#: Lower edges (us) of every bin, and the geometric centres that represent each bin.
HIST_LOWER_US: npt.NDArray[np.float64] = HIST_MIN_US * HIST_RATIO ** np.arange(HIST_BINS, dtype=np.float64)
HIST_CENTER_US: npt.NDArray[np.float64] = HIST_LOWER_US * math.sqrt(HIST_RATIO)
HIST_UPPER_US: npt.NDArray[np.float64] = HIST_LOWER_US * HIST_RATIO

"""The analysis functions' result types (the public surface, JSON-serialisable with
``dataclasses.asdict``).  Units: see :mod:`queries`."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ArmStats:
    """One arm's trials: count, mean and standard deviation (exact), median and quartiles (from
    the histogram, +-1 %).  Latencies are skewed: draw median and quartiles, never mean +- std
    (which reaches below zero)."""

    iw: int
    n: int
    mean_ms: float | None
    median_ms: float | None
    std_ms: float | None
    p25_ms: float | None = None
    p75_ms: float | None = None


@dataclass(frozen=True)
class BucketComparison:
    """Treatment vs baseline in one bucket.

    ``baseline`` / ``treatment`` describe every trial of each arm.  The improvement (``abs_ms``,
    ``pct`` and their 95 % intervals) is the paired one (analysis/paired.py): within-path,
    within-size differences over ``n_pairs`` pairs on ``n_paths`` paths; ``method`` says how
    the interval was made (``cluster``: resampling paths; ``within-path``: resampling each
    cell's trials, about the measured paths only).  ``too_small``: fewer pairs than
    ``paired.MIN_PAIRS``: the improvement fields are ``None`` ("n too small"); ``note`` says
    what an interval does not cover, or why there is no number.
    """

    dimension: str
    bucket: str
    order: int
    lower: float | None
    upper: float | None
    baseline: ArmStats
    treatment: ArmStats
    abs_ms: float | None
    abs_ci_low: float | None
    abs_ci_high: float | None
    pct: float | None
    pct_ci_low: float | None
    pct_ci_high: float | None
    n_pairs: int = 0
    n_paths: int = 0
    method: str | None = None
    too_small: bool = True
    note: str | None = None


@dataclass(frozen=True)
class ArmPercentiles:
    iw: int
    n: int
    avg: float | None
    p50: float | None
    p75: float | None
    p90: float | None
    p99: float | None
    retrans_share: float | None
    retrans_bytes_share: float | None


@dataclass(frozen=True)
class PercentileTable:
    """The IETF slides' table for one group.  ``improvement["avg"]`` is the paired estimate (as in
    :class:`BucketComparison`); the percentile improvements are differences of the arms'
    percentiles.  ``*_ci`` hold ``[low, high]`` 95 % bounds per key (paths resampled, or each
    arm's trials with fewer than 5 paths).  ``too_small``: fewer than ``paired.MIN_PAIRS``
    pairs: the improvement rows are ``None`` ("n too small")."""

    group: str
    arms: list[ArmPercentiles]
    improvement: dict[str, float | None]
    pct_improvement: dict[str, float | None]
    retrans_increase_pp: float | None
    improvement_ci: dict[str, list[float | None]] = field(default_factory=dict)
    pct_improvement_ci: dict[str, list[float | None]] = field(default_factory=dict)
    n_pairs: int = 0
    n_paths: int = 0
    too_small: bool = True
    note: str | None = None


@dataclass(frozen=True)
class Headline:
    n_trials: int
    n_probes: int
    n_regions: int
    baseline_iw: int
    treatment_iw: int
    abs_ms: float | None
    pct: float | None
    pct_ci_low: float | None
    pct_ci_high: float | None
    retrans_increase_pp: float | None
    abs_ci_low: float | None = None
    abs_ci_high: float | None = None
    n_pairs: int = 0
    n_paths: int = 0
    too_small: bool = True
    note: str | None = None


@dataclass(frozen=True)
class RegionSummary:
    region: str
    n: int
    abs_ms: float | None
    pct: float | None
    baseline_mean_ms: float | None
    treatment_mean_ms: float | None
    abs_ci_low: float | None = None
    abs_ci_high: float | None = None
    pct_ci_low: float | None = None
    pct_ci_high: float | None = None
    n_baseline: int = 0
    n_treatment: int = 0
    n_pairs: int = 0
    n_paths: int = 0
    too_small: bool = True
    note: str | None = None


@dataclass(frozen=True)
class LossBucket:
    bucket: str
    order: int
    comparison: BucketComparison
    retrans_share_baseline: float | None
    retrans_share_treatment: float | None
    retrans_increase_pp: float | None


@dataclass(frozen=True)
class ProbeRow:
    probe_id: str
    name: str
    region: str
    country: str | None
    version: str
    last_seen_at: dt.datetime | None
    trials_total: int
    trials_per_day: float
    error_share: float | None
    spool_backlog: int | None


@dataclass(frozen=True)
class FilterOptions:
    campaigns: list[tuple[int, str]]
    regions: list[str]
    arms: list[int]
    size_min: int | None
    size_max: int | None


@dataclass(frozen=True)
class FairnessPoint:
    """One flow role x IW of one offered-load / fairness campaign (a phase of the experiment).

    ``flow`` is ``short`` (the Poisson-arriving trials), ``background`` (the long-lived flow
    running alongside them) or ``background-alone`` (the same flow just before each round:
    the uncontended baseline).  Times are of successful flows; throughput is the mean over
    flows of ``bytes * 8 / total time``; ``retrans_flow_share`` is the share of joined flows
    the origin retransmitted anything in (``retrans_flows`` of ``joined_flows``, with a Wilson
    95 % interval), ``bytes_retrans_share`` the origin's retransmitted bytes over bytes sent;
    ``fct_p50_ci_ms`` the order-statistic 95 % interval of the median completion time
    (``None`` below 6 flows).  ``offered_load`` is ``arrival rate x mean short-flow bytes x 8 /
    bottleneck`` (the bottleneck from the campaign's path estimates), ``None`` when unknown.
    """

    campaign_id: int
    campaign_name: str
    #: The campaign's short-flow arms, e.g. ``"3"``, ``"10"``, ``"3+10"`` (the phase's IW mix).
    mix: str
    arrival_rate_per_s: float | None
    offered_load: float | None
    flow: str
    iw: int
    n: int
    errors: int
    mean_bytes: float | None
    throughput_bps: float | None
    fct_mean_ms: float | None
    fct_p50_ms: float | None
    fct_p90_ms: float | None
    retrans_flow_share: float | None
    bytes_retrans_share: float | None
    fct_p50_ci_ms: tuple[float, float] | None = None
    retrans_flows: int = 0
    joined_flows: int = 0
    retrans_flow_share_ci: tuple[float, float] | None = None

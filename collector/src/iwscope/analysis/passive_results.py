"""Result types of the passive, real-user analysis (:mod:`iwscope.analysis.passive`).

Units: latencies and their improvements in **ms**, ``*_pct`` in **percent** (12.0 = 12 %),
rates and shares as **fractions** 0..1, their differences (``*_pp``) in **percentage points**.
Every number is a :class:`~iwscope.analysis.passive_stats.Value`: ``value`` with its 95 %
interval ``low``/``high``; ``value`` ``None`` means "n too small" (or undefined), and the n
beside it says why.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from iwscope.analysis.passive_stats import Value


@dataclass(frozen=True)
class PassiveMethod:
    """How the numbers were computed (the dashboard's footnote reads it)."""

    replicates: int
    seed: int
    clusters: int
    min_responses: int
    min_connections: int
    min_clusters: int
    #: A percentile is within +- this many percent of the exact value (bin centre).
    hist_resolution_pct: float
    #: Whether rows flagged ``biased`` are in the latency and retransmission numbers.
    include_biased: bool


@dataclass(frozen=True)
class PassiveArmPercentiles:
    """One arm's row of the seed's percentile table (and, for a treated arm, its Impr. rows)."""

    arm: str
    #: The IW the arm gave (``default``: the server's own, when its routes said).
    iw: int | None
    baseline: bool
    connections: int
    #: Connections whose first-response latency was measured (the latency numbers' n).
    responses: int
    #: Clusters with a measured response (the unit the intervals resample).
    clusters: int
    too_small: bool
    #: ``avg``, ``p50``, ``p75``, ``p90``, ``p99`` (ms).
    latency_ms: dict[str, Value]
    #: Baseline minus this arm (ms; positive: this arm is faster) and its percent of the
    #: baseline, per column; ``None`` for the baseline itself.
    improvement_ms: dict[str, Value] | None = None
    improvement_pct: dict[str, Value] | None = None


@dataclass(frozen=True)
class PassivePercentileTable:
    """The seed's table for one group (``all`` or a region)."""

    group: str
    baseline_arm: str | None
    arms: list[PassiveArmPercentiles] = field(default_factory=list)


@dataclass(frozen=True)
class PassiveArmRetrans:
    """Retransmissions of one arm (seed 003: "Retrans. %" and "Increase")."""

    arm: str
    iw: int | None
    baseline: bool
    connections: int
    clusters: int
    data_segs_out: int
    total_retrans: int
    retrans_connections: int
    too_small: bool
    #: Retransmitted over sent data segments (fraction).
    retrans_rate: Value
    #: Share of connections with any retransmission (fraction).
    retrans_conn_share: Value
    #: This arm minus the baseline, percentage points; ``None`` for the baseline.
    rate_increase_pp: Value | None = None
    conn_share_increase_pp: Value | None = None


@dataclass(frozen=True)
class PassiveArmBias:
    """Shares of one arm's connections carrying what biases a passive comparison (every
    connection counts here, whatever ``include_biased`` says)."""

    arm: str
    iw: int | None
    connections: int
    clusters: int
    too_small: bool
    #: Connections in rows flagged biased (SYN/SYN-ACK retransmitted or receive-window limited).
    biased_connections: int
    biased_share: Value
    #: SYN or SYN-ACK retransmitted: the connection starts from a window of 1 (RFC 6298), not the arm's.
    syn_retrans: int
    syn_retrans_share: Value
    #: First flight limited by the client's receive window: the IW could not be used.
    rwnd_limited: int
    rwnd_limited_share: Value
    #: Keep-alive connection reused after idle (the window may have been reset or kept).
    reused_after_idle: int
    reused_after_idle_share: Value
    #: Connections that spoke TLS.
    tls: int
    tls_share: Value


@dataclass(frozen=True)
class PassiveSummary:
    """``/analysis/passive/summary``: the percentile table, retransmissions and biased shares."""

    campaign_id: int | None
    campaign_name: str | None
    baseline_arm: str | None
    first_hour: dt.datetime | None
    last_hour: dt.datetime | None
    method: PassiveMethod
    overall: PassivePercentileTable
    retransmissions: list[PassiveArmRetrans] = field(default_factory=list)
    biased: list[PassiveArmBias] = field(default_factory=list)


@dataclass(frozen=True)
class PassiveArmCentre:
    """One arm in one group (a Figure 5 bucket, a day): mean and median with n, and for a
    treated arm the improvement of each over the baseline (ms and percent)."""

    arm: str
    iw: int | None
    baseline: bool
    connections: int
    responses: int
    clusters: int
    too_small: bool
    mean_ms: Value
    median_ms: Value
    mean_improvement_ms: Value | None = None
    mean_improvement_pct: Value | None = None
    median_improvement_ms: Value | None = None
    median_improvement_pct: Value | None = None


@dataclass(frozen=True)
class PassiveGroupRow:
    """A bucket (``lower``/``upper``: ms, bit/s or bytes; ``None`` open) or a UTC day."""

    group: str
    order: int
    lower: float | None
    upper: float | None
    arms: list[PassiveArmCentre] = field(default_factory=list)


@dataclass(frozen=True)
class PassiveBuckets:
    """``/analysis/passive/buckets``: the Figure 5 panel of one dimension (the connection's own
    min RTT, delivery rate or BDP)."""

    dimension: str
    baseline_arm: str | None
    rows: list[PassiveGroupRow] = field(default_factory=list)
    #: Connections whose bucket the server could not tell (left out of the rows).
    unknown_connections: int = 0


@dataclass(frozen=True)
class PassiveSharePoint:
    """The reference arm (``default``) at one treated share (its phases pooled)."""

    treated_share_bp: int
    phases: list[int]
    first_hour: dt.datetime | None
    last_hour: dt.datetime | None
    connections: int
    responses: int
    clusters: int
    too_small: bool
    mean_ms: Value
    median_ms: Value
    retrans_rate: Value
    #: This share minus the smallest share (ms, percentage points); ``None`` at the smallest.
    mean_change_ms: Value | None = None
    median_change_ms: Value | None = None
    retrans_change_pp: Value | None = None


@dataclass(frozen=True)
class PassiveShareSweep:
    """``/analysis/passive/share-sweep``: what the untreated users see as the treated share grows."""

    arm: str | None
    reference_share_bp: int | None
    points: list[PassiveSharePoint] = field(default_factory=list)
    #: The IW the arm gave (``default``: the server's own, when its routes said).
    iw: int | None = None


@dataclass(frozen=True)
class PassiveArmShare:
    arm: str
    share_bp: int


@dataclass(frozen=True)
class PassiveCampaign:
    """A passive campaign and what its servers uploaded."""

    campaign_id: int
    name: str
    server_ids: list[str]
    arms: list[PassiveArmShare]
    phase: int | None
    starts_at: dt.datetime
    ends_at: dt.datetime | None
    aggregate_rows: int
    connections: int
    responses: int
    raw_records: int
    first_hour: dt.datetime | None
    last_hour: dt.datetime | None


@dataclass(frozen=True)
class PassiveLoadDay:
    """What one server's uploads of one UTC day cost the collector: aggregates vs raw records
    (bytes are PostgreSQL's row sizes, ``pg_column_size``: no page or index overhead)."""

    server_id: str
    server_name: str | None
    day: dt.date
    aggregate_rows: int
    aggregate_bytes: int
    #: Connections the aggregates stand for.
    connections: int
    raw_rows: int
    raw_bytes: int
    aggregate_bytes_per_connection: float | None
    raw_bytes_per_record: float | None
    #: Raw records per connection (the sampled share).
    raw_share: float | None


@dataclass(frozen=True)
class PassiveOptions:
    """What a passive campaign's data offers to filter by (the dashboard's filter bar)."""

    campaign_id: int | None
    regions: list[str] = field(default_factory=list)
    phases: list[int] = field(default_factory=list)
    treated_shares_bp: list[int] = field(default_factory=list)
    first_hour: dt.datetime | None = None
    last_hour: dt.datetime | None = None
